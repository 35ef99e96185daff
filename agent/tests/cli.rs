//! The `ironlet` command line end to end, with real containers: images, `ctr run` exit
//! codes and limits, ps/logs/exec/rm, `-p` publishing as root (CNI portmap), `images prune` (kept containers' and pinned images
//! stay), and a rootless run as an unprivileged user the test
//! creates. Needs root (CI runs as root); skips otherwise.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::rootless::StopOnDrop;
use support::{answer_at, host_address};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The test images, built once.
fn images_out() -> PathBuf {
    ironlet_runtime::testkit::test_images().expect("images/build produces the test images")
}

/// A data root of its own, with busybox imported.
struct Node {
    root: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let node = Self { root };
        let out = node.ironlet(&[
            "images",
            "import",
            &images_out().join("busybox").to_string_lossy(),
        ]);
        assert!(out.status.success(), "import failed: {}", text(&out.stderr));
        node
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ironlet"));
        cmd.arg("--root-dir").arg(self.root.path()).args(args);
        cmd
    }

    fn ironlet(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("ironlet runs")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Remove whatever containers a failed test left, so no mount outlives the temp dir.
        let ids = self.ironlet(&["ctr", "ps", "-a", "-q"]);
        for id in text(&ids.stdout).lines() {
            let _ = self.ironlet(&["ctr", "rm", "-f", id]);
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn images_import_list_and_remove_with_docker_style_references() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let ls = node.ironlet(&["images", "ls"]);
    assert!(ls.status.success());
    assert!(
        text(&ls.stdout).contains("docker.io/library/busybox"),
        "{}",
        text(&ls.stdout)
    );
    let rm = node.ironlet(&["images", "rm", "busybox:latest"]);
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    let ls = node.ironlet(&["images", "ls", "-q"]);
    assert_eq!(text(&ls.stdout).trim(), "", "image still listed");
    let again = node.ironlet(&["images", "rm", "busybox"]);
    assert!(
        !again.status.success(),
        "removing a missing image must fail"
    );
    assert!(
        text(&again.stderr).contains("busybox"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn conflicting_pull_and_image_gc_settings_stop_the_start_with_kubelet_s_message() {
    let root = tempfile::tempdir().expect("temp dir");
    let manifests = root.path().join("manifests");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ironlet"))
            .arg("--root-dir")
            .arg(root.path())
            .arg("run")
            .arg("--pod-manifest-path")
            .arg(&manifests)
            .args(extra)
            .output()
            .expect("ironlet runs");
        assert!(!out.status.success(), "{extra:?} was accepted");
        text(&out.stderr)
    };
    let err = run(&[
        "--serialize-image-pulls=true",
        "--max-parallel-image-pulls=2",
    ]);
    assert!(
        err.contains("maxParallelImagePulls (--max-parallel-image-pulls) 2 must be 1 or nil when serializeImagePulls (--serialize-image-pulls) is true"),
        "{err}"
    );
    let err = run(&[
        "--image-gc-high-threshold=70",
        "--image-gc-low-threshold=80",
    ]);
    assert!(
        err.contains("must be less than imageGCHighThresholdPercent"),
        "{err}"
    );
    assert!(
        !root.path().join("ironlet.sock").exists(),
        "nothing started"
    );
}

/// Runs `ironlet ARGS` on `node` with a stdout whose reader is already gone, as in
/// `ironlet images ls | head -0` or `| grep -q` after its first match.
fn into_closed_pipe(node: &Node, args: &[&str]) -> Output {
    let (reader, writer) = nix::unistd::pipe().expect("pipe");
    drop(reader);
    node.cmd(args)
        .stdout(writer)
        .output()
        .expect("ironlet runs")
}

#[test]
fn every_listing_exits_quietly_with_status_zero_when_its_reader_closes_early() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let run = node.ironlet(&["ctr", "run", "--name", "epipe", "busybox", "--", "true"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    for args in [
        &["images", "ls"][..],
        &["images", "ls", "-q"],
        &["ctr", "ps", "-a"],
        &["ctr", "ps", "-a", "-q"],
    ] {
        let out = into_closed_pipe(&node, args);
        assert_eq!(
            text(&out.stderr),
            "",
            "{args:?}: nothing on stderr (no panic, no backtrace)"
        );
        assert_eq!(out.status.code(), Some(0), "{args:?}");
    }
    // A reader that reads the first line, then goes (`| head -1`), with more to come.
    let mut child = node
        .cmd(&["images", "ls"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ironlet runs");
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().expect("stdout"), &mut first)
        .expect("a first byte");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ironlet ends");
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn ctr_run_streams_output_and_exits_with_the_container_exit_code() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let ok = node.ironlet(&[
        "ctr",
        "run",
        "--name",
        "hello",
        "busybox",
        "--",
        "echo",
        "hello world",
    ]);
    assert_eq!(
        text(&ok.stdout),
        "hello world\n",
        "stderr: {}",
        text(&ok.stderr)
    );
    assert_eq!(ok.status.code(), Some(0));
    let bad = node.ironlet(&[
        "ctr",
        "run",
        "--name",
        "five",
        "busybox",
        "--",
        "sh",
        "-c",
        "echo oops >&2; exit 5",
    ]);
    assert_eq!(bad.status.code(), Some(5));
    assert_eq!(text(&bad.stderr).trim_end().lines().next(), Some("oops"));

    let ps = node.ironlet(&["ctr", "ps", "-a"]);
    let listing = text(&ps.stdout);
    assert!(
        listing.contains("hello") && listing.contains("Exited(0)"),
        "{listing}"
    );
    assert!(
        listing.contains("five") && listing.contains("Exited(5)"),
        "{listing}"
    );
    let running = node.ironlet(&["ctr", "ps"]);
    assert!(
        !text(&running.stdout).contains("hello"),
        "exited container listed as running"
    );

    let logs = node.ironlet(&["ctr", "logs", "five"]);
    assert_eq!(text(&logs.stderr), "oops\n");
    let rm = node.ironlet(&["ctr", "rm", "hello", "five"]);
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    let ps = node.ironlet(&["ctr", "ps", "-a", "-q"]);
    assert_eq!(text(&ps.stdout).trim(), "");
}

#[test]
fn ctr_run_with_a_memory_limit_reports_an_oom_kill() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let out = node.ironlet(&[
        "ctr",
        "run",
        "--rm",
        "--memory",
        "16m",
        "busybox",
        "--",
        "tail",
        "/dev/zero",
    ]);
    assert_eq!(
        out.status.code(),
        Some(137),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("OOMKilled"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn ctr_exec_and_rm_work_on_a_container_run_by_another_process() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let mut run = node
        .cmd(&[
            "ctr", "run", "--name", "long", "busybox", "--", "sleep", "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ctr run starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ps = node.ironlet(&["ctr", "ps"]);
        if text(&ps.stdout).contains("long") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "container never showed as running"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let exec = node.ironlet(&[
        "ctr",
        "exec",
        "long",
        "--",
        "sh",
        "-c",
        "echo inside; exit 3",
    ]);
    assert_eq!(
        text(&exec.stdout),
        "inside\n",
        "stderr: {}",
        text(&exec.stderr)
    );
    assert_eq!(exec.status.code(), Some(3));
    let refused = node.ironlet(&["ctr", "rm", "long"]);
    assert!(
        !refused.status.success(),
        "rm of a running container without -f must fail"
    );
    let rm = node.ironlet(&["ctr", "rm", "-f", "long"]);
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    let status = run.wait().expect("ctr run exits");
    assert_eq!(status.code(), Some(137), "the killed container's code");
}

/// Creates (once) an unprivileged user with a subordinate id range.
fn rootless_user() -> Option<(String, u32)> {
    let name = "ironlet-rootless";
    if Command::new("id").arg(name).output().ok()?.status.success() {
    } else {
        let made = Command::new("useradd")
            .args(["--create-home", "--shell", "/bin/sh", name])
            .status()
            .ok()?;
        if !made.success() {
            return None;
        }
    }
    let uid = text(&Command::new("id").args(["-u", name]).output().ok()?.stdout)
        .trim()
        .parse()
        .ok()?;
    Some((name.to_owned(), uid))
}

/// A work directory the unprivileged user owns, with a copy of the binary and of busybox
/// (imported into `<work>/root`), and a way to run the binary as that user.
struct Rootless {
    user: String,
    uid: u32,
    work: tempfile::TempDir,
}

impl Rootless {
    fn new() -> Self {
        let Some((user, uid)) = rootless_user() else {
            panic!("could not create the unprivileged test user");
        };
        let work = tempfile::tempdir().expect("temp dir");
        let work_path = work.path();
        std::fs::set_permissions(
            work_path,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::fs::copy(env!("CARGO_BIN_EXE_ironlet"), work_path.join("ironlet"))
            .expect("copy binary");
        let cp = Command::new("cp")
            .arg("-a")
            .arg(images_out().join("busybox"))
            .arg(work_path.join("busybox"))
            .status()
            .unwrap();
        assert!(cp.success());
        let chown = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{uid}"))
            .arg(work_path)
            .status()
            .unwrap();
        assert!(chown.success());
        Self { user, uid, work }
    }

    /// `ironlet --root-dir <work>/root ARGS` as the user.
    fn cmd(&self, args: &[&str]) -> Command {
        let work = self.work.path();
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid",
            &self.uid.to_string(),
            "--regid",
            &self.uid.to_string(),
            "--init-groups",
            "--",
        ])
        .arg(work.join("ironlet"))
        .arg("--root-dir")
        .arg(work.join("root"))
        .args(args)
        .env("HOME", work)
        .env_remove("XDG_RUNTIME_DIR");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("setpriv runs")
    }

    fn import_busybox(&self) {
        let layout = self.work.path().join("busybox");
        let import = self.run(&["images", "import", &layout.to_string_lossy()]);
        assert!(
            import.status.success(),
            "rootless import: {}",
            text(&import.stderr)
        );
    }
}

#[test]
fn a_rootless_container_runs_as_an_unprivileged_user() {
    if !is_root() {
        return;
    }
    let rootless = Rootless::new();
    let (user, uid) = (&rootless.user, rootless.uid);
    let as_user = |args: &[&str]| rootless.run(args);
    rootless.import_busybox();
    let run = as_user(&[
        "ctr",
        "run",
        "--rm",
        "busybox",
        "--",
        "sh",
        "-c",
        "echo rootless-ok; id -u; cat /proc/self/uid_map",
    ]);
    let out = text(&run.stdout);
    assert!(
        run.status.success(),
        "rootless run failed ({user}): {}",
        text(&run.stderr)
    );
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"rootless-ok"), "{out}");
    assert_eq!(
        lines.get(1),
        Some(&"0"),
        "root inside the user namespace: {out}"
    );
    let map: Vec<_> = lines
        .get(2)
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(
        map.get(1).copied(),
        Some(uid.to_string().as_str()),
        "uid 0 maps to the user: {out}"
    );
    assert!(
        text(&run.stderr).contains("NOT enforced"),
        "the missing-limits warning: {}",
        text(&run.stderr)
    );
    // `--rm` leaves nothing under the user's root, logs included (`<root>/logs`).
    let root = rootless.work.path().join("root");
    ctr_run_rm_leaves_nothing(&root, &root.join("logs"), "rootless-rm", 20, as_user);
}

/// Every path under `root` but the image store, relative to it.
fn state_tree(root: &std::path::Path) -> std::collections::BTreeSet<PathBuf> {
    fn walk(
        dir: &std::path::Path,
        root: &std::path::Path,
        out: &mut std::collections::BTreeSet<PathBuf>,
    ) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap_or(&path).to_owned();
            if rel.starts_with("images") {
                continue;
            }
            out.insert(rel);
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&path, root, out);
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// The `ctr run` log directories of containers named `name` under `log_root`.
fn ctr_log_dirs(log_root: &std::path::Path, name: &str) -> Vec<String> {
    std::fs::read_dir(log_root)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("ironlet-ctr_{name}_")))
                .collect()
        })
        .unwrap_or_default()
}

/// What of a `ctr run` on root directory `root` runs or is mounted: processes whose command
/// line names `root` (the zygote, a rootless pod's namespace holder and pasta, which hold the
/// pod's network namespace, are forks of `ironlet --root-dir ROOT`, or are told paths under
/// it) and host mounts under it (a root sandbox pins its namespaces there).
fn leftovers(root: &std::path::Path) -> Vec<String> {
    let root = root.to_string_lossy().into_owned();
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.parse::<u32>().is_err() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&root) {
            left.push(format!("process {name}: {cmdline}"));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&root))
            .map(|l| format!("mount: {l}")),
    );
    left
}

