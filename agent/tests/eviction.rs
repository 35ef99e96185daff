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
//! * Disk: a 256 MiB tmpfs as the data root (the node filesystem); a pod writing 180 MiB
//!   into an emptyDir crosses `nodefs.available<100Mi`. Hard: reclaim, then eviction. Soft:
//!   crossed for less than its grace period, nothing is evicted (the condition still goes
//!   True and clears); held past it, the pod is evicted and its termination grace period is
//!   capped by `--eviction-max-pod-grace-period`.

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
/// kubelet's oom_score_adj -997, which needs CAP_SYS_RESOURCE; the CI sandbox does not grant
/// it, so there the runtime raises it to the agent's own and the kernel's OOM order would
/// not be kubelet's.)
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

/// Writes 180 MiB into its emptyDir, holds it 6 s, removes it and stays.
const BRIEF_FILLER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: brief}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: brief
    image: busybox
    command: [sh, -c, "dd if=/dev/zero of=/scratch/fill bs=1M count=180; sleep 6; rm -f /scratch/fill; exec sleep 3600"]
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
  - name: scratch
    emptyDir: {}
"#;

/// Writes 180 MiB into its emptyDir and holds it. On SIGTERM it frees the space (so that
/// the eviction relieves the node) but does not exit: only the SIGKILL at the end of its
/// grace period stops it, and its 60 s are capped by `--eviction-max-pod-grace-period`.
const STUBBORN_FILLER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: stubborn}
spec:
  terminationGracePeriodSeconds: 60
  containers:
  - name: stubborn
    image: busybox
    command:
    - sh
    - -c
    - |
      trap 'rm -f /scratch/fill' TERM
      dd if=/dev/zero of=/scratch/fill bs=1M count=180
      while true; do sleep 3600 & wait; done
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
  - name: scratch
    emptyDir: {}
"#;

