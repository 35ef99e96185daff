//! Memory pressure notifications on cgroup v2 (`watch_memory_pressure`: a PSI trigger on
//! `memory.pressure` and inotify on `memory.events.local`) from a real memory hog. They need a
//! pure cgroup v2 machine with the memory controller: `scripts/cgroup2-vm` boots one
//! (scripts/test's cgroup v2 stage runs this file there); elsewhere they are skipped, and
//! the v1 refusal is checked instead.

mod common;

use std::time::{Duration, Instant};

use common::{root_or_skip, spawn_in, within, TestTree};
use ironlet_cgroups::{CgroupSettings, Hierarchy, PressureSource, PsiTrigger, QosClass};

/// The hierarchy when it is cgroup v2 with the memory controller (and we are root).
fn pure_v2_or_skip(test: &str) -> Option<Hierarchy> {
    if !root_or_skip(test) {
        return None;
    }
    let hierarchy = Hierarchy::detect().ok()?;
    let memory = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
    if hierarchy.is_v2() && memory {
        Some(hierarchy)
    } else {
        eprintln!("skipping {test}: not cgroup v2 with the memory controller (scripts/cgroup2-vm runs it)");
        None
    }
}

/// The `high` counter of a group's `memory.events`.
fn high_events(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join("memory.events"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("high "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_hog_above_memory_high_is_notified_within_a_second_by_events_and_by_psi(
) -> anyhow::Result<()> {
    let test = "a_hog_above_memory_high_is_notified_within_a_second_by_events_and_by_psi";
    let Some(_) = pure_v2_or_skip(test) else {
        return Ok(());
    };
    let tree = TestTree::detect()?;
    let h = tree.hierarchy().clone();
    let pod = tree.node.pod_path(QosClass::Burstable, "pressure")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let container = tree.node.container_path(&pod, "hog")?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    let dir = h
        .controller_dir("memory", &pod)
        .ok_or_else(|| anyhow::anyhow!("no memory directory for {pod}"))?;
    std::fs::write(dir.join("memory.high"), (32u64 << 20).to_string())?;

    let mut watcher = h.watch_memory_pressure(&pod, PsiTrigger::default())?;
    let quiet = tokio::time::timeout(Duration::from_millis(500), watcher.next()).await;
    assert!(quiet.is_err(), "notified without pressure: {quiet:?}");

    // The instant the group first went above memory.high, seen by polling its counter.
    let poll_dir = dir.clone();
    let crossed = tokio::spawn(async move {
        loop {
            if high_events(&poll_dir) > 0 {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    // dd allocates a 96 MiB buffer and fills it: 3x memory.high, throttled (and stalled)
    // by the kernel above it, never killed (no memory.max).
    let mut hog = spawn_in(
        &h,
        &container,
        "dd",
        &["if=/dev/zero", "of=/dev/null", "bs=96M", "count=1"],
    )?;

    let first = within(
        10,
        "no memory pressure notification while a hog runs 3x above memory.high",
        watcher.next(),
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("the watch ended instead of notifying"))?;
    let mut stall = (first.source == PressureSource::Stall).then_some(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    while stall.is_none() && Instant::now() < deadline {
        if let Ok(Ok(Some(event))) = tokio::time::timeout(
            deadline.saturating_duration_since(Instant::now()),
            watcher.next(),
        )
        .await
        {
            if event.source == PressureSource::Stall {
                stall = Some(event);
            }
        }
    }
    let crossed = within(5, "memory.events never counted `high`", crossed).await?;
    let _ = hog.kill();
    let _ = tokio::task::spawn_blocking(move || hog.wait()).await?;

    let first_delay = first.observed_at.saturating_duration_since(crossed);
    assert!(
        first_delay <= Duration::from_secs(1),
        "first notification ({:?}) {first_delay:?} after crossing memory.high",
        first.source
    );
    let stall = stall.ok_or_else(|| {
        anyhow::anyhow!(
            "the PSI trigger (100 ms of stall in 1 s) never fired while the hog was throttled"
        )
    })?;
    let stall_delay = stall.observed_at.saturating_duration_since(crossed);
    // A PSI trigger fires once the stall reaches 100 ms within its 1 s window.
    assert!(
        stall_delay <= Duration::from_millis(1500),
        "PSI trigger fired {stall_delay:?} after crossing memory.high"
    );
    eprintln!(
        "{test}: first ({:?}) after {first_delay:?}, PSI after {stall_delay:?}",
        first.source
    );
    Ok(())
}

#[tokio::test]
async fn the_root_group_and_a_removed_group_are_handled() -> anyhow::Result<()> {
    let test = "the_root_group_and_a_removed_group_are_handled";
    let Some(h) = pure_v2_or_skip(test) else {
        return Ok(());
    };
    // The root group has no memory.events.local: PSI alone (its memory.pressure or /proc's).
    let root =
        h.watch_memory_pressure(&ironlet_cgroups::CgroupPath::root(), PsiTrigger::default())?;
    assert!(format!("{root:?}").contains("events: false"), "{root:?}");

    let tree = TestTree::new(h.clone())?;
    let pod = tree.node.pod_path(QosClass::BestEffort, "gone")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let mut watcher = h.watch_memory_pressure(&pod, PsiTrigger::default())?;
    let node = tree.node.clone();
    let removed = pod.clone();
    tokio::task::spawn_blocking(move || node.remove(&removed)).await??;
    let end = within(
        5,
        "the pressure watch did not notice the removal",
        watcher.next(),
    )
    .await?;
    assert!(end.is_none(), "{end:?}");
    let again = within(1, "an ended watch must answer at once", watcher.next()).await?;
    assert!(again.is_none(), "{again:?}");
    Ok(())
}

#[tokio::test]
async fn cgroup_v1_refuses_with_a_typed_error() -> anyhow::Result<()> {
    if !root_or_skip("cgroup_v1_refuses_with_a_typed_error") {
        return Ok(());
    }
    let h = Hierarchy::detect()?;
    if h.is_v2() {
        eprintln!("skipping cgroup_v1_refuses_with_a_typed_error: this machine is cgroup v2");
        return Ok(());
    }
    let tree = TestTree::new(h.clone())?;
    let pod = tree.node.pod_path(QosClass::BestEffort, "v1")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    match h.watch_memory_pressure(&pod, PsiTrigger::default()) {
        Err(ironlet_cgroups::Error::WatchSetup { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::Unsupported, "{source}");
        }
        other => panic!("expected WatchSetup(Unsupported) on cgroup v1, got {other:?}"),
    }
    Ok(())
}