/// Runs `ctr run --rm` `runs` times with `run` and checks that nothing of the containers
/// is left: no log directory, no container, sandbox, exit or libcontainer state, and, as
/// soon as each run has exited, no process (so no namespace: a rootless pod's network
/// namespace lives as long as its holder and pasta) and no mount.
fn ctr_run_rm_leaves_nothing(
    root: &std::path::Path,
    log_root: &std::path::Path,
    name: &str,
    runs: usize,
    run: impl Fn(&[&str]) -> Output,
) {
    let args = [
        "ctr", "run", "--rm", "--name", name, "busybox", "--", "echo", "hi",
    ];
    let first = run(&args);
    assert_eq!(text(&first.stdout), "hi\n", "{}", text(&first.stderr));
    let before = state_tree(root);
    for dir in ["containers", "sandboxes", "exits", "libcontainer"] {
        let left: Vec<_> = before
            .iter()
            .filter(|p| p.starts_with(dir) && p.as_path() != std::path::Path::new(dir))
            .collect();
        assert!(left.is_empty(), "--rm left state behind: {left:?}");
    }
    assert_eq!(
        ctr_log_dirs(log_root, name),
        Vec::<String>::new(),
        "--rm left its log directory"
    );
    assert_eq!(leftovers(root), Vec::<String>::new(), "left by --rm");
    for _ in 0..runs {
        let out = run(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(leftovers(root), Vec::<String>::new(), "left by --rm");
    }
    assert_eq!(
        ctr_log_dirs(log_root, name),
        Vec::<String>::new(),
        "--rm left log directories"
    );
    assert_eq!(
        state_tree(root),
        before,
        "--rm left state under the root directory"
    );
}

#[test]
fn ctr_run_rm_cleans_up_and_does_not_panic_when_the_reader_of_its_log_output_goes_away() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let name = format!("epipe-{}", std::process::id());
    let parent = format!("/ironlet-test-epipe-{}", std::process::id());
    let mut cmd = node.cmd(&[
        "ctr",
        "run",
        "--rm",
        "--name",
        &name,
        "--cgroup-parent",
        &parent,
        "busybox",
        "--",
        "true",
    ]);
    // Debug logs into a pipe whose reader is gone before the first line.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = cmd
        .env("IRONLET_LOG", "debug")
        .stderr(writer)
        .output()
        .expect("run ironlet");
    // The zygote's workers still die by SIGPIPE when they log into the closed pipe, so the
    // run itself may fail (status 1); it must not panic (101) nor leave anything behind.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "exit {:?}",
        out.status
    );
    for dir in ["containers", "sandboxes", "libcontainer"] {
        let left: Vec<_> = std::fs::read_dir(node.root.path().join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{dir} left: {left:?}");
    }
    assert_eq!(
        ctr_log_dirs(std::path::Path::new("/var/log/pods"), &name),
        Vec::<String>::new(),
        "the log directory was left"
    );
    // Nor the container's cgroup, made before its worker died (then the parent goes too).
    let parents = cgroup_dirs_of(&parent);
    let left: Vec<_> = parents
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect();
    for dir in &parents {
        let _ = std::fs::remove_dir(dir);
    }
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

/// The directories of cgroup `path` in every mounted hierarchy (v1 controllers or v2).
fn cgroup_dirs_of(path: &str) -> Vec<std::path::PathBuf> {
    let relative = path.trim_start_matches('/');
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .chain(std::iter::once(std::path::PathBuf::from("/sys/fs/cgroup")))
        .map(|mount| mount.join(relative))
        .filter(|dir| dir.is_dir())
        .collect()
}

/// The directory a node was started from may be removed while it runs (a test's temp dir,
/// a release directory replaced by an upgrade): containers are still created. libcontainer
/// used to fail with "failed to get cwd" there.
#[test]
fn ctr_run_works_when_the_directory_it_was_started_from_is_gone() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let gone = tempfile::tempdir().expect("temp dir");
    let cwd = gone.path().join("cwd");
    let name = format!("nocwd-{}", std::process::id());
    // The shell enters the directory, removes it, then becomes ironlet there.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"mkdir "$0" && cd "$0" && rmdir "$0" && exec "$@""#)
        .arg(&cwd)
        .arg(env!("CARGO_BIN_EXE_ironlet"))
        .arg("--root-dir")
        .arg(node.root.path())
        .args([
            "ctr", "run", "--rm", "--name", &name, "busybox", "--", "echo", "hi",
        ])
        .output()
        .expect("sh runs");
    assert!(!cwd.exists(), "the shell did not remove its directory");
    assert_eq!(text(&out.stdout), "hi\n", "{}", text(&out.stderr));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn ctr_run_rm_removes_everything_the_container_had_as_root() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let name = format!("rm-{}", std::process::id());
    ctr_run_rm_leaves_nothing(
        node.root.path(),
        std::path::Path::new("/var/log/pods"),
        &name,
        20,
        |args| node.ironlet(args),
    );
    // A run that fails after its sandbox was made leaves nothing either.
    let failed = node.ironlet(&[
        "ctr",
        "run",
        "--rm",
        "--name",
        &name,
        "busybox",
        "--",
        "/no/such/binary",
    ]);
    assert_eq!(failed.status.code(), Some(1));
    assert_eq!(
        ctr_log_dirs(std::path::Path::new("/var/log/pods"), &name),
        Vec::<String>::new()
    );
}

