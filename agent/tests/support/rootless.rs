//! Rootless agents of the tests that run `ironlet run` as an unprivileged user.

use std::path::PathBuf;
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
