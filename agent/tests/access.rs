//! What other host users and hostile containers can reach of what ironlet writes, end to
//! end with a real agent: a log file or directory a container replaced by a symlink is not
//! followed; another host user reads nothing of the data root or of the container logs (a
//! Secret set as an env var and mounted as a volume, and printed by the container) and
//! cannot connect to the agent's socket; image blobs and unpacked layers are private to the
//! store even below a data root others may traverse. Needs root (CI runs as root); skips otherwise.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
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

/// Files under `dir` whose mode grants other users anything, with their modes.
fn open_to_others(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if meta.permissions().mode() & 0o007 != 0 {
                found.push(format!("{} {:o}", path.display(), mode(&path)));
            }
            stack.extend(
                std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else if meta.is_file() && meta.permissions().mode() & 0o004 != 0 {
            found.push(format!("{} {:o}", path.display(), mode(&path)));
        }
    }
    found
}

#[test]
fn another_host_user_reads_no_image_blob_or_layer_even_below_an_open_parent() {
    if !support::is_root() {
        return;
    }
    let root = tempfile::Builder::new()
        .prefix("ironlet-access-images")
        .tempdir()
        .expect("temp dir");
    let ironlet = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ironlet"))
            .arg("--root-dir")
            .arg(root.path())
            .args(args)
            .output()
            .expect("ironlet runs");
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    };
    let busybox = support::images_out().join("busybox");
    ironlet(&["images", "import", &busybox.to_string_lossy()]);
    // The data root opened up by an admin (as /var/lib is): the store itself stays closed.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let store = root.path().join("images");
    assert_eq!(mode(&store), 0o700, "the image store's root");
    for dir in ["blobs", "blobs/sha256", "ingest", "snapshots", "leases"] {
        assert_eq!(mode(&store.join(dir)), 0o700, "{dir}");
    }
    let blobs: Vec<_> = std::fs::read_dir(store.join("blobs/sha256"))
        .expect("blobs")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(!blobs.is_empty(), "the import stored blobs");
    for blob in &blobs {
        assert_eq!(mode(blob), 0o600, "{}", blob.display());
    }
    let (files, _) = readable_by_stranger(root.path(), &[]);
    assert_eq!(files, Vec::<String>::new(), "files another user can read");
    // Even the store's root opened up: blobs are still private, and snapshots unreachable.
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let (files, _) = readable_by_stranger(&store, &[]);
    assert_eq!(
        files,
        Vec::<String>::new(),
        "files another user can read in the store"
    );

    // A store made before the modes were set (0755 directories, 0644 blobs) is narrowed
    // the next time it is opened.
    for dir in ["", "blobs", "blobs/sha256", "snapshots"] {
        std::fs::set_permissions(store.join(dir), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    ironlet(&["images", "ls"]);
    let open = open_to_others(&store)
        .into_iter()
        .filter(|p| !p.contains("/snapshots/"))
        .filter(|p| !p.contains("/blobs/sha256/"))
        .collect::<Vec<_>>();
    assert_eq!(open, Vec::<String>::new(), "store directories left open");
    let (files, _) = readable_by_stranger(&store, &[]);
    assert_eq!(files, Vec::<String>::new(), "after narrowing");
}

const TICKER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: ticker, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: busybox, command: [sh, -c, 'while true; do echo tick; sleep 0.1; done']}
"#;

/// Sends SIGCONT to a stopped process when dropped.
struct ResumeOnDrop(i32);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    }
}

#[test]
fn a_log_file_swapped_for_a_symlink_while_the_agent_is_down_is_not_followed() {
    use nix::sys::signal::Signal;
    if !support::is_root() {
        return;
    }
    let (agent, host) = start_with_host_file("precious\n");
    agent.write_manifest("ticker.yaml", TICKER);
    let pod = agent.wait_pod("ticker", "running", Duration::from_secs(60), running);
    let id = support::container_status(&pod, "main")
        .and_then(|c| c.container_id.clone())
        .expect("container id");
    agent.wait_until("the container logs", Duration::from_secs(10), |a| {
        !a.log_lines(&pod, "main").is_empty()
    });
    let dir = agent
        .logs
        .join(format!(
            "default_{}_{}",
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
        .join("main");

    // The agent down (the supervisor held back from restarting it), the log swapped.
    agent.signal_supervisor(Signal::SIGSTOP);
    // Resumed on every path: a failed check must not leave the agent's clean-up hanging.
    let resume = ResumeOnDrop(agent.supervisor_pid());
    let old_pid = agent.version().map(|v| v.pid).expect("agent pid");
    agent.kill_agent();
    // Dead, and a zombie until the stopped supervisor reaps it.
    agent.wait_until("the agent is dead", Duration::from_secs(10), |_| {
        std::fs::read_to_string(format!("/proc/{old_pid}/stat")).map_or(true, |s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'))
        })
    });
    std::fs::remove_file(dir.join("0.log")).expect("remove the log");
    std::os::unix::fs::symlink(host.path().join("file"), dir.join("0.log")).expect("symlink");
    std::thread::sleep(Duration::from_millis(300));
    drop(resume);
    agent.wait_until("a new agent answers", Duration::from_secs(20), |a| {
        a.version().is_some_and(|v| v.pid != old_pid)
    });
    let readopted = agent.wait_pod("ticker", "re-adopted", Duration::from_secs(20), |p| {
        running(p)
            && support::container_status(p, "main").and_then(|c| c.container_id.as_deref())
                == Some(id.as_str())
    });
    assert_eq!(support::restart_count(&readopted, "main"), 0);
    // The resumed pump has had time to write a few ticks.
    std::thread::sleep(Duration::from_secs(1));
    let host_file = || std::fs::read_to_string(host.path().join("file")).expect("host file");
    assert_eq!(
        host_file(),
        "precious\n",
        "the re-adopted pump followed the symlink"
    );
    assert!(
        agent.log().contains("refusing log path"),
        "the re-adopted pump's refusal is logged: {}",
        support::tail(&agent.log(), 30)
    );

    // The next instance of the container writes a fresh file of its own.
    let short_id = id.trim_start_matches("ironlet://");
    let init = agent
        .container_processes()
        .get(short_id)
        .and_then(|ps| {
            ps.iter()
                .find(|(_, ns_pid)| *ns_pid == 1)
                .map(|(pid, _)| *pid)
        })
        .expect("the container's init process");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init), Signal::SIGKILL).expect("kill");
    agent.wait_pod("ticker", "restarted once", Duration::from_secs(40), |p| {
        running(p) && support::restart_count(p, "main") == 1
    });
    let fresh = dir.join("1.log");
    agent.wait_until("the new instance logs", Duration::from_secs(10), |_| {
        std::fs::read_to_string(&fresh).is_ok_and(|t| t.contains(" stdout F tick"))
    });
    let meta = std::fs::symlink_metadata(&fresh).expect("1.log");
    assert!(
        meta.is_file() && meta.nlink() == 1,
        "1.log is a fresh regular file"
    );
    assert_eq!(mode(&fresh), 0o640);
    assert!(
        std::fs::symlink_metadata(dir.join("0.log"))
            .expect("0.log")
            .file_type()
            .is_symlink(),
        "the planted symlink is left alone"
    );
    assert_eq!(
        host_file(),
        "precious\n",
        "a host file was written through a symlink"
    );
}
