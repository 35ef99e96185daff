//! Container garbage collection with real containers: a static pod whose container fails
//! a few times leaves dead instances in the runtime; the collection that runs when the
//! agent starts (then every minute, as kubelet's) keeps one dead instance besides the running
//! one, removes the others' log files with them, and the instance `kubectl logs --previous`
//! reads is the last terminated one. Needs root (CI runs as root); skips otherwise.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use support::{container_status, restart_count, Agent, AgentOptions};

/// Fails four times (each instance prints its attempt), then runs.
const CRASHER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: crasher, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
  containers:
  - name: crash
    image: busybox
    command: [sh, -c, 'n=$(ls /state | wc -l); touch /state/$n; echo attempt-$n; [ "$n" -ge 4 ] && exec sleep 3600; exit 1']
    volumeMounts: [{name: state, mountPath: /state}]
  volumes:
  - name: state
    emptyDir: {}
"#;

/// `(state, attempt)` of every runtime container named `name`, from `ironlet ctr ps -a`.
fn instances(agent: &Agent, name: &str) -> Vec<(String, u32)> {
    let out = Command::new(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(agent.root.path())
        .args(["ctr", "ps", "-a"])
        .output()
        .expect("ironlet ctr ps runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut found: Vec<(String, u32)> = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            let tokens: Vec<&str> = line.split_whitespace().collect();
            let ago = tokens.iter().position(|t| *t == "ago")?;
            let (state, cname, attempt) = (
                tokens.get(ago + 1)?,
                tokens.get(ago + 2)?,
                tokens.get(ago + 3)?,
            );
            if *cname != name {
                return None;
            }
            Some(((*state).to_owned(), attempt.parse().ok()?))
        })
        .collect();
    found.sort_by_key(|(_, attempt)| *attempt);
    found
}

/// The container's log directory: `<pod logs>/<ns>_<name>_<uid>/<container>`.
fn log_dir(agent: &Agent, pod: &k8s_openapi::api::core::v1::Pod, name: &str) -> PathBuf {
    agent
        .logs
        .join(format!(
            "default_{}_{}",
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
        .join(name)
}

/// The attempts `<n>.log` in the container's log directory.
fn log_files(agent: &Agent, pod: &k8s_openapi::api::core::v1::Pod, name: &str) -> BTreeSet<u32> {
    std::fs::read_dir(log_dir(agent, pod, name))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
        .collect()
}

#[test]
fn dead_containers_beyond_one_per_container_are_removed_with_their_logs() {
    if !support::is_root() {
        return;
    }
    let mut agent = Agent::start_with(AgentOptions {
        extra_args: vec!["--max-container-restart-period".into(), "1s".into()],
        ..AgentOptions::default()
    });
    agent.write_manifest("crasher.yaml", CRASHER);
    agent.wait_until(
        "the container runs after four failures",
        Duration::from_secs(90),
        |a| {
            a.pod("crasher").is_some_and(|p| {
                restart_count(&p, "crash") == 4
                    && container_status(&p, "crash")
                        .and_then(|c| c.state.as_ref()?.running.as_ref())
                        .is_some()
            })
        },
    );
    let pod = agent.pod("crasher").expect("pod listed");
    // The startup collection ran before the failures and the next is a minute away: every
    // instance is still there.
    let before = instances(&agent, "crash");
    assert_eq!(before.len(), 5, "instances before collection: {before:?}");
    assert_eq!(log_files(&agent, &pod, "crash"), (0..5).collect());

    // A new agent collects at start.
    agent.restart();
    agent.wait_until(
        "dead instances are collected",
        Duration::from_secs(30),
        |a| instances(a, "crash").len() == 2,
    );
    let after = instances(&agent, "crash");
    assert_eq!(
        after,
        [("Exited(1)".to_owned(), 3), ("running".to_owned(), 4)],
        "{}",
        support::tail(&agent.log(), 40)
    );
    assert_eq!(log_files(&agent, &pod, "crash"), BTreeSet::from([3, 4]));

    // What `kubectl logs --previous` reads: the last terminated instance.
    let dir = log_dir(&agent, &pod, "crash");
    let previous =
        ironlet::server::kubelet_api::logs::instance_file(&dir, true).expect("a previous instance");
    let text = std::fs::read_to_string(&previous).expect("previous log readable");
    assert!(text.contains("attempt-3"), "{}: {text}", previous.display());
    let pod = agent.pod("crasher").expect("pod listed");
    assert_eq!(restart_count(&pod, "crash"), 4);
    let last = container_status(&pod, "crash")
        .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(last, Some(1), "lastState survives the collection");
}
