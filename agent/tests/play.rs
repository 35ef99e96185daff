//! `ironlet play FILE…` end to end (issue 16 item 4), with real containers, as root and as an
//! unprivileged user the test creates (with a subordinate id range): a two-container pod
//! whose ConfigMap (mounted as a volume) and Secret (an env var) come from the same file
//! streams its lines with
//! `pod/container | ` prefixes and becomes ready; SIGINT stops it the agent's way (the TERM
//! trap and the preStop hook print into the stream) and leaves no process, mount, directory,
//! cgroup or network namespace; a failing `restartPolicy: Never` pod makes `play` exit with
//! the container's code; init containers and restarts stream too; a second SIGINT kills
//! without waiting for the grace period; `-d` leaves the pod running and `--down` removes
//! it; a missing ConfigMap or an invalid pod fails before anything runs. Rootless, a pod gets
//! a network (pasta): the host's address as its IP, outbound access and its `hostPort`
//! published on the host, back after pasta is killed (with a `PodNetworkRestarted` event on
//! stderr), all gone after Ctrl-C. Needs root (to create the users and cgroups);
//! skips otherwise.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::is_root;
use support::rootless::{range_start, text, TestUser};

const BIN: &str = env!("CARGO_BIN_EXE_ironlet");

/// The two-container pod with its ConfigMap in one file. `MARK` makes its processes
/// findable.
const WEB: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: web-config}
data:
  greeting: hello-from-configmap
---
apiVersion: v1
kind: Secret
metadata: {name: web-secret}
stringData:
  token: s3cret
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - name: cfg
    configMap: {name: web-config}
  containers:
  - name: app
    image: busybox
    command: [sh, -c, 'trap "echo app stopping; exit 0" TERM; echo "greeting $(cat /cfg/greeting) token $TOKEN"; i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.MARK; done']
    env:
    - name: TOKEN
      valueFrom: {secretKeyRef: {name: web-secret, key: token}}
    volumeMounts: [{name: cfg, mountPath: /cfg}]
    readinessProbe:
      exec: {command: [cat, /cfg/greeting]}
      periodSeconds: 1
    lifecycle:
      preStop:
        exec: {command: [sh, -c, 'echo prestop ran > /proc/1/fd/1']}
  - name: side
    image: busybox
    command: [sh, -c, 'echo side up; exec sleep 1MARK']
"#;

const FAILING: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: job}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'echo working; sleep 0.3; echo failing; exit 3']
    # Guaranteed: kubelet's oom_score_adj for it (-997) is below the agent's own, which a
    # runtime without CAP_SYS_RESOURCE (rootless, or root in this CI sandbox) may not set:
    # the create failed with EACCES.
    resources:
      requests: {cpu: 100m, memory: 64Mi}
      limits: {cpu: 100m, memory: 64Mi}
"#;

/// An init container, then a container that fails once and succeeds when restarted.
const RETRY: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: retry}
spec:
  restartPolicy: OnFailure
  volumes: [{name: data, emptyDir: {}}]
  initContainers:
  - name: init
    image: busybox
    command: [sh, -c, 'echo init done']
  containers:
  - name: main
    image: busybox
    volumeMounts: [{name: data, mountPath: /data}]
    command: [sh, -c, 'if [ -e /data/once ]; then echo second run; exit 0; fi; touch /data/once; echo first run; exit 1']
"#;

/// A container that ignores SIGTERM, with a long grace period.
const STUBBORN: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: stubborn}
spec:
  terminationGracePeriodSeconds: 120
  containers:
  - name: main
    image: busybox
    command: [sh, -c, 'trap "echo ignoring TERM" TERM; echo up; while true; do sleep 0.MARK; done']
"#;

/// Who runs `ironlet play`: root on a temp data root, or a test user on theirs.
enum Player {
    Root { root: tempfile::TempDir },
    User(TestUser),
}

impl Player {
    fn root() -> Self {
        let root = tempfile::Builder::new()
            .prefix("ironlet-play")
            .tempdir()
            .expect("temp dir");
        let import = Command::new(BIN)
            .arg("--root-dir")
            .arg(root.path())
            .args(["images", "import"])
            .arg(support::images_out().join("busybox"))
            .output()
            .expect("ironlet images import runs");
        assert!(import.status.success(), "{}", text(&import.stderr));
        Self::Root { root }
    }

    fn user(tag: &str) -> Self {
        let user = TestUser::new(tag, Some((range_start(), 65536)));
        user.import("busybox");
        Self::User(user)
    }

