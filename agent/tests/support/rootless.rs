//! Unprivileged users made by the tests (with or without a subordinate id range), and
//! rootless agents of the tests that run `ironlet run` as such a user.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A rootless agent that, however the test ends, gets its manifests removed and a few
/// seconds to remove the pods before it is stopped (SIGTERM leaves containers running).
pub struct StopOnDrop {
    pub agent: std::process::Child,
    pub manifests: PathBuf,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let mut removed = false;
        for entry in std::fs::read_dir(&self.manifests)
            .into_iter()
            .flatten()
            .flatten()
        {
            removed |= std::fs::remove_file(entry.path()).is_ok();
        }
        if removed {
            std::thread::sleep(Duration::from_secs(5));
        }
        if let Ok(pid) = i32::try_from(self.agent.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.agent.wait();
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The first subordinate id of the test users' range: above what `useradd` hands out by
/// default (100000 + 65536 per user), distinct per test process.
pub fn range_start() -> u32 {
    400_000 + (std::process::id() % 512) * 65536
}

/// An unprivileged user made for one test (`useradd` without automatic subordinate ids, then
/// exactly the range asked for), removed with its home and ranges on drop.
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub range: Option<(u32, u32)>,
    pub work: tempfile::TempDir,
    /// A cgroup v2 directory delegated to the user (`rootless_cgroup2.rs`): each command
    /// starts in it, as in a shell of a `systemd-run --user --scope -p Delegate=yes`.
    pub scope: Option<PathBuf>,
}

/// Moves the shell into the delegated cgroup `$1` (or, once an ironlet made `$1` an interior
/// cgroup, into the leaf it moved the scope's processes to), then runs the rest.
const IN_SCOPE: &str = r#"echo 0 2>/dev/null > "$1/cgroup.procs" || echo 0 > "$1/ironlet-agent/cgroup.procs" || exit 125
shift
exec "$@""#;

impl TestUser {
    /// `range`: the subordinate uid and gid range `(start, count)`, or none.
    pub fn new(tag: &str, range: Option<(u32, u32)>) -> Self {
        let name = format!("irl-{tag}-{}", std::process::id());
        let made = Command::new("useradd")
            .args(["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0"])
            .args(["--create-home", "--shell", "/bin/sh", &name])
            .status()
            .expect("useradd runs");
        assert!(made.success(), "useradd {name}");
        // From here on the user is removed however the test ends.
        let uid = Command::new("id")
            .args(["-u", &name])
            .output()
            .ok()
            .and_then(|o| text(&o.stdout).trim().parse().ok());
        let work = tempfile::Builder::new()
            .prefix("ironlet-subid-")
            .tempdir()
            .expect("temp dir");
        let user = Self {
            name,
            uid: uid.unwrap_or(u32::MAX),
            range,
            work,
            scope: None,
        };
        assert_ne!(user.uid, u32::MAX, "uid of {}", user.name);
        if let Some((start, count)) = range {
            let ids = format!("{start}-{}", start + count - 1);
            let added = Command::new("usermod")
                .args(["--add-subuids", &ids, "--add-subgids", &ids, &user.name])
                .status()
                .expect("usermod runs");
            assert!(added.success(), "usermod --add-subuids {ids}");
        }
        let work = user.work.path();
        std::fs::set_permissions(work, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod work");
        std::fs::copy(env!("CARGO_BIN_EXE_ironlet"), work.join("ironlet")).expect("copy binary");
        let out = ironlet_runtime::testkit::test_images().expect("test images");
        for image in ["busybox", "nonroot", "layered"] {
            let cp = Command::new("cp")
                .arg("-a")
                .arg(out.join(image))
                .arg(work.join(image))
                .status()
                .expect("cp runs");
            assert!(cp.success(), "copy {image}");
        }
        let chown = Command::new("chown")
            .arg("-R")
            .arg(format!("{0}:{0}", user.uid))
            .arg(work)
            .status()
            .expect("chown runs");
        assert!(chown.success());
        user
    }

    pub fn root_dir(&self) -> PathBuf {
        self.work.path().join("root")
    }

    /// `ironlet --root-dir <work>/root ARGS` as the user.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let work = self.work.path();
        let mut cmd = match &self.scope {
            Some(scope) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", IN_SCOPE, "in-scope"])
                    .arg(scope)
                    .arg("setpriv");
                sh
            }
            None => Command::new("setpriv"),
        };
        cmd.args(["--reuid", &self.uid.to_string()])
            .args(["--regid", &self.uid.to_string(), "--init-groups", "--"])
            .arg(work.join("ironlet"))
            .arg("--root-dir")
            .arg(self.root_dir())
            .args(args)
            .env("HOME", work)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("IRONLET_LOG")
            .stdin(Stdio::null());
        cmd
    }

    /// `ironlet run` as the user on `<work>/manifests` (created) as node `node_name`,
    /// logging to `<work>/agent.log` (returned). The agent stops when dropped.
    pub fn start_agent(&self, node_name: &str) -> (StopOnDrop, PathBuf) {
        let manifests = self.work.path().join("manifests");
        std::fs::create_dir(&manifests).expect("manifest dir");
        let log_path = self.work.path().join("agent.log");
        let log = std::fs::File::create(&log_path).expect("agent log");
        let child = self
            .cmd(&[
                "run",
                "--manifests",
                &manifests.to_string_lossy(),
                "--node-name",
                node_name,
                "--file-check-frequency",
                "1s",
                // kubelet's disk thresholds may hold on the shared CI disk (DiskPressure).
                "--eviction-hard=memory.available<100Mi",
            ])
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("rootless agent starts");
        let agent = StopOnDrop {
            agent: child,
            manifests,
        };
        (agent, log_path)
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("setpriv runs")
    }

    pub fn import(&self, image: &str) {
        let layout = self.work.path().join(image);
        let out = self.run(&["images", "import", &layout.to_string_lossy()]);
        assert!(out.status.success(), "import: {}", text(&out.stderr));
    }

    /// `ctr run --rm IMAGE [FLAGS] -- sh -c SCRIPT`.
    pub fn sh(&self, image: &str, flags: &[&str], script: &str) -> Output {
        let mut args = vec!["ctr", "run", "--rm"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[image, "--", "sh", "-c", script]);
        self.run(&args)
    }

    /// What `--rm` must have left: no container directory, no libcontainer state.
    pub fn assert_no_containers(&self) {
        for dir in ["containers", "libcontainer"] {
            let left: Vec<_> = std::fs::read_dir(self.root_dir().join(dir))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert!(left.is_empty(), "{dir} left behind: {left:?}");
        }
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        // Processes of the user and of the ids the tests run as (left only by a failed
        // test), then the work dir (as root), then the user with its home and ranges.
        let mut uids = vec![self.uid];
        if let Some((start, _)) = self.range {
            uids.extend([start + 999, start + 1233]);
        }
        for uid in uids {
            let _ = Command::new("pkill")
                .args(["-KILL", "-U", &uid.to_string()])
                .status();
        }
        std::thread::sleep(Duration::from_millis(200));
        let _ = std::fs::remove_dir_all(self.work.path());
        let _ = Command::new("userdel")
            .args(["--remove", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}
