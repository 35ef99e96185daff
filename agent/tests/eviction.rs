//! Node-pressure eviction with real containers and real pressure (static pods, no API
//! server). Needs root (CI runs as root); skips otherwise.
//!
//! * Memory: the node's allocatable memory is capped with `--system-reserved` (what is
//!   left for pods: 800Mi) and `--eviction-hard=memory.available<400Mi` (so, as in kubelet,
//!   `allocatableMemory.available<400Mi` too): a BestEffort pod holding 500Mi drives
//!   MemoryPressure and is evicted with kubelet's reason and message, a pod within its
//!   requests keeps running, a BestEffort pod arriving under pressure is
//!   rejected (a Burstable one is admitted), and the condition clears after the transition
//!   period. The machine's own memory is never short: the pressure is the pods' share.
//! * PIDs: `pid.available` set 400 below what the machine has at the start; a pod forking
//!   800 sleepers is evicted, a quiet pod stays.

mod support;

use std::time::{Duration, Instant};

use support::{phase, restart_count, Agent, AgentOptions};

fn mem_total_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse().ok())
        })
        .expect("MemTotal in /proc/meminfo")
}

/// A pod within its requests. (Burstable, not Guaranteed: a Guaranteed container gets
/// kubelet's oom_score_adj -997, which needs CAP_SYS_RESOURCE, and the CI sandbox does not
/// grant it, so Guaranteed containers fail to start there.)
const WITHIN_REQUESTS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: within-requests}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: quiet
    image: busybox
    command: [sleep, "3600"]
    resources:
      requests: {cpu: 100m, memory: 64Mi}
"#;

/// Holds 500Mi: dd's buffer, filled from /dev/zero, stays while its write to the pipe
/// blocks (sleep never reads).
const HOG: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: hog
    image: busybox
    command: [sh, -c, "dd if=/dev/zero bs=500M count=1 | sleep 3600"]
"#;

const LATE_BEST_EFFORT: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: late-best-effort}
spec:
  containers:
  - name: c
    image: busybox
    command: [sleep, "3600"]
"#;

const LATE_BURSTABLE: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: late-burstable}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox
    command: [sleep, "3600"]
    resources: {requests: {memory: 16Mi}}
"#;

/// Starts an agent with `extra_args` (and `options`) and a pod `name` (manifest `yaml`)
/// running before the pressure starts.
fn agent_with_running_pod(
    mut options: AgentOptions,
    extra_args: &[&str],
    name: &str,
    yaml: &str,
) -> Agent {
    options.extra_args = extra_args.iter().map(|a| (*a).to_owned()).collect();
    let agent = Agent::start_with(options);
    agent.write_manifest(&format!("{name}.yaml"), yaml);
    agent.wait_pod(name, "Running", Duration::from_secs(60), |p| {
        phase(p) == "Running"
    });
    agent
}

/// Starts pod `name` and waits until it is evicted (reason `Evicted`, `DisruptionTarget`);
/// returns its status message.
fn evicted(agent: &Agent, name: &str, yaml: &str) -> String {
    agent.write_manifest(&format!("{name}.yaml"), yaml);
    let pod = agent.wait_pod(name, "evicted", Duration::from_secs(90), |p| {
        phase(p) == "Failed"
    });
    let status = pod.status.expect("status");
    assert_eq!(
        status.reason.as_deref(),
        Some("Evicted"),
        "{:?}",
        status.message
    );
    status.message.unwrap_or_default()
}

/// The time of the first log line containing both `a` and `b`.
fn line_time(log: &str, a: &str, b: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    log.lines()
        .filter(|l| l.contains(a) && l.contains(b))
        .find_map(|l| l.split_whitespace().next()?.parse().ok())
}

fn condition_changes(agent: &Agent, condition: &str, status: bool) -> usize {
    support::crash::strip_ansi(&agent.log())
        .lines()
        .filter(|l| {
            l.contains("node condition changed")
                && l.contains(condition)
                && l.contains(&format!("status={status}"))
        })
        .count()
}

