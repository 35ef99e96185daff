//! The cgroup v2 code paths (subtree delegation, `cgroup.events` inotify, `cgroup.kill`), run
//! against the empty cgroup2 mount of a hybrid machine (`/sys/fs/cgroup/unified`). It has no
//! resource controllers, so limits, usage and OOM events are not covered here; on a pure v2
//! machine the other test files exercise them. Skipped when there is no such mount.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::{root_or_skip, spawn_in, unified_mount_of_hybrid, within, TestTree};
use ironlet_cgroups::{CgroupSettings, Hierarchy, QosClass};

fn unified_or_skip(test: &str) -> Option<Hierarchy> {
    if !root_or_skip(test) {
        return None;
    }
    match unified_mount_of_hybrid() {
        Some(root) => Some(Hierarchy::V2 { root }),
        None => {
            eprintln!("skipping {test}: no separate cgroup2 mount (not a hybrid machine)");
            None
        }
    }
}

#[tokio::test]
async fn v2_tree_populated_events_and_cgroup_kill_work_on_the_unified_mount() -> anyhow::Result<()>
{
    let test = "v2_tree_populated_events_and_cgroup_kill_work_on_the_unified_mount";
    let Some(hierarchy) = unified_or_skip(test) else {
        return Ok(());
    };
    let tree = TestTree::new(hierarchy)?;
    let h = tree.hierarchy().clone();
    let pod = tree.node.pod_path(QosClass::Burstable, "v2")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let container = tree.node.container_path(&pod, "c")?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    assert!(h.dirs(&container).iter().all(|d| d.is_dir()));

    let mut sleeper = spawn_in(&h, &container, "sh", &["-c", "sleep 100 & sleep 100"])?;
    let mut empty = h.watch_empty(&pod)?;
    let early = tokio::time::timeout(Duration::from_millis(400), empty.next()).await;
    assert!(
        early.is_err(),
        "reported empty while processes run: {early:?}"
    );

    // remove() uses cgroup.kill here; the inotify watch sees populated 0, then the removal.
    let node = tree.node.clone();
    let removed = pod.clone();
    let removal = tokio::task::spawn_blocking(move || node.remove(&removed));
    let event = within(
        5,
        "cgroup.events inotify never reported populated 0",
        empty.next(),
    )
    .await?;
    assert!(event.is_some(), "watch ended before reporting emptiness");
    removal.await??;
    let end = within(5, "v2 empty watch did not end after rmdir", empty.next()).await?;
    assert!(end.is_none(), "{end:?}");

    let status = sleeper.wait()?;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(!h.exists(&pod));
    Ok(())
}

#[tokio::test]
async fn v2_empty_watch_fires_on_exit_without_polling() -> anyhow::Result<()> {
    let test = "v2_empty_watch_fires_on_exit_without_polling";
    let Some(hierarchy) = unified_or_skip(test) else {
        return Ok(());
    };
    let tree = TestTree::new(hierarchy)?;
    let h = tree.hierarchy();
    let pod = tree.node.pod_path(QosClass::BestEffort, "exit")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let container = tree.node.container_path(&pod, "c")?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    let mut short = spawn_in(h, &container, "sleep", &["0.3"])?;
    let mut empty = h.watch_empty(&pod)?;
    // Well under the 5 min safety re-check: only the inotify event can deliver it this fast.
    let event = within(
        2,
        "cgroup.events modification was not delivered by inotify",
        empty.next(),
    )
    .await?;
    assert!(event.is_some());
    short.wait()?;
    Ok(())
}

/// More pods than `fs.inotify.max_user_instances` (128 by default, shared with every other
/// process of the user) each get their emptiness watcher, and every one of them reports its
/// pod's last exit and then its removal, through inotify (well before the 5 min re-check).
/// With an inotify instance per watcher, creating them failed from the limit on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_empty_watchers_of_more_pods_than_max_user_instances_all_fire_and_end(
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    const PODS: usize = 200;
    let test = "v2_empty_watchers_of_more_pods_than_max_user_instances_all_fire_and_end";
    let Some(hierarchy) = unified_or_skip(test) else {
        return Ok(());
    };
    let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")?;
    if limit.trim().parse::<usize>()? >= PODS {
        eprintln!(
            "{test}: max_user_instances {} is not below {PODS}",
            limit.trim()
        );
    }
    let tree = TestTree::new(hierarchy)?;
    let h = tree.hierarchy().clone();
    let mut pods = Vec::new();
    let mut sleepers = Vec::new();
    for n in 0..PODS {
        let pod = tree
            .node
            .pod_path(QosClass::BestEffort, &format!("many{n}"))?;
        tree.node.create_pod(&pod, &CgroupSettings::default())?;
        let container = tree.node.container_path(&pod, "c")?;
        tree.node
            .create_container(&container, &CgroupSettings::default())?;
        sleepers.push(spawn_in(&h, &container, "sleep", &["1000"])?);
        pods.push(pod);
    }
    let mut watchers = Vec::new();
    for (n, pod) in pods.iter().enumerate() {
        let watcher = h
            .watch_empty(pod)
            .with_context(|| format!("emptiness watcher {} of {PODS}", n + 1))?;
        watchers.push(watcher);
    }
    let held = common::inotify_descriptors_of_this_process()?;
    assert!(held < 10, "{held} inotify descriptors for {PODS} watchers");

    let waiting: Vec<_> = watchers
        .into_iter()
        .map(|mut watcher| {
            tokio::spawn(async move {
                let first = watcher.next().await;
                (watcher, first)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiting.iter().all(|task| !task.is_finished()),
        "a watcher reported emptiness while its pod runs"
    );
    for sleeper in &mut sleepers {
        sleeper.kill()?;
    }
    for sleeper in &mut sleepers {
        sleeper.wait()?;
    }
    let mut watchers = Vec::new();
    for (n, task) in waiting.into_iter().enumerate() {
        let (watcher, first) = within(10, "a pod's last exit was not reported", task).await?;
        assert!(
            first?.is_some(),
            "watcher {n} ended instead of reporting the exit"
        );
        watchers.push(watcher);
    }

    let node = tree.node.clone();
    let removed = pods.clone();
    tokio::task::spawn_blocking(move || removed.iter().try_for_each(|pod| node.remove(pod)))
        .await??;
    for (n, watcher) in watchers.iter_mut().enumerate() {
        let end = within(5, "a watcher did not end with its cgroup", watcher.next()).await?;
        assert!(end.is_none(), "watcher {n}: {end:?}");
    }
    Ok(())
}