/// The agent's `kubelet_evictions` sample for `signal`, if any.
fn evictions_metric(agent: &Agent, signal: &str) -> Option<String> {
    let metrics = agent.try_get("/metrics").unwrap_or_default();
    let prefix = format!("kubelet_evictions{{eviction_signal=\"{signal}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(str::to_owned)
}

#[test]
fn a_soft_threshold_evicts_only_after_its_grace_period_and_caps_the_pods_grace_period() {
    if !support::is_root() {
        return;
    }
    const GRACE_SECS: i64 = 20;
    let agent = agent_with_running_pod(
        AgentOptions {
            root_tmpfs_size: Some("256m".into()),
            ..AgentOptions::default()
        },
        &[
            "--eviction-soft=nodefs.available<100Mi",
            &format!("--eviction-soft-grace-period=nodefs.available={GRACE_SECS}s"),
            "--eviction-max-pod-grace-period=3",
            "--eviction-pressure-transition-period=5s",
        ],
        "quiet",
        QUIET,
    );

    // 1. Below the threshold for ~6 s, less than the 20 s grace period: as in kubelet, the
    //    condition does not wait for the grace period, the eviction does.
    agent.write_manifest("brief.yaml", BRIEF_FILLER);
    agent.wait_until("DiskPressure (brief)", Duration::from_secs(60), |a| {
        condition_changes(a, "DiskPressure", true) == 1
    });
    agent.wait_until(
        "DiskPressure clears (brief)",
        Duration::from_secs(60),
        |a| condition_changes(a, "DiskPressure", false) == 1,
    );
    let log = support::crash::strip_ansi(&agent.log());
    assert!(
        !log.contains("evicting pod"),
        "a soft threshold met for less than its grace period evicted a pod"
    );
    assert!(
        !log.contains("Attempting to reclaim"),
        "EvictionThresholdMet before the grace period"
    );
    assert_eq!(evictions_metric(&agent, "nodefs.available"), None);
    for name in ["brief", "quiet"] {
        let pod = agent.pod(name).expect("listed");
        assert_eq!(phase(&pod), "Running", "{name}");
        assert_eq!(restart_count(&pod, name), 0, "{name}");
    }

    // 2. Held past the grace period: evicted with kubelet's message, after the grace
    //    period, killed after --eviction-max-pod-grace-period (3 s), not its own 60 s.
    agent.write_manifest("stubborn.yaml", STUBBORN_FILLER);
    let running = agent.wait_pod("stubborn", "Running", Duration::from_secs(60), |p| {
        phase(p) == "Running"
    });
    let id = support::crash::container_id(&running, "stubborn").expect("a container id");
    let mut evicting_seen = None;
    agent.wait_until("the soft eviction starts", Duration::from_secs(90), |a| {
        evicting_seen = Some(Instant::now());
        a.log().contains("evicting pod")
    });
    let evicting_seen = evicting_seen.expect("set above");
    agent.wait_until(
        "the stubborn container is killed",
        Duration::from_secs(30),
        |a| !a.container_processes().contains_key(&id),
    );
    let killed_after = evicting_seen.elapsed();
    let pod = agent.wait_pod("stubborn", "evicted", Duration::from_secs(30), |p| {
        phase(p) == "Failed"
    });
    let status = pod.status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.starts_with(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 100Mi, available: "
        ),
        "{message}"
    );
    assert_eq!(
        support::condition(&pod, "DisruptionTarget").as_deref(),
        Some("True"),
        "kubelet sets DisruptionTarget on a pressure eviction"
    );
    let log = support::crash::strip_ansi(&agent.log());
    let pressure = log
        .lines()
        .filter(|l| {
            l.contains("node condition changed")
                && l.contains("DiskPressure")
                && l.contains("status=true")
        })
        .nth(1)
        .and_then(|l| {
            l.split_whitespace()
                .next()?
                .parse::<chrono::DateTime<chrono::Utc>>()
                .ok()
        })
        .expect("the second DiskPressure=True line");
    let evicting_line = log
        .lines()
        .find(|l| l.contains("evicting pod"))
        .expect("the evicting pod line");
    assert!(
        evicting_line.contains("stubborn") && evicting_line.contains("grace_seconds=3"),
        "{evicting_line}"
    );
    let evicting: chrono::DateTime<chrono::Utc> = evicting_line
        .split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .expect("a timestamp");
    let waited = evicting - pressure;
    eprintln!(
        "soft threshold met {} ms before the eviction; container killed {killed_after:?} after it",
        waited.num_milliseconds()
    );
    assert!(
        waited >= chrono::Duration::seconds(GRACE_SECS - 1)
            && waited < chrono::Duration::seconds(GRACE_SECS + 15),
        "evicted {waited:?} after the threshold was met, grace period {GRACE_SECS}s"
    );
    // SIGTERM is trapped: only the SIGKILL after the capped grace period (3 s) ends it.
    assert!(
        killed_after >= Duration::from_millis(2500) && killed_after < Duration::from_secs(20),
        "killed {killed_after:?} after the eviction, not after the capped 3 s"
    );
    assert!(log.contains("Attempting to reclaim ephemeral-storage"));
    assert_eq!(
        evictions_metric(&agent, "nodefs.available").as_deref(),
        Some("1")
    );
    assert_eq!(condition_changes(&agent, "DiskPressure", true), 2);
    // The trap freed the space: the condition clears after the transition period and no
    // other pod is evicted.
    agent.wait_until("DiskPressure clears", Duration::from_secs(60), |a| {
        condition_changes(a, "DiskPressure", false) == 2
    });
    for name in ["brief", "quiet"] {
        let pod = agent.pod(name).expect("listed");
        assert_eq!(phase(&pod), "Running", "{name} was evicted too");
    }
    assert_eq!(
        evictions_metric(&agent, "nodefs.available").as_deref(),
        Some("1")
    );
}