    /// The data root `play` is given.
    fn root_dir(&self) -> PathBuf {
        match self {
            Self::Root { root } => root.path().to_owned(),
            Self::User(user) => user.root_dir(),
        }
    }

    /// Where manifests are written (readable by the player).
    fn work(&self) -> &Path {
        match self {
            Self::Root { root } => root.path(),
            Self::User(user) => user.work.path(),
        }
    }

    fn write(&self, name: &str, yaml: &str, mark: u32) -> String {
        let path = self.work().join(name);
        std::fs::write(&path, yaml.replace("MARK", &mark.to_string())).expect("manifest");
        path.to_string_lossy().into_owned()
    }

    /// `ironlet --root-dir ROOT play ARGS`.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut play = vec!["play"];
        if matches!(self, Self::Root { .. }) {
            // Loopback-only sandboxes: a network namespace each, no bridge to clean up.
            play.push("--no-pod-network");
        }
        play.extend_from_slice(args);
        match self {
            Self::Root { root } => {
                let mut cmd = Command::new(BIN);
                cmd.arg("--root-dir")
                    .arg(root.path())
                    .args(&play)
                    .env_remove("IRONLET_LOG")
                    .stdin(Stdio::null());
                cmd
            }
            Self::User(user) => user.cmd(&play),
        }
    }

    fn spawn(&self, args: &[&str]) -> Playing {
        let mut child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ironlet play starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("stdout");
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().expect("stderr");
        let err_sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = err_pipe.read_to_string(&mut buf);
            err_sink
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_str(&buf);
        });
        Playing {
            child,
            lines,
            stderr,
        }
    }

    /// The play's state directory name (its id), once it exists.
    fn play_id(&self, timeout: Duration) -> String {
        let dir = self.root_dir().join("play");
        let start = Instant::now();
        loop {
            let ids: Vec<String> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            if let [id] = &ids[..] {
                return id.clone();
            }
            assert!(
                start.elapsed() < timeout,
                "no play state in {}",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The row of the play's pod `name` in `ironlet pods` on its socket, split in columns.
    fn pod_row(&self, id: &str, name: &str) -> Option<Vec<String>> {
        let out = Command::new(BIN)
            .arg("--root-dir")
            .arg(self.root_dir().join("play").join(id))
            .arg("pods")
            .output()
            .ok()?;
        let listing = text(&out.stdout);
        listing
            .lines()
            .find(|l| l.starts_with(&format!("{name}-")))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
    }

    /// The READY column of the play's pod `name`.
    fn ready(&self, id: &str, name: &str) -> Option<String> {
        self.pod_row(id, name)?.get(1).cloned()
    }

    /// Nothing of play `id` is left: state directory, mounts, processes (by `marks`), the
    /// cgroup tree, and — rootless — any process of the user or its ids.
    fn assert_nothing_left(&self, id: &str, marks: &[u32]) {
        let state = self.root_dir().join("play").join(id);
        assert!(!state.exists(), "{} left behind", state.display());
        let state_text = state.to_string_lossy().into_owned();
        for table in ["/proc/self/mountinfo", "/proc/1/mountinfo"] {
            let mounts = std::fs::read_to_string(table).unwrap_or_default();
            let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&state_text)).collect();
            assert!(left.is_empty(), "mounts left in {table}: {left:?}");
        }
        let start = Instant::now();
        let left = loop {
            let left = processes(|pid, uid, cmdline| {
                let marked = marks.iter().any(|m| cmdline.contains(&m.to_string()));
                let users = match self {
                    Self::User(user) => {
                        let (first, count) = user.range.unwrap_or((u32::MAX, 0));
                        uid == user.uid || (first..first.saturating_add(count)).contains(&uid)
                    }
                    Self::Root { .. } => false,
                };
                (marked || users) && pid != std::process::id() as i32
            });
            if left.is_empty() || start.elapsed() > Duration::from_secs(3) {
                break left;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(left.is_empty(), "processes left: {left:?}");
        let cgroup = format!("ironlet-play-{id}");
        for controller in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = controller.path().join(&cgroup);
            assert!(!path.exists(), "cgroup {} left behind", path.display());
        }
    }
}

/// Pids (with their command line) of processes `pick` chooses by pid, uid and command line.
fn processes(pick: impl Fn(i32, u32, &str) -> bool) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| text(&b).replace('\0', " "))
            .unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse().ok())
            .unwrap_or(u32::MAX);
        // A zombie or kernel thread has no command line and holds nothing.
        if !cmdline.is_empty() && pick(pid, uid, &cmdline) {
            found.push((pid, cmdline));
        }
    }
    found
}