#[test]
fn memory_pressure_evicts_the_best_effort_hog_keeps_a_pod_within_requests_and_rejects_best_effort_pods(
) {
    if !support::is_root() {
        return;
    }
    let reserved_kib = mem_total_kib().saturating_sub(800 * 1024);
    let agent = agent_with_running_pod(
        AgentOptions {
            system_reserved: Some(format!("memory={reserved_kib}Ki")),
            ..AgentOptions::default()
        },
        &[
            "--eviction-hard=memory.available<400Mi",
            "--eviction-pressure-transition-period=10s",
        ],
        "within-requests",
        WITHIN_REQUESTS,
    );
    assert_eq!(condition_changes(&agent, "MemoryPressure", true), 0);

    let started = Instant::now();
    let message = evicted(&agent, "hog", HOG);
    let evicted_after = started.elapsed();
    // Under pressure: a BestEffort pod is rejected, a Burstable one admitted.
    agent.write_manifest("late-best-effort.yaml", LATE_BEST_EFFORT);
    agent.write_manifest("late-burstable.yaml", LATE_BURSTABLE);
    let evicted_at = Instant::now();

    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 400Mi, available: "
        ),
        "{message}"
    );
    assert!(
        message.contains("Container hog was using ")
            && message.ends_with(", request is 0, has larger consumption of memory. "),
        "{message}"
    );
    assert_eq!(condition_changes(&agent, "MemoryPressure", true), 1);
    let metrics = agent.try_get("/metrics").unwrap_or_default();
    assert!(
        metrics.contains("kubelet_evictions{eviction_signal=\"allocatableMemory.available\"} 1\n"),
        "{metrics}"
    );
    let log = support::crash::strip_ansi(&agent.log());
    assert!(
        log.lines()
            .any(|l| l.contains("EvictionThresholdMet")
                && l.contains("Attempting to reclaim memory")),
        "no EvictionThresholdMet node event"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("Evicted") && l.contains("The node was low on resource: memory")),
        "no Evicted pod event"
    );

    // cgroup v1: the threshold notification on the pods' tree starts the eviction at once,
    // not at the next 2 s period.
    if std::path::Path::new("/sys/fs/cgroup/memory/cgroup.event_control").exists() {
        let notified = line_time(
            &log,
            "memory threshold notification",
            "allocatableMemory.available",
        )
        .expect("a memory threshold notification for allocatableMemory.available");
        let evicting = line_time(&log, "evicting pod", "low on resource: memory")
            .expect("the evicting pod line");
        let delay = evicting - notified;
        eprintln!(
            "eviction started {} ms after the threshold notification",
            delay.num_milliseconds()
        );
        assert!(
            delay >= chrono::Duration::zero() && delay < chrono::Duration::seconds(1),
            "eviction started {delay:?} after the notification"
        );
    }
    let rejected = agent.wait_pod(
        "late-best-effort",
        "rejected",
        Duration::from_secs(10),
        |p| phase(p) == "Failed",
    );
    let rejected_status = rejected.status.expect("status");
    assert_eq!(rejected_status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        rejected_status.message.as_deref(),
        // kubelet's rejectPod prefixes the admit handler's message.
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );
    agent.wait_pod("late-burstable", "Running", Duration::from_secs(60), |p| {
        phase(p) == "Running"
    });

    let within = agent
        .pod("within-requests")
        .expect("within-requests listed");
    assert_eq!(
        phase(&within),
        "Running",
        "the pod within its requests was evicted"
    );
    assert_eq!(restart_count(&within, "quiet"), 0);

    agent.wait_until("MemoryPressure clears", Duration::from_secs(60), |a| {
        condition_changes(a, "MemoryPressure", false) == 1
    });
    let cleared_after = evicted_at.elapsed();
    assert!(
        cleared_after >= Duration::from_secs(7),
        "the condition cleared after {cleared_after:?}, before the 10s transition period"
    );
    eprintln!("hog evicted {evicted_after:?} after its manifest; MemoryPressure cleared {cleared_after:?} after the eviction");
    let hog_after = agent.pod("hog").expect("the evicted pod is still listed");
    assert_eq!(
        restart_count(&hog_after, "hog"),
        0,
        "an evicted pod is not restarted"
    );
}

