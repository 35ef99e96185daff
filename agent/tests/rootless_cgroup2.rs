//! Rootless limits in a delegated cgroup v2 subtree (issue 16, "Rootless limits"), as an
//! unprivileged user the test creates (with a subordinate id range) in a cgroup delegated to
//! it the way systemd's `Delegate=yes` does: `ctr run --memory/--pids`, a static pod's and an
//! `ironlet play` pod's `limits` are set on the containers' own cgroups and enforced (a fork bomb stops at
//! `pids.max`, a memory hog is `OOMKilled` and says so). Real containers; needs root (to make
//! the user and the cgroup) and a pure cgroup v2 host, so it runs in `scripts/cgroup2-vm`
//! (`scripts/test-cgroup2`) and skips elsewhere. Without delegation (cgroup v1) the warning
//! path is tested by `rootless_ids.rs` and `cli.rs`.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::is_root;
use support::rootless::{range_start, text, TestUser};

const CGROUP2: &str = "/sys/fs/cgroup";

/// The controllers systemd delegates to users by default.
const DELEGATED: [&str; 3] = ["cpu", "memory", "pids"];

/// `/sys/fs/cgroup/user.slice/user-<uid>.slice/ironlet-test-<pid>.scope`, delegated to `uid` as
/// systemd does for `Delegate=yes`: the controllers enabled down to it, the directory and its
/// `cgroup.procs`, `cgroup.subtree_control` and `cgroup.threads` chowned to the user. Dropped:
/// everything in it killed (`cgroup.kill`), then the cgroups removed, those the test made too.
struct DelegatedScope {
    dir: PathBuf,
    made: Vec<PathBuf>,
}

