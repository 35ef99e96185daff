//! What other host users and hostile containers can reach of what ironlet writes, end to
//! end with a real agent: a log file or directory a container replaced by a symlink is not
//! followed; another host user reads nothing of the data root or of the container logs (a
//! Secret set as an env var and mounted as a volume, and printed by the container) and
//! cannot connect to the agent's socket. Needs root (CI runs as root); skips otherwise.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use support::{phase, Agent};

/// The unprivileged host user of the tests (Debian's `nobody`).
const STRANGER: u32 = 65534;
/// The Secret's value, which must never be readable by [`STRANGER`].
const SECRET_VALUE: &str = "tok-4c1d-never-shown";

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn running(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    phase(pod) == "Running"
        && pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            })
}

/// Runs `program ARGS` as [`STRANGER`], without supplementary groups.
fn as_stranger(program: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid",
            &STRANGER.to_string(),
            "--regid",
            &STRANGER.to_string(),
            "--clear-groups",
            "--",
        ])
        .arg(program)
        .args(args)
        .output()
        .expect("setpriv runs")
}

/// What [`STRANGER`] can read under `dir`: the regular files it may open (relative paths,
/// `skip`ped top-level entries left out) and everything those files hold.
fn readable_by_stranger(dir: &Path, skip: &[&str]) -> (Vec<String>, String) {
    let script = r#"cd "$1" || exit 0; find . -type f -readable 2>/dev/null; echo ===; find . -type f -readable -exec cat {} + 2>/dev/null; exit 0"#;
    let out = as_stranger("sh", &["-c", script, "sh", &dir.to_string_lossy()]);
    let stdout = text(&out.stdout);
    let (names, contents) = stdout.split_once("===\n").unwrap_or((&stdout, ""));
    let names = names
        .lines()
        .map(|l| l.trim_start_matches("./").to_owned())
        .filter(|l| {
            !skip
                .iter()
                .any(|s| l == s || l.starts_with(&format!("{s}/")))
        })
        .collect();
    (names, contents.to_owned())
}

/// An agent, and a host directory holding `file` with `content` that a pod's containers
/// try to have the agent write or read through symlinks.
fn start_with_host_file(content: &str) -> (Agent, tempfile::TempDir) {
    let agent = Agent::start();
    let host = tempfile::tempdir().expect("temp dir");
    std::fs::write(host.path().join("file"), content).expect("host file");
    (agent, host)
}

/// `manifest` with HOST and LOGS replaced by the host directory and the pod logs directory.
fn with_paths(manifest: &str, agent: &Agent, host: &tempfile::TempDir) -> String {
    manifest
        .replace("HOST", &host.path().to_string_lossy())
        .replace("LOGS", &agent.logs.to_string_lossy())
}

const LOG_LEAK: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: logleak, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: plant
    image: busybox
    command: [sh, -c, 'd=$(echo /plogs/default_logleak-*); mkdir -p $d/main && ln -s HOST/file $d/main/0.log && ln -s HOST/dir $d/side']
    volumeMounts: [{name: plogs, mountPath: /plogs}]
  containers:
  - {name: main, image: busybox, command: [sh, -c, 'echo leaked-line; exec sleep 3600']}
  - {name: side, image: busybox, command: [sh, -c, 'echo leaked-line; exec sleep 3600']}
  volumes:
  - {name: plogs, hostPath: {path: LOGS, type: DirectoryOrCreate}}
"#;

#[test]
fn a_log_file_or_directory_replaced_by_a_symlink_is_not_followed() {
    if !support::is_root() {
        return;
    }
    let (agent, host) = start_with_host_file("precious\n");
    std::fs::create_dir(host.path().join("dir")).expect("host dir");
    agent.write_manifest("logleak.yaml", &with_paths(LOG_LEAK, &agent, &host));
    agent.wait_pod(
        "logleak",
        "both containers running",
        Duration::from_secs(60),
        running,
    );
    // The containers printed their line right away; give the pumps time to write it.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        std::fs::read_to_string(host.path().join("file")).expect("host file"),
        "precious\n",
        "container output was appended to a host file through a symlinked log file"
    );
    let made: Vec<_> = std::fs::read_dir(host.path().join("dir"))
        .expect("host dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        made.is_empty(),
        "a log file was created through a symlinked directory: {made:?}"
    );
    assert!(
        agent.log().contains("refusing log path"),
        "the refusal is logged: {}",
        support::tail(&agent.log(), 30)
    );
}