/// A running `ironlet play`, its stdout lines collected as they come.
struct Playing {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Playing {
    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn wait_line(&mut self, line: &str, timeout: Duration) {
        let start = Instant::now();
        while !self.lines().iter().any(|l| l == line) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "play exited ({status}) before printing {line:?}: {:?}\n{}",
                    self.lines(),
                    self.stderr()
                );
            }
            assert!(
                start.elapsed() < timeout,
                "no {line:?} in {:?}\nstderr: {}",
                self.lines(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal)
            .expect("signal play");
    }

    /// Ctrl-C: SIGINT, then the exit with 130 within a minute.
    fn interrupt(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGINT);
        assert_eq!(
            self.exit_code(Duration::from_secs(60)),
            130,
            "{}",
            self.stderr()
        );
    }

    /// Waits for the exit; its code.
    fn exit_code(&mut self, timeout: Duration) -> i32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait play") {
                // The readers get the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return status.code().unwrap_or(-1);
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                panic!(
                    "play did not exit in {timeout:?}: {:?}\n{}",
                    self.lines(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Playing {
    fn drop(&mut self) {
        // A failed test: the play removes its pods on SIGTERM.
        if let Ok(None) = self.child.try_wait() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            let _ = self.exit_code(Duration::from_secs(30));
        }
    }
}

/// A number for the processes of one test (in `sleep 0.N` and `sleep 1N`).
fn mark(n: u32) -> u32 {
    7000 + (std::process::id() % 900) * 3 + n
}

/// The two-container pod: prefixed lines, the ConfigMap's content, readiness; SIGINT stops
/// it through the TERM trap and the preStop hook and removes everything.
fn web_streams_becomes_ready_and_sigint_removes_everything(player: &Player, mark: u32) {
    let file = player.write("web.yaml", WEB, mark);
    let mut play = player.spawn(&[&file]);
    play.wait_line(
        "web/app | greeting hello-from-configmap token s3cret",
        Duration::from_secs(60),
    );
    play.wait_line("web/side | side up", Duration::from_secs(10));
    play.wait_line("web/app | tick 3", Duration::from_secs(10));
    let id = player.play_id(Duration::from_secs(1));
    let start = Instant::now();
    while player.ready(&id, "web").as_deref() != Some("2/2") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "web not ready: {:?}\n{}",
            player.ready(&id, "web"),
            play.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = play.lines().len();
    play.interrupt();
    let lines = play.lines();
    let after = &lines[before..];
    assert!(
        after.iter().any(|l| l == "web/app | prestop ran"),
        "{after:?}"
    );
    assert!(
        after.iter().any(|l| l == "web/app | app stopping"),
        "{after:?}"
    );
    for line in &lines {
        assert!(
            line.starts_with("web/app | ") || line.starts_with("web/side | "),
            "unprefixed {line:?}"
        );
    }
    assert!(
        play.stderr().contains("stopping the pods"),
        "{}",
        play.stderr()
    );
    player.assert_nothing_left(&id, &[mark]);
}

/// A `restartPolicy: Never` pod exiting 3: `play` exits 3 after printing its lines.
fn failing_pod_sets_the_exit_code(player: &Player) {
    let file = player.write("job.yaml", FAILING, 0);
    let mut play = player.spawn(&[&file]);
    let code = play.exit_code(Duration::from_secs(60));
    assert_eq!(code, 3, "{:?}\n{}", play.lines(), play.stderr());
    assert_eq!(
        play.lines(),
        ["job/main | working", "job/main | failing"],
        "{}",
        play.stderr()
    );
    let left: Vec<_> = std::fs::read_dir(player.root_dir().join("play"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `-d` returns with the pod running; `--down` removes it all.
fn detach_then_down(player: &Player, mark: u32) {
    let file = player.write("web-d.yaml", WEB, mark);
    let out = player.cmd(&["-d", &file]).output().expect("play -d runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "pod/web");
    let id = player.play_id(Duration::from_secs(1));
    let start = Instant::now();
    while player.ready(&id, "web").as_deref() != Some("2/2") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "detached web not ready: {:?}",
            player.ready(&id, "web")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let again = player.cmd(&[&file]).output().expect("play runs");
    assert_eq!(again.status.code(), Some(1));
    assert!(
        text(&again.stderr).contains("already playing"),
        "{}",
        text(&again.stderr)
    );
    let marked = processes(|_, _, cmdline| cmdline.contains(&format!("sleep 1{mark}")));
    assert_eq!(marked.len(), 1, "{marked:?}");
    let down = player
        .cmd(&["--down", &file])
        .output()
        .expect("play --down runs");
    assert!(down.status.success(), "{}", text(&down.stderr));
    player.assert_nothing_left(&id, &[mark]);
    let twice = player
        .cmd(&["--down", &file])
        .output()
        .expect("play --down runs");
    assert!(
        text(&twice.stderr).contains("is not playing"),
        "{}",
        text(&twice.stderr)
    );
}

#[test]
fn play_as_root_streams_ready_pod_sigint_cleans_up() {
    if !is_root() {
        return;
    }
    let player = Player::root();
    web_streams_becomes_ready_and_sigint_removes_everything(&player, mark(0));
}

#[test]
fn play_as_root_exits_with_the_failed_containers_code() {
    if !is_root() {
        return;
    }
    failing_pod_sets_the_exit_code(&Player::root());
}

#[test]
fn play_as_root_streams_init_and_restarted_containers_and_exits_0_on_success() {
    if !is_root() {
        return;
    }
    let player = Player::root();
    let file = player.write("retry.yaml", RETRY, 0);
    let mut play = player.spawn(&[&file]);
    let code = play.exit_code(Duration::from_secs(90));
    assert_eq!(code, 0, "{:?}\n{}", play.lines(), play.stderr());
    assert_eq!(
        play.lines(),
        [
            "retry/init | init done",
            "retry/main | first run",
            "retry/main | second run"
        ],
        "{}",
        play.stderr()
    );
}

#[test]
fn play_as_root_second_sigint_kills_without_waiting_for_the_grace_period() {
    if !is_root() {
        return;
    }
    let player = Player::root();
    let mark = mark(4);
    let file = player.write("stubborn.yaml", STUBBORN, mark);
    let mut play = player.spawn(&[&file]);
    play.wait_line("stubborn/main | up", Duration::from_secs(60));
    let id = player.play_id(Duration::from_secs(1));
    play.signal(nix::sys::signal::Signal::SIGINT);
    play.wait_line("stubborn/main | ignoring TERM", Duration::from_secs(10));
    let start = Instant::now();
    play.signal(nix::sys::signal::Signal::SIGINT);
    assert_eq!(play.exit_code(Duration::from_secs(30)), 130);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "forced stop took {:?}",
        start.elapsed()
    );
    assert!(
        play.stderr().contains("killing the pods"),
        "{}",
        play.stderr()
    );
    player.assert_nothing_left(&id, &[mark]);
}

#[test]
fn play_as_root_detached_then_down() {
    if !is_root() {
        return;
    }
    detach_then_down(&Player::root(), mark(1));
}

#[test]
fn play_rootless_streams_fails_with_the_code_detaches_and_cleans_up() {
    if !is_root() {
        return;
    }
    let player = Player::user("play");
    failing_pod_sets_the_exit_code(&player);
    web_streams_becomes_ready_and_sigint_removes_everything(&player, mark(2));
    detach_then_down(&player, mark(3));
}

/// A pod that prints its address, reaches a server on the host (`HOST_PORT_OUT`, at the
/// gateway: the host's loopback seen from the pod) and serves on a `hostPort`.
const NETWORKED: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: net}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox
    command: [sh, -c, 'echo hosts $(tail -n 1 /etc/hosts); set -- $(ip -4 -o addr show eth0); echo addr $4; set -- $(ip route | grep ^default); sleep 2 | timeout 20 nc $3 OUT_PORT | sed "s/^/outbound: /"; while true; do echo pod MARK answers | nc -l -p 8080; done']
    ports: [{containerPort: 8080, hostPort: HOST_PORT}]
  - name: e
    image: busybox
    env:
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    command: [sh, -c, 'trap "exit 0" TERM; echo podip $POD_IP MARK; sleep 3600 & wait']
"#;

#[test]
fn play_rootless_pod_has_an_ip_reaches_out_and_publishes_its_host_port() {
    if !is_root() {
        return;
    }
    let player = Player::user("playnet");
    let Player::User(user) = &player else {
        unreachable!("a user player")
    };
    let mark = mark(5);
    let (out_port, serving) = support::serve_once_on_loopback("pong from the host\n");
    let host_port = support::free_port();
    let yaml = NETWORKED
        .replace("OUT_PORT", &out_port.to_string())
        .replace("HOST_PORT", &host_port.to_string());
    let file = player.write("net.yaml", &yaml, mark);
    let mut play = player.spawn(&[&file]);
    let address = support::host_address();
    play.wait_line(
        "net/c | outbound: pong from the host",
        Duration::from_secs(60),
    );
    assert!(
        serving.join().expect("server thread"),
        "the host server was reached"
    );
    assert!(
        play.lines()
            .iter()
            .any(|l| l.starts_with(&format!("net/c | addr {address}/"))),
        "eth0 has the host's address {address}: {:?}",
        play.lines()
    );
    // pasta connects the pod while its first container is created: that container's
    // /etc/hosts still gets the pod's IP before it starts, and the next one's environment.
    assert!(
        play.lines()
            .iter()
            .any(|l| l.starts_with(&format!("net/c | hosts {address} net-"))),
        "/etc/hosts names the pod's IP {address}: {:?}",
        play.lines()
    );
    play.wait_line(
        &format!("net/e | podip {address} {mark}"),
        Duration::from_secs(10),
    );
    assert_eq!(
        support::answer_at("127.0.0.1", host_port, Duration::from_secs(20)).as_deref(),
        Some(format!("pod {mark} answers\n").as_str()),
        "hostPort {host_port} from the host: {:?}\n{}",
        play.lines(),
        play.stderr()
    );
    let id = player.play_id(Duration::from_secs(1));
    let row = player.pod_row(&id, "net").unwrap_or_default();
    assert_eq!(
        row.last(),
        Some(&address),
        "the pod's IP is reported: {row:?}"
    );
    assert!(
        !play.stderr().contains("rootless networking unavailable"),
        "{}",
        play.stderr()
    );
    let pasta =
        processes(|_, uid, cmdline| uid == user.uid && cmdline.contains("pasta --config-net"));
    assert_eq!(pasta.len(), 1, "one pasta for the pod: {pasta:?}");

    // pasta dies: the keeper restarts it and the user sees the pod's event on stderr.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pasta[0].0),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill pasta");
    assert_eq!(
        support::answer_at("127.0.0.1", host_port, Duration::from_secs(10)).as_deref(),
        Some(format!("pod {mark} answers\n").as_str()),
        "hostPort after pasta's restart: {}",
        play.stderr()
    );
    // The runtime checks for restarts every second and notes what it reported beside them.
    let sandboxes = player.root_dir().join("play").join(&id).join("sandboxes");
    let reported = || {
        std::fs::read_dir(&sandboxes)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("pasta-restarts.reported").exists())
    };
    let start = Instant::now();
    while !reported() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    play.interrupt();
    // stderr is read to its end once play has exited.
    let stderr = play.stderr();
    let events: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("PodNetworkRestarted"))
        .collect();
    assert_eq!(events.len(), 1, "one event for the restart: {stderr}");
    assert!(
        events[0].contains("net-")
            && events[0].contains(&format!(
                "pasta (pid {}) ended (signal SIGKILL)",
                pasta[0].0
            )),
        "the event names the pod and how pasta ended: {}",
        events[0]
    );
    // pasta and the namespace holder are the user's: assert_nothing_left covers them.
    player.assert_nothing_left(&id, &[mark]);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", host_port)).is_err(),
        "the host port is closed"
    );
}

#[test]
fn play_refuses_bad_manifests_and_missing_config_maps_before_running_anything() {
    if !is_root() {
        return;
    }
    let player = Player::root();
    // The pod without its ConfigMap and Secret.
    let alone = WEB.split("---").nth(2).expect("pod document");
    let file = player.write("alone.yaml", alone, 0);
    let out = player.cmd(&[&file]).output().expect("play runs");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(r#"pod web: configmap "web-config" not found"#)
            && err.contains(r#"pod web: secret "web-secret" not found"#),
        "{err}"
    );
    let bad = player.write(
        "bad.yaml",
        "kind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n",
        0,
    );
    let out = player.cmd(&[&bad]).output().expect("play runs");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("manifest {bad}: pod \"x\" is invalid"))
            && err.contains("spec.containers must have at least one container"),
        "{err}"
    );
    let left = std::fs::read_dir(player.root_dir().join("play"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0);
}
