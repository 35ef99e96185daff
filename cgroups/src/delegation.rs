//! [`Delegation`]: may this process create and limit cgroups, and under which cgroup?
//!
//! Rules:
//!
//! * root (euid 0): everything, from the hierarchy root — if the cgroup mounts are writable (they
//!   are read-only in some containers; then the v2 rules below still apply).
//! * unprivileged on v1 (or hybrid): never — v1 has no safe delegation.
//! * unprivileged on v2: the process's own cgroup (the `0::` line of `/proc/self/cgroup`) if we
//!   may write its directory, `cgroup.subtree_control` and `cgroup.procs` (systemd grants this
//!   with `Delegate=yes`, e.g. in `user@.service`).
//!
//!   A process already in the delegated cgroup's [`AGENT_LEAF`] (moved there by an earlier
//!   ironlet of the same scope) gets the delegated cgroup, not the leaf.
//!
//! The runtime prints one warning and runs without limits when the answer is `None`.
//!
//! [`Delegation::prepare`] is the rootless agent's entry: on v2 a cgroup that holds processes
//! may not enable controllers for its children ("no internal processes"), so every process of
//! the delegated cgroup (the agent, its zygote, the shell of the scope) moves into the leaf
//! [`AGENT_LEAF`] first; pods and containers then get cgroups beside it.

use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;

const PROC_SELF_CGROUP: &str = "/proc/self/cgroup";

/// The leaf of a delegated cgroup the rootless agent's processes move into.
pub const AGENT_LEAF: &str = "ironlet-agent";

/// How many passes [`Delegation::prepare`] makes over `cgroup.procs` (a process forked during
/// a pass shows up in the next).
const MOVE_PASSES: usize = 20;

/// Whether cgroups can be managed, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delegation {
    /// Cgroups may be created (and limits set) below `root`, relative to the hierarchy.
    Full {
        /// The delegated cgroup: `/` for root, the user's own cgroup when rootless.
        root: CgroupPath,
    },
    /// No cgroup management possible; containers run without resource limits.
    None {
        /// Why, in words for the warning the runtime prints.
        reason: String,
    },
}

impl Delegation {
    /// Detects delegation for this process. Never fails: an unreadable `/proc` is a `None`.
    #[must_use]
    pub fn detect(hierarchy: &Hierarchy) -> Self {
        let is_root = nix::unistd::geteuid().is_root();
        let own = std::fs::read_to_string(PROC_SELF_CGROUP)
            .ok()
            .and_then(|text| own_v2_cgroup(&text));
        let delegation = decide(hierarchy, is_root, own.as_ref(), &writable);
        tracing::debug!(?delegation, is_root, "cgroup delegation");
        delegation
    }

    /// Whether limits can be enforced.
    #[must_use]
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full { .. })
    }

    /// The delegated cgroup of this process, ready for child cgroups: detected once per process
    /// ([`Self::detect`]); rootless on v2, every process of the delegated cgroup is moved into
    /// its [`AGENT_LEAF`] first (see the module docs). A move that fails is a `None` naming why.
    pub fn prepare(hierarchy: &Hierarchy) -> Self {
        static PREPARED: std::sync::OnceLock<Delegation> = std::sync::OnceLock::new();
        PREPARED
            .get_or_init(|| {
                let delegation = Self::detect(hierarchy);
                let (Self::Full { root }, Hierarchy::V2 { root: mount }) = (&delegation, hierarchy)
                else {
                    return delegation;
                };
                if root.is_root() {
                    return delegation;
                }
                match move_into_leaf(&root.under(mount)) {
                    Ok(moved) => {
                        tracing::info!(cgroup = %root, moved, leaf = AGENT_LEAF,
                            "delegated cgroup v2 subtree: pods get cgroups and limits");
                        delegation
                    }
                    Err(err) => Self::None {
                        reason: format!(
                            "cgroup {root} is delegated but its processes could not move into \
                             {AGENT_LEAF}: {err}"
                        ),
                    },
                }
            })
            .clone()
    }
}

