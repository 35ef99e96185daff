//! Usage readouts from a real process placed in a cgroup.

mod common;

use common::{root_or_skip, spawn_in, TestTree};
use ironlet_cgroups::{CgroupSettings, QosClass};

#[test]
fn usage_counts_a_sleeping_process_and_its_memory() -> anyhow::Result<()> {
    if !root_or_skip("usage_counts_a_sleeping_process_and_its_memory") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let pod = tree.node.pod_path(QosClass::BestEffort, "usage")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let container = tree.node.container_path(&pod, "sleeper")?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    let mut sleeper = spawn_in(tree.hierarchy(), &container, "sleep", &["100"])?;
    std::thread::sleep(std::time::Duration::from_millis(200));

    // Read at the pod: the readout is hierarchical.
    let usage = tree.hierarchy().usage(&pod)?;
    sleeper.kill()?;
    sleeper.wait()?;

    assert_eq!(usage.pids_current, 1, "{usage:?}");
    assert!(usage.memory_usage_bytes > 0, "{usage:?}");
    assert!(
        usage.memory_working_set_bytes <= usage.memory_usage_bytes,
        "{usage:?}"
    );
    assert!(usage.cpu_usage_nanos > 0, "{usage:?}");
    assert_eq!(tree.hierarchy().oom_kill_count(&pod)?, 0);
    Ok(())
}

#[test]
fn usage_sees_anonymous_memory_page_faults_and_busy_cpu() -> anyhow::Result<()> {
    if !root_or_skip("usage_sees_anonymous_memory_page_faults_and_busy_cpu") {
        return Ok(());
    }
    const MIB: u64 = 1 << 20;
    let tree = TestTree::detect()?;
    let pod = tree.node.pod_path(QosClass::BestEffort, "memhog")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let container = tree.node.container_path(&pod, "hog")?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    // `tail` keeps the one 32 MiB "line" in anonymous memory while it waits for the rest of its
    // input (the sleep holds the pipe open); the loop burns CPU until the kill (a bounded one
    // could end before the memory is in, and the CPU counter would then stand still).
    let script = "{ head -c 33554432 /dev/zero; sleep 100; } | tail & while :; do :; done";
    let mut hog = spawn_in(tree.hierarchy(), &container, "sh", &["-c", script])?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut usage = tree.hierarchy().usage(&container)?;
    while usage.memory_rss_bytes < 32 * MIB && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        usage = tree.hierarchy().usage(&container)?;
    }
    let later = {
        std::thread::sleep(std::time::Duration::from_millis(300));
        tree.hierarchy().usage(&pod)?
    };
    hog.kill()?;
    hog.wait()?;
    // head and tail are killed with the tree (TestTree's drop removes it, killing leftovers).

    assert!(usage.memory_rss_bytes >= 32 * MIB, "{usage:?}");
    assert!(usage.memory_working_set_bytes >= 32 * MIB, "{usage:?}");
    assert!(usage.page_faults >= 32 * MIB / 4096 / 2, "{usage:?}");
    assert!(usage.pids_current >= 2, "{usage:?}");
    // The pod's readout includes the container's, and the CPU counter moved on.
    assert!(
        later.cpu_usage_nanos > usage.cpu_usage_nanos,
        "{usage:?} {later:?}"
    );
    assert!(
        later.memory_rss_bytes >= usage.memory_rss_bytes / 2,
        "{later:?}"
    );
    Ok(())
}