#[test]
fn bad_input_gets_a_clear_error_and_leaves_nothing_behind() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let missing = node.ironlet(&["ctr", "run", "no-such-image:1", "--", "true"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("no-such-image"),
        "{}",
        text(&missing.stderr)
    );
    let no_binary = node.ironlet(&["ctr", "run", "busybox", "--", "/no/such/binary"]);
    assert_eq!(no_binary.status.code(), Some(1));
    assert!(
        text(&no_binary.stderr).contains("/no/such/binary"),
        "{}",
        text(&no_binary.stderr)
    );
    let garbage = node.root.path().join("garbage.tar");
    std::fs::write(&garbage, b"not a tar").unwrap();
    let import = node.ironlet(&["images", "import", &garbage.to_string_lossy()]);
    assert_eq!(import.status.code(), Some(1));
    assert!(
        text(&import.stderr).contains("garbage.tar"),
        "{}",
        text(&import.stderr)
    );
    // Nothing half-made: no container record, directory, or mount.
    let ps = node.ironlet(&["ctr", "ps", "-a", "-q"]);
    assert_eq!(text(&ps.stdout).trim(), "");
    let dirs = std::fs::read_dir(node.root.path().join("containers"))
        .unwrap()
        .count();
    assert_eq!(dirs, 0, "a failed create left a container directory");
    let sandboxes = std::fs::read_dir(node.root.path().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(sandboxes, 0, "a failed run left its sandbox");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*node.root.path().to_string_lossy()),
        "a mount under the root is left"
    );
}