/// Moves every process of the cgroup at `dir` into its child [`AGENT_LEAF`] (made if missing);
/// returns how many moved. A process that exits meanwhile is skipped.
fn move_into_leaf(dir: &Path) -> crate::error::Result<usize> {
    let leaf = dir.join(AGENT_LEAF);
    if let Err(source) = std::fs::create_dir(&leaf) {
        if source.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(crate::error::Error::CreateDir { path: leaf, source });
        }
    }
    let procs = leaf.join("cgroup.procs");
    let mut moved = 0;
    for _ in 0..MOVE_PASSES {
        let pids = crate::fs::procs(dir)?;
        if pids.is_empty() {
            return Ok(moved);
        }
        for pid in pids {
            match crate::fs::write_raw(&procs, &pid.to_string()) {
                Ok(()) => moved += 1,
                Err(err) if err.raw_os_error() == Some(libc::ESRCH) => {}
                Err(source) => {
                    return Err(crate::error::Error::Write {
                        path: procs,
                        value: pid.to_string(),
                        source,
                    })
                }
            }
        }
    }
    Ok(moved)
}

/// Whether this process may write `path` (it must exist).
fn writable(path: &Path) -> bool {
    access(path, AccessFlags::W_OK).is_ok()
}

/// The detection rules with the environment passed in (unit-tested with fakes).
fn decide(
    hierarchy: &Hierarchy,
    is_root: bool,
    own: Option<&CgroupPath>,
    writable: &dyn Fn(&Path) -> bool,
) -> Delegation {
    match hierarchy {
        Hierarchy::V1 { mounts } => {
            if !is_root {
                return Delegation::None {
                    reason: "cgroup v1 cannot be delegated to unprivileged users; \
                             run as root or boot with cgroup v2"
                        .to_owned(),
                };
            }
            match mounts.values().find(|mount| !writable(mount)) {
                Some(mount) => Delegation::None {
                    reason: format!("cgroup v1 mount {} is not writable", mount.display()),
                },
                None => Delegation::Full {
                    root: CgroupPath::root(),
                },
            }
        }
        Hierarchy::V2 { root } => {
            if is_root && writable(root) && writable(&root.join("cgroup.subtree_control")) {
                return Delegation::Full {
                    root: CgroupPath::root(),
                };
            }
            let Some(own) = own else {
                return Delegation::None {
                    reason: format!("no cgroup v2 entry in {PROC_SELF_CGROUP}"),
                };
            };
            if let Some(parent) = leaf_parent(own) {
                if delegated(&parent.under(root), writable).is_ok() {
                    return Delegation::Full { root: parent };
                }
            }
            let dir = own.under(root);
            match delegated(&dir, writable) {
                Err(missing) => Delegation::None {
                    reason: format!(
                        "cgroup {own} is not delegated to this user ({} is not writable); \
                         start ironlet in a systemd unit or scope with Delegate=yes",
                        missing.display()
                    ),
                },
                Ok(()) => Delegation::Full { root: own.clone() },
            }
        }
    }
}

/// The delegated cgroup of a process in its [`AGENT_LEAF`].
fn leaf_parent(own: &CgroupPath) -> Option<CgroupPath> {
    let parent = own.as_str().strip_suffix(AGENT_LEAF)?.strip_suffix('/')?;
    CgroupPath::new(if parent.is_empty() { "/" } else { parent })
        .ok()
        .filter(|p| !p.is_root())
}

/// Whether the cgroup at `dir` is ours to manage: `Err` names the first file we may not write.
fn delegated(dir: &Path, writable: &dyn Fn(&Path) -> bool) -> Result<(), PathBuf> {
    let needed: [PathBuf; 3] = [
        dir.to_path_buf(),
        dir.join("cgroup.subtree_control"),
        dir.join("cgroup.procs"),
    ];
    match needed.into_iter().find(|p| !writable(p)) {
        Some(missing) => Err(missing),
        None => Ok(()),
    }
}

