//! OOM and emptiness events from real processes: a memory hog in a 16 MiB pod, a sleeper that
//! gets killed, and cgroups removed under active watchers.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::{root_or_skip, spawn_in, within, TestTree};
use ironlet_cgroups::{CgroupPath, CgroupSettings, EmptyWatcher, QosClass};

/// A BestEffort pod cgroup `pod` holding a container cgroup `container`.
fn pod_with_container(
    tree: &TestTree,
    pod: &str,
    container: &str,
) -> anyhow::Result<(CgroupPath, CgroupPath)> {
    let pod = tree.node.pod_path(QosClass::BestEffort, pod)?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let container = tree.node.container_path(&pod, container)?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    Ok((pod, container))
}

/// Waits (5 s at most) for `empty` to report its cgroup empty, `after` what.
async fn reported_empty(empty: &mut EmptyWatcher, after: &str) -> anyhow::Result<()> {
    let what = format!("watch_empty never saw the cgroup empty after {after}");
    let event = within(5, &what, empty.next()).await?;
    assert!(
        event.is_some(),
        "watch ended instead of reporting emptiness"
    );
    Ok(())
}

#[tokio::test]
async fn a_memory_hog_in_a_16mib_pod_fires_watch_oom_and_is_counted() -> anyhow::Result<()> {
    if !root_or_skip("a_memory_hog_in_a_16mib_pod_fires_watch_oom_and_is_counted") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let h = tree.hierarchy();
    let pod = tree.node.pod_path(QosClass::Burstable, "oom")?;
    let limit = CgroupSettings {
        memory_limit: Some(16 << 20),
        ..CgroupSettings::default()
    };
    tree.node.create_pod(&pod, &limit)?;
    let container = tree.node.container_path(&pod, "hog")?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    let mut pod_ooms = h.watch_oom(&pod)?;
    let mut container_ooms = h.watch_oom(&container)?;

    // dd allocates a 64 MiB buffer and fills it from /dev/zero: 4x the pod's limit.
    let mut hog = spawn_in(
        h,
        &container,
        "dd",
        &["if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
    )?;

    let event = within(
        20,
        "watch_oom(container) never fired: eventfd/inotify not signalled or oom_kill not increasing",
        container_ooms.next(),
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("container OOM watch ended instead of reporting the kill"))?;
    assert!(event.new_kills >= 1 && event.total_kills >= 1, "{event:?}");
    let event = within(
        20,
        "watch_oom(pod) never fired for a kill in its container",
        pod_ooms.next(),
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("pod OOM watch ended instead of reporting the kill"))?;
    assert!(event.new_kills >= 1, "{event:?}");

    let status = tokio::task::spawn_blocking(move || hog.wait()).await??;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(h.oom_kill_count(&container)? >= 1);
    assert!(h.oom_kill_count(&pod)? >= 1);
    Ok(())
}

/// A kill under a container's own limit, in a pod without one: on v1 the kernel does not
/// signal the pod's eventfd for it. The pod's watcher, started before the container cgroup
/// existed and told of it with `rescan`, reports it at once all the same (well within the
/// 5 min safety re-check).
#[tokio::test]
async fn watch_oom_of_a_pod_reports_a_kill_under_a_container_created_after_the_watch_began(
) -> anyhow::Result<()> {
    if !root_or_skip(
        "watch_oom_of_a_pod_reports_a_kill_under_a_container_created_after_the_watch_began",
    ) {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let h = tree.hierarchy();
    let pod = tree.node.pod_path(QosClass::BestEffort, "container-oom")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let mut pod_ooms = h.watch_oom(&pod)?;
    let container = tree.node.container_path(&pod, "hog")?;
    tree.node.create_container(
        &container,
        &CgroupSettings {
            memory_limit: Some(16 << 20),
            ..CgroupSettings::default()
        },
    )?;
    pod_ooms.rescan()?;
    let mut hog = spawn_in(
        h,
        &container,
        "dd",
        &["if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
    )?;
    // 5 s: less than the 10 s re-check that used to be the only way to see it.
    let event = within(
        5,
        "watch_oom(pod) never reported the kill under the container's own limit",
        pod_ooms.next(),
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("pod OOM watch ended instead of reporting the kill"))?;
    assert!(event.new_kills >= 1, "{event:?}");
    let status = tokio::task::spawn_blocking(move || hog.wait()).await??;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    Ok(())
}

#[tokio::test]
async fn watch_empty_fires_when_the_last_process_is_killed() -> anyhow::Result<()> {
    if !root_or_skip("watch_empty_fires_when_the_last_process_is_killed") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let h = tree.hierarchy();
    let (pod, container) = pod_with_container(&tree, "empty", "sleeper")?;
    let mut sleeper = spawn_in(h, &container, "sleep", &["100"])?;
    let mut empty = h.watch_empty(&pod)?;

    // Populated: no event yet.
    let early = tokio::time::timeout(Duration::from_millis(400), empty.next()).await;
    assert!(
        early.is_err(),
        "reported empty while a process runs: {early:?}"
    );

    // Killed but not yet reaped (a zombie): the cgroup must already count as empty.
    sleeper.kill()?;
    reported_empty(&mut empty, "SIGKILL").await?;
    sleeper.wait()?;
    Ok(())
}

#[tokio::test]
async fn short_lived_children_of_a_long_lived_process_do_not_wake_watch_empty() -> anyhow::Result<()>
{
    if !root_or_skip("short_lived_children_of_a_long_lived_process_do_not_wake_watch_empty") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let h = tree.hierarchy();
    let (pod, container) = pod_with_container(&tree, "chatty", "loop")?;
    // A shell that runs a new process every 20 ms, as a logging loop's `sleep` does (killed
    // on the way out whatever happens: it would loop forever).
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut shell = KillOnDrop(spawn_in(
        h,
        &container,
        "sh",
        &["-c", "while :; do sleep 0.02; done"],
    )?);
    let mut empty = h.watch_empty(&pod)?;
    let early = tokio::time::timeout(Duration::from_millis(1500), empty.next()).await;
    assert!(
        early.is_err(),
        "reported empty while the shell runs: {early:?}"
    );
    // One scan to choose the shell, one to confirm it; a watch of every member rescanned at
    // each child's exit (19 times in one run here).
    let scans = empty.scans();
    assert!(scans <= 4, "{scans} scans in 1.5 s of a populated cgroup");

    // The shell killed: its last child exits within 20 ms, then the cgroup is empty.
    shell.0.kill()?;
    reported_empty(&mut empty, "the shell and its child").await?;
    Ok(())
}

#[tokio::test]
async fn watch_empty_waits_for_the_members_left_when_the_oldest_exits() -> anyhow::Result<()> {
    if !root_or_skip("watch_empty_waits_for_the_members_left_when_the_oldest_exits") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let h = tree.hierarchy();
    let (pod, container) = pod_with_container(&tree, "two", "pair")?;
    let mut first = spawn_in(h, &container, "sleep", &["100"])?;
    std::thread::sleep(Duration::from_millis(20));
    let mut second = spawn_in(h, &container, "sleep", &["100"])?;
    let mut empty = h.watch_empty(&pod)?;
    let early = tokio::time::timeout(Duration::from_millis(400), empty.next()).await;
    assert!(early.is_err(), "reported empty with two members: {early:?}");

    // The watched (oldest) member exits: one is left, no event.
    first.kill()?;
    first.wait()?;
    let one_left = tokio::time::timeout(Duration::from_millis(600), empty.next()).await;
    assert!(
        one_left.is_err(),
        "reported empty while a member runs: {one_left:?}"
    );

    second.kill()?;
    reported_empty(&mut empty, "its last member was killed").await?;
    second.wait()?;
    Ok(())
}

#[tokio::test]
async fn watch_empty_reports_an_already_empty_cgroup_at_once() -> anyhow::Result<()> {
    if !root_or_skip("watch_empty_reports_an_already_empty_cgroup_at_once") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let pod = tree.node.pod_path(QosClass::BestEffort, "idle")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let mut empty = tree.hierarchy().watch_empty(&pod)?;
    let event = within(
        2,
        "watch_empty on an empty cgroup did not report at once",
        empty.next(),
    )
    .await?;
    assert!(event.is_some());
    Ok(())
}

#[tokio::test]
async fn watchers_end_when_their_cgroup_is_removed() -> anyhow::Result<()> {
    if !root_or_skip("watchers_end_when_their_cgroup_is_removed") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let h = tree.hierarchy().clone();
    let pod = tree.node.pod_path(QosClass::Burstable, "gone")?;
    let limit = CgroupSettings {
        memory_limit: Some(64 << 20),
        ..CgroupSettings::default()
    };
    tree.node.create_pod(&pod, &limit)?;
    let mut ooms = h.watch_oom(&pod)?;
    let mut empty = h.watch_empty(&pod)?;
    within(2, "initial emptiness event", empty.next()).await?;

    let node = tree.node.clone();
    let removed = pod.clone();
    tokio::task::spawn_blocking(move || node.remove(&removed)).await??;

    let oom_end = within(
        5,
        "OOM watch did not notice the cgroup was removed",
        ooms.next(),
    )
    .await?;
    assert!(oom_end.is_none(), "{oom_end:?}");
    let empty_end = within(
        5,
        "empty watch did not notice the cgroup was removed",
        empty.next(),
    )
    .await?;
    assert!(empty_end.is_none(), "{empty_end:?}");
    // Ended streams stay ended.
    assert!(ooms.next().await?.is_none());
    assert!(empty.next().await?.is_none());
    Ok(())
}
