//! The node tree on this machine's real hierarchy: creation in every controller, settings
//! written to the kernel's files, update, and removal that kills leftovers.

mod common;

use std::os::unix::process::ExitStatusExt;

use common::{read_file, root_or_skip, spawn_in, TestTree};
use ironlet_cgroups::{
    CgroupOptions, CgroupSettings, Delegation, Hierarchy, PodResources, QosClass,
    ResourceRequirements,
};

const MI: u64 = 1 << 20;

fn guaranteed_16mib() -> PodResources {
    PodResources {
        containers: vec![ResourceRequirements {
            cpu_limit_milli: Some(100),
            memory_limit_bytes: Some(16 * MI),
            ..ResourceRequirements::default()
        }],
        init_containers: vec![],
    }
}

#[test]
fn ensure_creates_root_and_qos_cgroups_in_every_controller() -> anyhow::Result<()> {
    if !root_or_skip("ensure_creates_root_and_qos_cgroups_in_every_controller") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let node = &tree.node;
    let paths = [
        node.root().clone(),
        node.qos_path(QosClass::Burstable),
        node.qos_path(QosClass::BestEffort),
    ];
    for path in &paths {
        for dir in tree.hierarchy().dirs(path) {
            assert!(dir.is_dir(), "{} missing", dir.display());
        }
    }
    match tree.hierarchy() {
        Hierarchy::V1 { mounts } => {
            if mounts.contains_key("cpuset") {
                for path in &paths {
                    let cpus = read_file(tree.hierarchy(), "cpuset", path, "cpuset.cpus")?;
                    let mems = read_file(tree.hierarchy(), "cpuset", path, "cpuset.mems")?;
                    assert!(!cpus.is_empty() && !mems.is_empty(), "{path}: empty cpuset");
                }
            }
            let besteffort = node.qos_path(QosClass::BestEffort);
            assert_eq!(
                read_file(tree.hierarchy(), "cpu", &besteffort, "cpu.shares")?,
                "2"
            );
        }
        Hierarchy::V2 { .. } => {
            let besteffort = node.qos_path(QosClass::BestEffort);
            assert_eq!(
                read_file(tree.hierarchy(), "cpu", &besteffort, "cpu.weight")?,
                "1"
            );
        }
    }
    Ok(())
}

#[test]
fn pod_limits_are_written_to_the_kernel_files_and_updated() -> anyhow::Result<()> {
    if !root_or_skip("pod_limits_are_written_to_the_kernel_files_and_updated") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let pod = guaranteed_16mib();
    assert_eq!(pod.qos(), QosClass::Guaranteed);
    let path = tree.node.pod_path(pod.qos(), "limits-uid")?;
    assert_eq!(path.as_str(), format!("{}/podlimits-uid", tree.node.root()));
    let options = CgroupOptions {
        pod_pids_limit: Some(100),
        ..CgroupOptions::default()
    };
    tree.node
        .create_pod(&path, &pod.cgroup_settings(&options))?;

    let h = tree.hierarchy();
    let (memory_file, cpu_expect) = if h.is_v2() {
        (
            "memory.max",
            vec![("cpu.max", "10000 100000"), ("cpu.weight", "4")],
        )
    } else {
        (
            "memory.limit_in_bytes",
            vec![
                ("cpu.cfs_quota_us", "10000"),
                ("cpu.cfs_period_us", "100000"),
                ("cpu.shares", "102"),
            ],
        )
    };
    assert_eq!(
        read_file(h, "memory", &path, memory_file)?,
        (16 * MI).to_string()
    );
    for (file, value) in cpu_expect {
        assert_eq!(read_file(h, "cpu", &path, file)?, value, "{file}");
    }
    assert_eq!(read_file(h, "pids", &path, "pids.max")?, "100");

    let bigger = CgroupSettings {
        memory_limit: Some((32 * MI) as i64),
        pids_limit: Some(-1),
        ..CgroupSettings::default()
    };
    tree.node.update(&path, &bigger)?;
    assert_eq!(
        read_file(h, "memory", &path, memory_file)?,
        (32 * MI).to_string()
    );
    assert_eq!(read_file(h, "pids", &path, "pids.max")?, "max");
    Ok(())
}

#[test]
fn removing_a_cgroup_that_does_not_exist_is_ok() -> anyhow::Result<()> {
    if !root_or_skip("removing_a_cgroup_that_does_not_exist_is_ok") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let path = tree.node.pod_path(QosClass::BestEffort, "never-created")?;
    tree.node.remove(&path)?;
    tree.node.remove(&path)?;
    Ok(())
}

#[test]
fn remove_kills_leftover_processes_and_deletes_every_directory() -> anyhow::Result<()> {
    if !root_or_skip("remove_kills_leftover_processes_and_deletes_every_directory") {
        return Ok(());
    }
    let tree = TestTree::detect()?;
    let pod = tree.node.pod_path(QosClass::Burstable, "leftovers")?;
    tree.node.create_pod(&pod, &CgroupSettings::default())?;
    let container = tree.node.container_path(&pod, "c1")?;
    tree.node
        .create_container(&container, &CgroupSettings::default())?;
    // A shell with two background children: three processes, one of which forks.
    let mut shell = spawn_in(
        tree.hierarchy(),
        &container,
        "sh",
        &["-c", "sleep 100 & sleep 100 & wait"],
    )?;
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(tree.hierarchy().exists(&container));

    tree.node.remove(&pod)?;

    let status = shell.wait()?;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    for dir in tree
        .hierarchy()
        .dirs(&pod)
        .into_iter()
        .chain(tree.hierarchy().dirs(&container))
    {
        assert!(!dir.exists(), "{} still exists", dir.display());
    }
    assert!(!tree.hierarchy().exists(&pod));
    Ok(())
}

#[test]
fn root_is_fully_delegated() -> anyhow::Result<()> {
    if !root_or_skip("root_is_fully_delegated") {
        return Ok(());
    }
    let delegation = Delegation::detect(&Hierarchy::detect()?);
    assert!(delegation.is_full(), "{delegation:?}");
    Ok(())
}