/// The path of the `0::<path>` line of `/proc/self/cgroup`.
fn own_v2_cgroup(proc_self_cgroup: &str) -> Option<CgroupPath> {
    proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .and_then(|path| CgroupPath::new(path.trim()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn v2() -> Hierarchy {
        Hierarchy::V2 {
            root: PathBuf::from("/sys/fs/cgroup"),
        }
    }

    fn user_cgroup() -> CgroupPath {
        CgroupPath::new("/user.slice/user-1000.slice/user@1000.service/app.slice").unwrap()
    }

    #[test]
    fn own_cgroup_is_the_unified_line() {
        let text = "4:memory:/process_api/x\n0::/user.slice/user-1000.slice/session-2.scope\n";
        assert_eq!(
            own_v2_cgroup(text).unwrap().as_str(),
            "/user.slice/user-1000.slice/session-2.scope"
        );
        assert_eq!(own_v2_cgroup("4:memory:/x\n"), None);
    }

    #[test]
    fn root_with_writable_mounts_gets_everything() {
        let everything = |_: &Path| true;
        let expected = Delegation::Full {
            root: CgroupPath::root(),
        };
        assert_eq!(decide(&v2(), true, None, &everything), expected);
        let v1 = Hierarchy::V1 {
            mounts: BTreeMap::from([("memory".to_owned(), PathBuf::from("/sys/fs/cgroup/memory"))]),
        };
        assert_eq!(decide(&v1, true, None, &everything), expected);
    }

    #[test]
    fn unprivileged_users_get_nothing_on_v1() {
        let v1 = Hierarchy::V1 {
            mounts: BTreeMap::new(),
        };
        assert!(!decide(&v1, false, None, &|_: &Path| true).is_full());
    }

    #[test]
    fn unprivileged_users_get_their_own_cgroup_when_it_is_writable() {
        let own = user_cgroup();
        let only_own = |p: &Path| p.starts_with("/sys/fs/cgroup/user.slice");
        assert_eq!(
            decide(&v2(), false, Some(&own), &only_own),
            Delegation::Full { root: own }
        );
    }

    /// A second ironlet of the same scope starts in the leaf the first moved everything into:
    /// it manages the delegated cgroup, not a leaf below the leaf.
    #[test]
    fn a_process_in_the_agent_leaf_gets_the_delegated_cgroup() {
        let own = user_cgroup();
        let in_leaf = own.join(AGENT_LEAF).unwrap();
        let only_own = |p: &Path| p.starts_with("/sys/fs/cgroup/user.slice");
        assert_eq!(
            decide(&v2(), false, Some(&in_leaf), &only_own),
            Delegation::Full { root: own.clone() }
        );
        // The leaf's parent not delegated: the leaf itself is what there is.
        let only_leaf = |p: &Path| p.starts_with(in_leaf.under(Path::new("/sys/fs/cgroup")));
        assert_eq!(
            decide(&v2(), false, Some(&in_leaf), &only_leaf),
            Delegation::Full { root: in_leaf }
        );
        assert_eq!(
            leaf_parent(&CgroupPath::new("/ironlet-agent").unwrap()),
            None
        );
        assert_eq!(
            leaf_parent(&CgroupPath::new("/a/xironlet-agent").unwrap()),
            None
        );
    }

    #[test]
    fn a_read_only_subtree_control_means_no_delegation_and_says_why() {
        let own = user_cgroup();
        let no_subtree = |p: &Path| !p.ends_with("cgroup.subtree_control");
        let Delegation::None { reason } = decide(&v2(), false, Some(&own), &no_subtree) else {
            panic!("must not be delegated");
        };
        assert!(reason.contains("cgroup.subtree_control"), "{reason}");
    }

    /// A delegated v2 subtree as systemd lays it out, in a directory of the test's: the
    /// user's cgroup is delegated once its directory, `cgroup.subtree_control` and
    /// `cgroup.procs` exist and may be written, and each missing one is named.
    #[test]
    fn a_fake_v2_tree_is_delegated_once_the_users_cgroup_files_are_there() {
        let tree = std::env::temp_dir().join(format!("ironlet-delegation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree).unwrap();
        let v2 = Hierarchy::V2 { root: tree.clone() };
        let own = user_cgroup();
        let dir = own.under(&tree);
        let Delegation::None { reason } = decide(&v2, false, Some(&own), &writable) else {
            panic!("no cgroup directory: not delegated");
        };
        assert!(reason.contains(&dir.display().to_string()), "{reason}");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
        let Delegation::None { reason } = decide(&v2, false, Some(&own), &writable) else {
            panic!("no cgroup.procs: not delegated");
        };
        assert!(reason.contains("cgroup.procs"), "{reason}");
        assert!(reason.contains("Delegate=yes"), "{reason}");
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        assert_eq!(
            decide(&v2, false, Some(&own), &writable),
            Delegation::Full { root: own.clone() }
        );
        // Without a v2 line in /proc/self/cgroup there is nothing to delegate.
        assert!(!decide(&v2, false, None, &writable).is_full());
        std::fs::remove_dir_all(&tree).unwrap();
    }
}
