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