const SECRET_POD: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: default}
data: {token: dG9rLTRjMWQtbmV2ZXItc2hvd24=}
---
apiVersion: v1
kind: Pod
metadata: {name: secretive, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: busybox
    command: [sh, -c, 'echo "env $TOKEN"; echo "file $(cat /creds/token)"; exec sleep 3600']
    env:
    - name: TOKEN
      valueFrom: {secretKeyRef: {name: creds, key: token}}
    volumeMounts: [{name: creds, mountPath: /creds}]
  volumes:
  - name: creds
    secret: {secretName: creds}
"#;

#[test]
fn another_host_user_reads_nothing_of_the_data_root_the_logs_or_the_socket() {
    if !support::is_root() {
        return;
    }
    let mut agent = Agent::start();
    let root = agent.root.path().to_owned();
    // An install made before the modes were set: a data root anyone may enter.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    agent.restart();
    assert_eq!(
        mode(&root),
        0o700,
        "the agent narrows the data root at start"
    );
    agent.write_manifest("secretive.yaml", SECRET_POD);
    let pod = agent.wait_pod("secretive", "running", Duration::from_secs(60), running);
    agent.wait_until(
        "the container printed the secret",
        Duration::from_secs(10),
        |a| {
            a.log_lines(&pod, "app")
                .iter()
                .any(|l| l == &format!("file {SECRET_VALUE}"))
        },
    );
    // A copy of the binary the stranger may run, outside the data root.
    let bin_dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let bin = bin_dir.path().join("ironlet");
    std::fs::copy(env!("CARGO_BIN_EXE_ironlet"), &bin).expect("copy binary");
    let socket_refused = |why: &str| {
        let out = as_stranger(
            &bin.to_string_lossy(),
            &["--root-dir", &root.to_string_lossy(), "pods", "-A"],
        );
        assert_eq!(out.status.code(), Some(1), "{why}: {}", text(&out.stdout));
        assert!(
            text(&out.stderr).contains("ermission denied"),
            "{why}: {}",
            text(&out.stderr)
        );
    };

    // As the agent left it: nothing at all.
    let (files, contents) = readable_by_stranger(&root, &[]);
    assert_eq!(
        files,
        Vec::<String>::new(),
        "files another user can read in the data root"
    );
    assert!(!contents.contains(SECRET_VALUE));
    socket_refused("through a 0700 root");

    // Even with a root anyone may traverse (as /var/log above /var/log/pods), nothing ironlet
    // wrote inside is readable: state, records, bundles, volumes, logs, the socket.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let test_made = ["manifests", "agent.log", "cni"];
    let (files, contents) = readable_by_stranger(&root, &test_made);
    let logs = readable_by_stranger(&agent.logs, &[]);
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    assert_eq!(
        files,
        Vec::<String>::new(),
        "files another user can read below the data root"
    );
    assert!(
        !contents.contains(SECRET_VALUE),
        "the secret is readable below the data root"
    );
    assert_eq!(
        logs.0,
        Vec::<String>::new(),
        "log files another user can read"
    );
    assert!(
        !logs.1.contains(SECRET_VALUE),
        "the secret is readable in the logs"
    );
    socket_refused("through a 0711 root");

    // The modes kubelet and containerd use for logs: 0755 directories, 0640 files.
    let pod_logs = agent.logs.join(format!(
        "default_{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    ));
    assert_eq!(mode(&pod_logs), 0o755);
    assert_eq!(mode(&pod_logs.join("app")), 0o755);
    assert_eq!(mode(&pod_logs.join("app/0.log")), 0o640);
}

const TAIL_LEAK: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: tail, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - name: app
    image: busybox
    terminationMessagePolicy: FallbackToLogsOnError
    command: [sh, -c, 'f=$(echo /plogs/default_tail-*/app/0.log); rm $f && ln -s HOST/file $f; exit 3']
    volumeMounts: [{name: plogs, mountPath: /plogs}]
  volumes:
  - {name: plogs, hostPath: {path: LOGS, type: DirectoryOrCreate}}
"#;

#[test]
fn a_termination_message_is_never_read_through_a_symlinked_log_file() {
    if !support::is_root() {
        return;
    }
    let (agent, host) =
        start_with_host_file("2026-01-01T00:00:00.000000000Z stdout F host-only-line\n");
    agent.write_manifest("tail.yaml", &with_paths(TAIL_LEAK, &agent, &host));
    let pod = agent.wait_pod(
        "tail",
        "its container exited",
        Duration::from_secs(60),
        |p| {
            support::container_status(p, "app")
                .and_then(|c| c.state.as_ref()?.terminated.as_ref())
                .is_some()
        },
    );
    let terminated = support::container_status(&pod, "app")
        .and_then(|c| c.state.clone()?.terminated)
        .expect("terminated");
    assert_eq!(terminated.exit_code, 3);
    assert!(
        !terminated
            .message
            .unwrap_or_default()
            .contains("host-only-line"),
        "a host file was read into the termination message"
    );
}