impl DelegatedScope {
    /// `None` when `/sys/fs/cgroup` is not a cgroup v2 hierarchy.
    fn new(uid: u32) -> Option<Self> {
        if !Path::new(CGROUP2).join("cgroup.subtree_control").exists() {
            return None;
        }
        let mut scope = Self {
            dir: PathBuf::from(CGROUP2),
            made: Vec::new(),
        };
        for name in [
            "user.slice".to_owned(),
            format!("user-{uid}.slice"),
            format!("ironlet-test-{}.scope", std::process::id()),
        ] {
            for controller in DELEGATED {
                std::fs::write(
                    scope.dir.join("cgroup.subtree_control"),
                    format!("+{controller}"),
                )
                .unwrap_or_else(|e| panic!("enable {controller} in {}: {e}", scope.dir.display()));
            }
            scope.dir.push(name);
            match std::fs::create_dir(&scope.dir) {
                Ok(()) => scope.made.push(scope.dir.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("mkdir {}: {e}", scope.dir.display()),
            }
        }
        for file in [
            "",
            "cgroup.procs",
            "cgroup.subtree_control",
            "cgroup.threads",
        ] {
            let path = scope.dir.join(file);
            std::os::unix::fs::chown(&path, Some(uid), Some(uid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        }
        Some(scope)
    }

    /// Every cgroup below the scope (not the scope), deepest first.
    fn descendants(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&entry.path(), out);
                    out.push(entry.path());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.dir, &mut out);
        out
    }

    /// The cgroups below the scope whose `file` reads `value` and that hold processes.
    fn busy_with(&self, file: &str, value: &str) -> Vec<PathBuf> {
        self.descendants()
            .into_iter()
            .filter(|d| read(&d.join(file)) == value && !read(&d.join("cgroup.procs")).is_empty())
            .collect()
    }
}

impl Drop for DelegatedScope {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(10);
        while read(&self.dir.join("cgroup.events")).contains("populated 1")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for dir in self.descendants() {
            let _ = std::fs::remove_dir(dir);
        }
        for dir in self.made.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// A user with a subordinate range whose commands run in a delegated scope; `None` (the test
/// skips) unless root on cgroup v2.
fn delegated_user(tag: &str, offset: u32) -> Option<(TestUser, DelegatedScope)> {
    if !is_root() || !Path::new(CGROUP2).join("cgroup.subtree_control").exists() {
        eprintln!("skipped: needs root on a cgroup v2 host (scripts/cgroup2-vm)");
        return None;
    }
    let mut user = TestUser::new(tag, Some((range_start() + 65536 * offset, 65536)));
    let scope = DelegatedScope::new(user.uid)?;
    user.scope = Some(scope.dir.clone());
    user.import("busybox");
    Some((user, scope))
}

#[test]
fn ctr_run_limits_hold_in_a_delegated_cgroup_v2_subtree() {
    let Some((user, scope)) = delegated_user("cg2ctr", 700) else {
        return;
    };
    // The container's own cgroup (its cgroup namespace's root) has the limits.
    let run = user.sh(
        "busybox",
        &["--net-host", "--memory", "64m", "--pids", "20"],
        "cat /proc/self/cgroup /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max",
    );
    let stderr = text(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert_eq!(text(&run.stdout), "0::/\n67108864\n20\n", "{stderr}");
    assert!(!stderr.contains("NOT enforced"), "delegated: {stderr}");
    // The scope's processes moved into its leaf; the containers' cgroups are beside it.
    assert!(scope.dir.join("ironlet-agent").is_dir());
    assert_eq!(
        read(&scope.dir.join("cgroup.procs")),
        "",
        "no internal processes"
    );

    // A fork bomb stops at pids.max: forks beyond it fail (pids.events counts them).
    let run = user.sh(
        "busybox",
        &["--net-host", "--pids", "20"],
        "(for i in $(seq 60); do sleep 60 & done) 2>/dev/null; \
         cat /sys/fs/cgroup/pids.current /sys/fs/cgroup/pids.events",
    );
    let out = text(&run.stdout);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let mut lines = out.lines();
    let current: u32 = lines.next().and_then(|l| l.parse().ok()).unwrap_or(0);
    assert!((1..=20).contains(&current), "pids.current: {out}");
    let refused: u32 = lines
        .find_map(|l| l.strip_prefix("max "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(refused > 0, "no fork was refused: {out}");

    // A memory hog is OOM-killed by its limit, and ctr says so.
    let run = user.run(&[
        "ctr",
        "run",
        "--rm",
        "--net-host",
        "--memory",
        "32m",
        "busybox",
        "--",
        "tail",
        "/dev/zero",
    ]);
    let stderr = text(&run.stderr);
    assert_eq!(run.status.code(), Some(137), "{stderr}");
    assert!(stderr.contains("OOMKilled"), "{stderr}");
    user.assert_no_containers();
    let left: Vec<_> = scope
        .descendants()
        .into_iter()
        .filter(|d| !d.ends_with("ironlet-agent") && !d.ends_with("ironlet"))
        .collect();
    assert!(left.is_empty(), "container cgroups left: {left:?}");
}

/// The rootless agent's pods (`ironlet pods -A -o json` as the user).
fn pods(user: &TestUser) -> Vec<k8s_openapi::api::core::v1::Pod> {
    let out = user.run(&["pods", "-A", "-o", "json"]);
    serde_json::from_slice::<k8s_openapi::List<k8s_openapi::api::core::v1::Pod>>(&out.stdout)
        .map(|l| l.items)
        .unwrap_or_default()
}

fn terminated_reason(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .reason
        .clone()
}

#[test]
fn a_rootless_pods_limits_hold_in_a_delegated_cgroup_v2_subtree() {
    let Some((user, scope)) = delegated_user("cg2pod", 800) else {
        return;
    };
    let (agent, log_path) = user.start_agent("rootless-cgroup2");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let manifest = agent.manifests.join("pods.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: v1
kind: Pod
metadata: {name: limits}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox
    command: [sleep, "3600"]
    resources: {limits: {memory: 48Mi, cpu: 250m}}
---
apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: c
    image: busybox
    command: [tail, /dev/zero]
    resources: {limits: {memory: 32Mi}}
"#,
    )
    .expect("manifest");

    // The limits pod's container runs in a cgroup of its own with the pod's limits.
    let deadline = Instant::now() + Duration::from_secs(60);
    let limited = loop {
        let found = scope.busy_with("memory.max", &(48u64 << 20).to_string());
        if let Some(dir) = found.into_iter().next() {
            break dir;
        }
        assert!(
            Instant::now() < deadline,
            "no container cgroup with memory.max 48Mi; agent log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(read(&limited.join("cpu.max")), "25000 100000");
    assert!(
        limited.starts_with(scope.dir.join("kubepods")),
        "{}",
        limited.display()
    );
    // Its pod's cgroup has the pod's limit too.
    let pod_dir = limited.parent().expect("pod cgroup");
    assert_eq!(read(&pod_dir.join("memory.max")), (48u64 << 20).to_string());

    // The hog is OOM-killed, and its status says so.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let hog = pods(&user).into_iter().find(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("hog"))
        });
        if let Some(reason) = hog.as_ref().and_then(terminated_reason) {
            assert_eq!(reason, "OOMKilled", "{hog:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hog did not end: {hog:?}; agent log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let agent_log = log();
    for unwanted in [
        "resource limits are not enforced",
        "cannot watch the pod cgroup",
    ] {
        assert!(!agent_log.contains(unwanted), "{unwanted}: {agent_log}");
    }

    // Pods removed: their cgroups go with them.
    std::fs::remove_file(&manifest).expect("remove manifest");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pod_cgroups: Vec<_> = scope
            .descendants()
            .into_iter()
            .filter(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("pod"))
            })
            .collect();
        if pod_cgroups.is_empty() && pods(&user).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pod cgroups left: {pod_cgroups:?}; agent log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(agent);
}

#[test]
fn ironlet_play_enforces_a_pods_limits_in_a_delegated_cgroup_v2_subtree() {
    let Some((user, scope)) = delegated_user("cg2play", 900) else {
        return;
    };
    let file = user.work.path().join("play.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: v1
kind: Pod
metadata: {name: job}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: c
    image: busybox
    command: [sh, -c, "cat /proc/self/cgroup /sys/fs/cgroup/memory.max"]
    resources: {limits: {memory: 40Mi}}
"#,
    )
    .expect("manifest");
    std::os::unix::fs::chown(&file, Some(user.uid), Some(user.uid)).expect("chown manifest");
    let run = user.run(&["play", &file.to_string_lossy()]);
    let out = text(&run.stdout);
    assert!(run.status.success(), "{out}\n{}", text(&run.stderr));
    for line in ["job/c | 0::/", &format!("job/c | {}", 40u64 << 20)] {
        assert!(out.lines().any(|l| l.trim_end() == line), "{line}: {out}");
    }
    let left: Vec<_> = scope
        .descendants()
        .into_iter()
        .filter(|d| d.to_string_lossy().contains("ironlet-play-"))
        .collect();
    assert!(left.is_empty(), "the play's cgroups left: {left:?}");
}