fn pids_available() -> i64 {
    let max: i64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .expect("pid_max");
    let procs = nix::sys::sysinfo::sysinfo()
        .map(|i| i64::from(i.process_count()))
        .expect("sysinfo");
    max - procs
}

const FORKER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: forker}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: forker
    image: busybox
    command: [sh, -c, "for i in $(seq 800); do sleep 3600 & done; wait"]
"#;

const QUIET: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: quiet}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: quiet
    image: busybox
    command: [sleep, "3600"]
"#;

#[test]
fn pid_pressure_evicts_the_pod_with_the_most_processes() {
    if !support::is_root() {
        return;
    }
    let threshold = pids_available() - 400;
    let agent = agent_with_running_pod(
        AgentOptions::default(),
        &[
            &format!("--eviction-hard=pid.available<{threshold}"),
            "--eviction-pressure-transition-period=5s",
        ],
        "quiet",
        QUIET,
    );
    let message = evicted(&agent, "forker", FORKER);
    assert!(
        message.starts_with(&format!(
            "The node was low on resource: pids. Threshold quantity: {threshold}, available: "
        )),
        "{message}"
    );
    assert!(condition_changes(&agent, "PIDPressure", true) >= 1);
    agent.wait_until(
        "the forker's processes are gone",
        Duration::from_secs(30),
        |a| a.processes_in_tree().len() < 10,
    );
    agent.wait_until("PIDPressure clears", Duration::from_secs(60), |a| {
        condition_changes(a, "PIDPressure", false) >= 1
    });
    let quiet = agent.pod("quiet").expect("quiet listed");
    assert_eq!(phase(&quiet), "Running", "the quiet pod was evicted");
}

const FILLER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: filler}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: filler
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/scratch/fill bs=1M count=180; exec sleep 3600"]
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
  - name: scratch
    emptyDir: {}
"#;

#[test]
fn disk_pressure_reclaims_node_level_resources_then_evicts_the_pod_filling_the_node_filesystem() {
    if !support::is_root() {
        return;
    }
    // A 256 MiB node filesystem (tmpfs); the filler takes 180 MiB of it.
    let agent = agent_with_running_pod(
        AgentOptions {
            root_tmpfs_size: Some("256m".into()),
            ..AgentOptions::default()
        },
        &[
            "--eviction-hard=nodefs.available<100Mi",
            "--eviction-pressure-transition-period=5s",
        ],
        "quiet",
        QUIET,
    );
    assert_eq!(condition_changes(&agent, "DiskPressure", true), 0);
    let message = evicted(&agent, "filler", FILLER);
    assert!(
        message.starts_with(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 100Mi, available: "
        ),
        "{message}"
    );
    let log = support::crash::strip_ansi(&agent.log());
    assert_eq!(condition_changes(&agent, "DiskPressure", true), 1);
    let reclaim = log
        .find("Attempting to reclaim ephemeral-storage")
        .expect("an EvictionThresholdMet node event for ephemeral-storage");
    // Either line: the image GC ran (with nothing unused to remove, it reports a shortfall).
    let image_gc = log
        .find("unused images removed for disk pressure")
        .or_else(|| log.find("removing unused images for disk pressure failed"))
        .expect("node-level reclaim ran the image GC");
    let evicting = log.find("evicting pod").expect("the evicting pod line");
    assert!(
        reclaim < image_gc && image_gc < evicting,
        "reclaim runs before eviction"
    );
    let quiet = agent.pod("quiet").expect("quiet listed");
    assert_eq!(phase(&quiet), "Running", "the quiet pod was evicted");
    // The evicted pod's emptyDir goes with the pod; then the condition clears.
    agent.remove_manifest("filler.yaml");
    agent.wait_until("DiskPressure clears", Duration::from_secs(60), |a| {
        condition_changes(a, "DiskPressure", false) == 1
    });
}