/// The rootless agent's pods (`ironlet pods -o json` as the user).
fn rootless_pods(rootless: &Rootless) -> Vec<k8s_openapi::api::core::v1::Pod> {
    let out = rootless.run(&["pods", "-A", "-o", "json"]);
    serde_json::from_slice::<k8s_openapi::List<k8s_openapi::api::core::v1::Pod>>(&out.stdout)
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Ready condition True and every container ready and started.
fn fully_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    ready
        && !containers.is_empty()
        && containers
            .iter()
            .all(|c| c.ready && c.started == Some(true))
}

#[test]
fn a_rootless_static_pod_becomes_ready_within_seconds_and_stays_ready() {
    if !is_root() {
        return;
    }
    let rootless = Rootless::new();
    rootless.import_busybox();
    let manifests = rootless.work.path().join("manifests");
    std::fs::create_dir(&manifests).expect("manifest dir");
    let log_path = rootless.work.path().join("agent.log");
    let log = std::fs::File::create(&log_path).expect("agent log");
    let agent = rootless
        .cmd(&[
            "run",
            "--pod-manifest-path",
            &manifests.to_string_lossy(),
            "--node-name",
            "rootless-node",
            "--file-check-frequency",
            "1s",
            // kubelet's disk thresholds may hold on the shared CI disk (DiskPressure).
            "--eviction-hard=memory.available<100Mi",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .spawn()
        .expect("rootless agent starts");
    let _agent = StopOnDrop {
        agent,
        manifests: manifests.clone(),
    };
    let agent_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let wait = |what: &str,
                timeout: Duration,
                check: &dyn Fn(&[k8s_openapi::api::core::v1::Pod]) -> bool| {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if check(&rootless_pods(&rootless)) {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting for {what}; agent log:\n{}", agent_log());
    };
    wait("the agent answers", Duration::from_secs(20), &|_| {
        rootless.run(&["pods", "-A", "-o", "json"]).status.success()
    });
    let manifest = manifests.join("web.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: busybox
    command: [sleep, "3600"]
"#,
    )
    .expect("manifest");
    let took = wait("the rootless pod Ready", Duration::from_secs(20), &|pods| {
        pods.iter().any(fully_ready)
    });
    // "Within a few seconds" of the manifest appearing (the file source looks every 1 s).
    assert!(took < Duration::from_secs(8), "Ready after {took:?}");
    let steady = Instant::now();
    while steady.elapsed() < Duration::from_secs(3) {
        let pods = rootless_pods(&rootless);
        assert!(
            pods.len() == 1 && fully_ready(&pods[0]),
            "the pod stays ready: {}",
            serde_json::to_string_pretty(&pods).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("rootless static pod Ready {took:?} after its manifest was written");

    std::fs::remove_file(&manifest).expect("remove manifest");
    wait("the pod removed", Duration::from_secs(30), &|pods| {
        pods.is_empty()
    });
}

/// Waits for `child` up to `limit`; kills it and fails the test past that.
fn output_within(mut child: std::process::Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("killed child");
            panic!(
                "{what} still running after {limit:?}; stdout: {} stderr: {}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("child output")
}

/// Processes whose command line mentions `needle` (a test's own root directory).
fn processes_mentioning(needle: &std::path::Path) -> Vec<String> {
    let needle = needle.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = text(&cmdline).replace('\0', " ");
            cmdline
                .contains(&needle)
                .then(|| format!("{}: {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Cgroup directories named `id` under the `/ironlet` parent, in every v1 hierarchy or v2.
fn cgroups_of(id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for candidate in [
            hierarchy.path().join("ironlet").join(id),
            PathBuf::from("/sys/fs/cgroup/ironlet").join(id),
        ] {
            if candidate.exists() && !found.contains(&candidate) {
                found.push(candidate);
            }
        }
    }
    found
}

/// The docker-style flags of `ctr run`, checked inside the container (`run` runs `ironlet
/// --root-dir R ARGS` as root or as the unprivileged user; `user` is what `-u` asks and
/// `id` must then print).
fn ctr_run_flags_take_effect(
    run: impl Fn(&[&str], &[(&str, &str)]) -> Output,
    scratch: &std::path::Path,
    user: &str,
) {
    let ro = scratch.join("ro");
    let rw = scratch.join("rw");
    std::fs::write(ro.join("file"), "from-the-host\n").expect("ro file");
    let ro_volume = format!("{}:/data:ro", ro.display());
    let rw_volume = format!("{}:/out", rw.display());
    let out = run(
        &[
            "ctr",
            "run",
            "--rm",
            "-w",
            "/tmp",
            "-u",
            user,
            "-e",
            "FROM_HOST",
            "-e",
            "SET=x=y",
            "-e",
            "NOT_ON_HOST",
            "-v",
            &ro_volume,
            "--volume",
            &rw_volume,
            "busybox",
            "--",
            "sh",
            "-c",
            "pwd; id -u; id -g; echo \"$FROM_HOST $SET ${NOT_ON_HOST-unset}\"; cat /data/file; \
             touch /data/new 2>/dev/null && echo ro-written || echo ro-refused; \
             echo inside > /out/made",
        ],
        &[("FROM_HOST", "host-value")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    assert_eq!(
        text(&out.stdout),
        format!("/tmp\n{uid}\n{gid}\nhost-value x=y unset\nfrom-the-host\nro-refused\n"),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(!ro.join("new").exists(), "the :ro volume was written");
    assert_eq!(
        std::fs::read_to_string(rw.join("made")).expect("written through the rw volume"),
        "inside\n"
    );
    // Bad volumes are refused before anything is made, naming the flag and the path.
    let missing = run(
        &[
            "ctr",
            "run",
            "--rm",
            "-v",
            "/no/such/dir:/data",
            "busybox",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing.stderr));
    assert!(
        text(&missing.stderr).contains("/no/such/dir does not exist"),
        "{}",
        text(&missing.stderr)
    );
    let relative = run(
        &[
            "ctr",
            "run",
            "--rm",
            "-v",
            &format!("{}:data", ro.display()),
            "busybox",
            "--",
            "true",
        ],
        &[],
    );
    assert!(
        text(&relative.stderr).contains("must be absolute"),
        "{}",
        text(&relative.stderr)
    );
}

/// `-d`, then `ctr ps`, `ctr logs -f` (returns when the container ends), `ctr stop`
/// (SIGTERM honoured; SIGKILL after `-t`), `ctr rm`: nothing is left under `root`, no log
/// directory under `log_root`, no process of the container or its monitor. Rootless,
/// `-d` warns that limits are not enforced, as a foreground run does.
fn ctr_run_detached_lifecycle(
    root: &std::path::Path,
    log_root: &std::path::Path,
    rootless: bool,
    cmd: impl Fn(&[&str]) -> Command,
) {
    let run = |args: &[&str]| cmd(args).output().expect("ironlet runs");
    // The runtime's directories exist once a container has run.
    let first = run(&["ctr", "run", "--rm", "busybox", "--", "true"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let before = state_tree(root);
    let started = Instant::now();
    let detached = run(&[
        "ctr",
        "run",
        "-d",
        "--name",
        "bg",
        "busybox",
        "--",
        "sh",
        "-c",
        "echo started; trap 'echo got-term; exit 7' TERM; while true; do sleep 0.1; done",
    ]);
    assert!(detached.status.success(), "{}", text(&detached.stderr));
    assert_eq!(
        text(&detached.stderr).contains("NOT enforced"),
        rootless,
        "{}",
        text(&detached.stderr)
    );
    let id = text(&detached.stdout).trim().to_owned();
    assert_eq!(id.len(), 32, "-d prints the container id: {id:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "-d returned after {:?}",
        started.elapsed()
    );
    let ps = run(&["ctr", "ps"]);
    assert!(
        text(&ps.stdout).contains(&id[..12]),
        "running in ctr ps: {}",
        text(&ps.stdout)
    );
    // A container that ignores SIGTERM (sleep as pid 1) is killed after -t.
    let stubborn = run(&[
        "ctr", "run", "-d", "--name", "stubborn", "busybox", "--", "sleep", "600",
    ]);
    assert!(stubborn.status.success(), "{}", text(&stubborn.stderr));

    let follow = cmd(&["ctr", "logs", "-f", &id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("logs -f starts");
    std::thread::sleep(Duration::from_millis(500));
    let stop_started = Instant::now();
    let stop = run(&["ctr", "stop", "-t", "10", "bg"]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    assert!(
        stop_started.elapsed() < Duration::from_secs(5),
        "SIGTERM was not used: {:?}",
        stop_started.elapsed()
    );
    let logs = output_within(follow, Duration::from_secs(10), "ctr logs -f");
    assert_eq!(
        text(&logs.stdout),
        "started\ngot-term\n",
        "{}",
        text(&logs.stderr)
    );
    let stop_started = Instant::now();
    let stop = run(&["ctr", "stop", "-t", "1", "stubborn"]);
    assert!(stop.status.success(), "{}", text(&stop.stderr));
    let took = stop_started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(8),
        "stop -t 1 took {took:?}"
    );

    let ps = text(&run(&["ctr", "ps", "-a"]).stdout);
    assert!(
        ps.contains("Exited(7)") && ps.contains("Exited(137)"),
        "{ps}"
    );
    let rm = run(&["ctr", "rm", "bg", "stubborn"]);
    assert!(rm.status.success(), "{}", text(&rm.stderr));

    // `-d --rm`: the monitor removes the container when it ends.
    let gone = run(&[
        "ctr", "run", "-d", "--rm", "--name", "bg-rm", "busybox", "--", "true",
    ]);
    assert!(gone.status.success(), "{}", text(&gone.stderr));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !processes_mentioning(root).is_empty() || state_tree(root) != before {
        assert!(
            Instant::now() < deadline,
            "left behind: processes {:?}, state {:?}",
            processes_mentioning(root),
            state_tree(root)
                .symmetric_difference(&before)
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for name in ["bg", "stubborn", "bg-rm"] {
        assert_eq!(
            ctr_log_dirs(log_root, name),
            Vec::<String>::new(),
            "log directory of {name}"
        );
    }
    for removed in [
        &id,
        text(&stubborn.stdout).trim(),
        text(&gone.stdout).trim(),
    ] {
        assert_eq!(removed.len(), 32, "-d prints the container id: {removed:?}");
        assert_eq!(
            cgroups_of(removed),
            Vec::<PathBuf>::new(),
            "cgroups of the removed container {removed}"
        );
    }
}

#[test]
fn ctr_run_docker_flags_take_effect_as_root() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let scratch = tempfile::tempdir().expect("scratch");
    for dir in ["ro", "rw"] {
        std::fs::create_dir(scratch.path().join(dir)).expect("volume dir");
    }
    // 1000 must be able to write the rw volume.
    let chown = Command::new("chown")
        .arg("1000:1000")
        .arg(scratch.path().join("rw"))
        .status()
        .expect("chown");
    assert!(chown.success());
    ctr_run_flags_take_effect(
        |args, env| {
            node.cmd(args)
                .envs(env.iter().copied())
                .output()
                .expect("ironlet runs")
        },
        scratch.path(),
        "1000:1000",
    );
}

#[test]
fn ctr_run_cpus_and_pids_limits_are_enforced_as_root() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let out = node.ironlet(&[
        "ctr", "run", "--rm", "--cpus", "1.5", "--pids", "8", "busybox", "--", "sh", "-c",
        "if [ -f /sys/fs/cgroup/cpu.max ]; then cat /sys/fs/cgroup/cpu.max; \
         else echo \"$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)\"; fi; \
         (for i in 1 2 3 4 5 6 7 8 9 10; do sleep 5 & echo ok; done) >/tmp/started 2>/dev/null; \
         n=0; while read -r _; do n=$((n+1)); done </tmp/started; echo $n",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&"150000 100000"),
        "--cpus 1.5 as a CFS quota: {stdout}"
    );
    // The shell and the subshell count too: at most 6 sleeps fit in 8 pids. The count is
    // taken with builtins only, since the outer shell cannot fork while the sleeps hold pids.
    let started: usize = lines
        .get(1)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{stdout} {}", text(&out.stderr)));
    assert!(
        (1..=6).contains(&started),
        "--pids 8 let {started} of 10 processes start"
    );
}

#[test]
fn ctr_run_detached_then_logs_stop_rm_leaves_nothing_as_root() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    ctr_run_detached_lifecycle(
        node.root.path(),
        std::path::Path::new("/var/log/pods"),
        false,
        |args| node.cmd(args),
    );
}

#[test]
fn ctr_run_docker_flags_and_detach_work_rootless() {
    if !is_root() {
        return;
    }
    let rootless = Rootless::new();
    rootless.import_busybox();
    let scratch = rootless.work.path().join("volumes");
    for dir in ["", "ro", "rw"] {
        std::fs::create_dir(scratch.join(dir)).expect("volume dir");
    }
    let chown = Command::new("chown")
        .arg("-R")
        .arg(format!("{0}:{0}", rootless.uid))
        .arg(&scratch)
        .status()
        .expect("chown");
    assert!(chown.success());
    // Only the user's own uid is mapped (to 0): that is the id -u can ask for.
    ctr_run_flags_take_effect(
        |args, env| {
            rootless
                .cmd(args)
                .envs(env.iter().copied())
                .output()
                .expect("setpriv runs")
        },
        &scratch,
        "0:0",
    );
    let root = rootless.work.path().join("root");
    ctr_run_detached_lifecycle(&root, &root.join("logs"), true, |args| rootless.cmd(args));
}

#[test]
fn images_prune_keeps_images_of_kept_containers_and_pinned_ones_and_removes_the_rest() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    for name in ["layered", "nonroot"] {
        let out = node.ironlet(&[
            "images",
            "import",
            &images_out().join(name).to_string_lossy(),
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // An exited container that is not removed still uses busybox.
    let run = node.ironlet(&["ctr", "run", "--name", "kept", "busybox", "--", "true"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let pin = node.ironlet(&["images", "pin", "nonroot:latest"]);
    assert!(pin.status.success(), "{}", text(&pin.stderr));
    let tags = |node: &Node| -> Vec<String> {
        let ls = node.ironlet(&["images", "ls"]);
        let mut tags: Vec<String> = text(&ls.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect();
        tags.sort();
        tags
    };
    let blobs = || {
        std::fs::read_dir(node.root.path().join("images/blobs/sha256"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    // layered is on the pinned list: nothing goes.
    let prune = node.ironlet(&["images", "prune", "--pinned-images", "layered"]);
    assert!(prune.status.success(), "{}", text(&prune.stderr));
    assert!(
        !text(&prune.stdout).contains("Deleted"),
        "{}",
        text(&prune.stdout)
    );
    assert_eq!(tags(&node).len(), 3);
    let before = blobs();
    let prune = node.ironlet(&["images", "prune"]);
    assert!(prune.status.success(), "{}", text(&prune.stderr));
    let out = text(&prune.stdout);
    assert!(out.contains("docker.io/library/layered:latest"), "{out}");
    assert_eq!(out.matches("Deleted: sha256:").count(), 1, "{out}");
    assert!(out.contains("Total reclaimed space: "), "{out}");
    assert_eq!(
        tags(&node),
        ["docker.io/library/busybox", "docker.io/library/nonroot"]
    );
    assert!(blobs() < before, "layered's blobs were collected");
    // Once its container is removed, busybox goes too; the pinned image stays.
    let rm = node.ironlet(&["ctr", "rm", "kept"]);
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    let prune = node.ironlet(&["images", "prune"]);
    assert!(prune.status.success(), "{}", text(&prune.stderr));
    assert!(
        text(&prune.stdout).contains("busybox"),
        "{}",
        text(&prune.stdout)
    );
    assert_eq!(tags(&node), ["docker.io/library/nonroot"]);
}

/// Waits until `stty size` inside the shell on `term` reports `want` (a resize travels
/// through a SIGWINCH handler, so it may take a moment).
fn shell_reports_size(term: &mut ironlet_runtime::testkit::pty::PtyChild, want: &str) {
    let wait = Duration::from_secs(10);
    for round in 0..50 {
        term.send(&format!("stty size; echo sz-$(({round}+500))\r"))
            .expect("typing");
        let shown = term
            .expect(&format!("sz-{}\r\n", round + 500), wait)
            .expect("stty answers");
        if shown.contains(&format!("{want}\r\n")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the shell never reported {want}: {}", term.seen());
}

fn is_raw(term: &ironlet_runtime::testkit::pty::PtyChild) -> bool {
    !term
        .local_flags()
        .expect("terminal settings")
        .contains(nix::sys::termios::LocalFlags::ICANON)
}

/// `ctr run -it` and `ctr exec -it` on a terminal as a person would type: the prompt
/// appears, commands answer, the local size and a resize reach the container, the exit
/// codes come back, the terminal is restored, and `--rm` leaves no container.
#[test]
fn ctr_run_it_and_ctr_exec_it_drive_a_shell_on_a_terminal() {
    use ironlet_runtime::testkit::pty::PtyChild;
    if !is_root() {
        return;
    }
    let node = Node::new();
    let wait = Duration::from_secs(20);
    let run = node.cmd(&[
        "ctr", "run", "-it", "--rm", "--name", "ttyrun", "busybox", "--", "sh",
    ]);
    let mut term = PtyChild::spawn(run, 100, 30).expect("ctr run on a pty");
    term.expect("/ # ", wait).expect("a prompt");
    assert!(is_raw(&term), "ctr run -t leaves the terminal cooked");
    term.send("echo run-$((6*7))\r").expect("typing");
    term.expect("run-42\r\n", wait)
        .expect("the command's output");
    shell_reports_size(&mut term, "30 100");
    term.resize(77, 22).expect("resize");
    shell_reports_size(&mut term, "22 77");

    let ps = node.ironlet(&["ctr", "ps", "-q"]);
    let id = text(&ps.stdout).trim().to_owned();
    assert!(!id.is_empty() && !id.contains('\n'), "ps: {id:?}");
    let exec = node.cmd(&["ctr", "exec", "-it", &id, "--", "sh"]);
    let mut shell = PtyChild::spawn(exec, 90, 25).expect("ctr exec on a pty");
    shell.expect("/ # ", wait).expect("an exec prompt");
    shell
        .send("echo exec-$((2+3)); [ -t 0 ] && echo tty-$((1+1))\r")
        .expect("typing");
    shell.expect("exec-5\r\n", wait).expect("the exec's output");
    shell
        .expect("tty-2\r\n", wait)
        .expect("the exec runs on a terminal");
    // The exec's terminal is one of the container's own ptys, with a name inside it.
    shell
        .send("[ -c \"$(tty)\" ] && echo named-$((3+4)) $(tty)\r")
        .expect("typing");
    shell
        .expect("named-7 /dev/pts/", wait)
        .expect("the exec's terminal exists in the container's /dev/pts");
    shell_reports_size(&mut shell, "25 90");
    shell.send("exit 4\r").expect("typing");
    let status = shell.wait(wait).expect("wait").expect("ctr exec ends");
    assert_eq!(status.code(), Some(4), "{}", shell.seen());
    assert!(!is_raw(&shell), "ctr exec -t did not restore the terminal");

    term.send("exit 3\r").expect("typing");
    let status = term.wait(wait).expect("wait").expect("ctr run ends");
    assert_eq!(status.code(), Some(3), "{}", term.seen());
    assert!(!is_raw(&term), "ctr run -t did not restore the terminal");
    let ps = node.ironlet(&["ctr", "ps", "-a", "-q"]);
    assert_eq!(text(&ps.stdout).trim(), "", "--rm left a container");
}

/// `ctr run -i` without a terminal: stdin reaches the container, whose stdin closes with
/// ours (`cat` ends), and the exit code comes back.
#[test]
fn ctr_run_i_feeds_stdin_until_it_closes() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let mut child = node
        .cmd(&[
            "ctr",
            "run",
            "-i",
            "--rm",
            "--name",
            "cat",
            "busybox",
            "--",
            "sh",
            "-c",
            "cat; exit 6",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ctr run -i");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(b"line one\nline two\n")
            .expect("writing stdin");
    }
    let out = output_within(child, Duration::from_secs(30), "ctr run -i");
    assert_eq!(
        text(&out.stdout),
        "line one\nline two\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(6));
    let ps = node.ironlet(&["ctr", "ps", "-a", "-q"]);
    assert_eq!(text(&ps.stdout).trim(), "");
}

/// The nat table's rules (`iptables-save -t nat`).
fn nat_rules() -> String {
    let out = Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .expect("iptables-save");
    text(&out.stdout)
}

/// host-local's `dataDir` in the default network `ctr run -p` uses: the one in
/// `/etc/cni/net.d/99-ironlet.conflist`, written by whichever ironlet found the file missing
/// (its root directory's `cni/networks`: on a machine where a test's agent wrote it first,
/// that test's temporary root, not `/var/lib/ironlet`).
fn ipam_data_dir() -> PathBuf {
    let conflist = std::fs::read("/etc/cni/net.d/99-ironlet.conflist").expect("the conflist");
    let conflist: serde_json::Value = serde_json::from_slice(&conflist).expect("JSON");
    let dir = conflist["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|plugin| plugin["ipam"]["dataDir"].as_str())
        .unwrap_or("/var/lib/cni/networks");
    PathBuf::from(dir)
}

#[test]
fn ctr_run_p_publishes_a_port_as_root_and_rm_leaves_no_rule_address_or_namespace() {
    if !is_root() {
        return;
    }
    let node = Node::new();
    let name = format!("publish-{}", std::process::id());
    let host_port = {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let publish = format!("{host_port}:8080");
    let run = node.ironlet(&[
        "ctr",
        "run",
        "-d",
        "--name",
        &name,
        "-p",
        &publish,
        "busybox",
        "--",
        "sh",
        "-c",
        "ip -4 -o addr show eth0; while true; do echo answer from the container | nc -l -p 8080; done",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let host = host_address();
    let got = answer_at(&host, host_port, Duration::from_secs(20));
    let logs = node.ironlet(&["ctr", "logs", &name]);
    let logs = text(&logs.stdout);
    assert_eq!(
        got.as_deref(),
        Some("answer from the container\n"),
        "{host}:{host_port} reaches the container's port 8080; its log: {logs}"
    );
    // The container's address from the bridge network, and the DNAT rule for the port.
    let ip = logs
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .unwrap_or_default()
        .to_owned();
    assert!(ip.starts_with("10.85."), "a bridge address: {logs}");
    let dport = format!("--dport {host_port} ");
    assert!(nat_rules().contains(&dport), "a DNAT rule for the port");
    let lease = ipam_data_dir().join("ironlet").join(&ip);
    assert!(lease.exists(), "host-local holds {}", lease.display());

    let rm = node.ironlet(&["ctr", "rm", "-f", &name]);
    assert!(rm.status.success(), "rm -f: {}", text(&rm.stderr));
    // Nothing left: no nat rule for the port or the address, no lease, no pinned namespace
    // or other mount under the root directory, no sandbox.
    let rules = nat_rules();
    assert!(!rules.contains(&dport), "the DNAT rule stayed:\n{rules}");
    assert!(
        !rules.contains(&format!("{ip}/32")) && !rules.contains(&format!("{ip}:8080")),
        "a rule for {ip} stayed:\n{rules}"
    );
    assert!(!lease.exists(), "the address lease stayed");
    let root = node.root.path().to_string_lossy().into_owned();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&root)).collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    let sandboxes: Vec<_> = std::fs::read_dir(node.root.path().join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(sandboxes.is_empty(), "sandboxes left: {sandboxes:?}");
    assert!(
        std::net::TcpStream::connect((host.as_str(), host_port)).is_err(),
        "the port is closed"
    );
}
