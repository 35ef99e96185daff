//! The user namespace a rootless worker runs libcontainer in.
//!
//! A rootless worker always enters a user namespace of its own first: it owns the mount
//! namespace in which the cgroup mounts are hidden from libcontainer (see
//! `worker::hide_cgroups_from_libcontainer`). Which one depends on the container's spec:
//!
//! - the spec lists a user namespace (single-id fallback): a namespace mapping just the user's
//!   own ids, which the worker writes itself; libcontainer nests the container's inside it;
//! - the spec lists none but carries the mapping annotations (the subordinate ranges, see
//!   `spec/subids.rs`): `create` makes a namespace with those mappings. `newuidmap` and
//!   `newgidmap` are setuid helpers that must run outside the namespace, as the same user, so
//!   the worker forks a helper first, unshares, then lets the helper map it:
//!
//!   ```text
//!   worker ──fork──► helper (blocks on a pipe)
//!     │ unshare(USER|NS)
//!     │ "go" ─────────► newuidmap <worker> 0 <uid> 1 1 <subuid> <n>  } at once
//!     │                 newgidmap <worker> ...                       } exit 0
//!     │ waitpid ◄──────────────────────────────────────────┘
//!     ▼ uid 0 of the new namespace; libcontainer creates the container inside it
//!   ```
//!
//!   `exec` and `delete` join that namespace through the container's init, when it runs
//!   (their processes must be able to see and signal the container's, which run as ids only
//!   that namespace's root may act on); a `delete` of a dead container uses the first kind.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::spec::subids;
use crate::spec::IdMapping;

/// Why the worker could not enter its user namespace.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsernsError {
    #[error("rootless: read the spec {path}: {reason}")]
    Spec { path: PathBuf, reason: String },
    #[error("rootless: {what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error("rootless: {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rootless: write {file}: {source}")]
    Write {
        file: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rootless: mapping the subordinate id ranges failed: {0}")]
    Map(String),
}

fn sys(what: &'static str) -> impl FnOnce(nix::Error) -> UsernsError {
    move |source| UsernsError::Sys { what, source }
}

/// How the worker gets its user namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// A new namespace mapping the user's own uid and gid to themselves.
    OwnIds,
    /// A new namespace with these mappings (container → host), mapped by the setuid helpers.
    Ranges {
        uids: Vec<IdMapping>,
        gids: Vec<IdMapping>,
    },
    /// The namespace at this `/proc/<pid>/ns/user` path (a container's init, or the
    /// holder of a rootless pod's namespaces, see `holder.rs`).
    Join(PathBuf),
}

/// The mappings of a spec whose user namespace the worker makes: no user namespace listed,
/// the mapping annotations present and well-formed.
fn worker_made(spec: &Spec) -> Option<(Vec<IdMapping>, Vec<IdMapping>)> {
    let linux = spec.linux().as_ref()?;
    let lists_user = linux
        .namespaces()
        .iter()
        .flatten()
        .any(|n| n.typ() == LinuxNamespaceType::User);
    let annotations = spec.annotations().as_ref()?;
    let parse = |key| subids::parse_map_annotation(annotations.get(key)?);
    let uids = parse(subids::UID_MAP_ANNOTATION)?;
    let gids = parse(subids::GID_MAP_ANNOTATION)?;
    (!lists_user).then_some((uids, gids))
}

fn load_spec(bundle: &Path) -> Result<Spec, UsernsError> {
    let path = bundle.join("config.json");
    Spec::load(&path).map_err(|e| UsernsError::Spec {
        path,
        reason: e.to_string(),
    })
}

/// The plan of `create` for the bundle at `bundle`: the pod's namespace when the spec names
/// one to join, else a new one.
pub(crate) fn plan_for_create(bundle: &Path) -> Result<Plan, UsernsError> {
    let spec = load_spec(bundle)?;
    let join = spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(subids::JOIN_ANNOTATION))
        .map(PathBuf::from);
    Ok(match (worker_made(&spec), join) {
        (Some(_), Some(path)) => Plan::Join(path),
        (Some((uids, gids)), None) => Plan::Ranges { uids, gids },
        (None, _) => Plan::OwnIds,
    })
}

/// The plan of `exec` or `delete` of a container with bundle `bundle` and init `pid`: its
/// namespace while it runs, else a new one with the same mappings (a `delete` must hand the
/// rootfs back, see `image/owners.rs`).
pub(crate) fn plan_for_existing(bundle: &Path, pid: Option<i32>) -> Plan {
    let Some((uids, gids)) = load_spec(bundle).ok().and_then(|s| worker_made(&s)) else {
        return Plan::OwnIds;
    };
    match pid {
        Some(pid) if Path::new(&format!("/proc/{pid}/ns/user")).exists() => {
            Plan::Join(PathBuf::from(format!("/proc/{pid}/ns/user")))
        }
        _ => Plan::Ranges { uids, gids },
    }
}

impl Plan {
    /// The worker is root of a namespace mapping the subordinate ranges.
    pub(crate) fn maps_ranges(&self) -> bool {
        !matches!(self, Plan::OwnIds)
    }
}

/// The rootfs directory of the bundle's spec.
pub(crate) fn rootfs_of(bundle: &Path) -> Result<PathBuf, UsernsError> {
    let spec = load_spec(bundle)?;
    let root = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .ok_or_else(|| UsernsError::Spec {
            path: bundle.join("config.json"),
            reason: "no root".into(),
        })?;
    Ok(bundle.join(root))
}

/// Enters the user namespace of `plan` together with a new mount namespace it owns. Must run
/// in the single-threaded worker.
pub(crate) fn enter(plan: &Plan) -> Result<(), UsernsError> {
    match plan {
        Plan::OwnIds => {
            let uid = nix::unistd::geteuid().as_raw();
            let gid = nix::unistd::getegid().as_raw();
            nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
                .map_err(sys("unshare user+mount namespace"))?;
            let write = |file: &'static str, content: String| {
                std::fs::write(file, content).map_err(|source| UsernsError::Write { file, source })
            };
            write("/proc/self/setgroups", "deny".into())?;
            write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
            write("/proc/self/gid_map", format!("{gid} {gid} 1"))
        }
        Plan::Ranges { uids, gids } => {
            map_with_helpers(uids, gids)?;
            drop_groups()
        }
        Plan::Join(path) => {
            let ns = std::fs::File::open(path).map_err(|source| UsernsError::Io {
                what: "open the container's user namespace",
                source,
            })?;
            nix::sched::setns(ns, CloneFlags::CLONE_NEWUSER)
                .map_err(sys("join the container's user namespace"))?;
            nix::sched::unshare(CloneFlags::CLONE_NEWNS).map_err(sys("unshare mount namespace"))?;
            drop_groups()
        }
    }
}

/// The host's supplementary groups show as the overflow gid inside; the container starts with
/// none but its own (setgroups is allowed: a privileged helper wrote the gid map). When the
/// map is the user's own gid only, `newgidmap` denies setgroups in the namespace (as the
/// kernel does for an unprivileged map); the groups then stay, as in a namespace libcontainer
/// maps itself, and nothing inside can change them.
fn drop_groups() -> Result<(), UsernsError> {
    match nix::unistd::setgroups(&[]) {
        Err(nix::errno::Errno::EPERM) if setgroups_denied() => Ok(()),
        other => other.map_err(sys("drop supplementary groups")),
    }
}

/// Whether this process's user namespace denies setgroups.
fn setgroups_denied() -> bool {
    std::fs::read_to_string("/proc/self/setgroups").is_ok_and(|s| s.trim() == "deny")
}

/// `unshare(USER|NS)`, with the maps written by `newuidmap`/`newgidmap` from a helper forked
/// beforehand (still outside the namespace).
fn map_with_helpers(uids: &[IdMapping], gids: &[IdMapping]) -> Result<(), UsernsError> {
    let sources = subids::SubidSources::default();
    let target = nix::unistd::getpid().as_raw();
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"));
    let (go_read, go_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    // SAFETY: the worker is single-threaded; the child only reads a pipe, runs two commands
    // and `_exit`s.
    match unsafe { nix::unistd::fork() }.map_err(sys("fork the id-map helper"))? {
        nix::unistd::ForkResult::Child => {
            drop((go_write, err_read));
            let code = match helper(go_read, target, &sources, uids, gids) {
                Ok(()) => 0,
                Err(message) => {
                    let _ = std::fs::File::from(err_write).write_all(message.as_bytes());
                    1
                }
            };
            // SAFETY: _exit skips destructors shared with the worker's image.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop((go_read, err_write));
            let unshared = nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
                .map_err(sys("unshare user+mount namespace"));
            if unshared.is_ok() {
                // A failed write leaves the helper at EOF: it exits without mapping.
                let _ = std::fs::File::from(go_write).write_all(b"1");
            } else {
                drop(go_write);
            }
            let mut message = String::new();
            let _ = std::fs::File::from(err_read).read_to_string(&mut message);
            let status = nix::sys::wait::waitpid(child, None).map_err(sys("wait the helper"))?;
            unshared?;
            match status {
                nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
                other if message.is_empty() => {
                    Err(UsernsError::Map(format!("the helper ended with {other:?}")))
                }
                _ => Err(UsernsError::Map(message)),
            }
        }
    }
}

/// The helper's side: waits for "go", then maps `target`.
fn helper(
    go: OwnedFd,
    target: i32,
    sources: &subids::SubidSources,
    uids: &[IdMapping],
    gids: &[IdMapping],
) -> Result<(), String> {
    let mut byte = [0u8; 1];
    match std::fs::File::from(go).read(&mut byte) {
        Ok(1) => {}
        _ => return Err("the worker did not unshare its user namespace".into()),
    }
    // Both helpers at once: each is a setuid exec of its own, and they write different
    // files (`uid_map`, `gid_map` and `setgroups`) of the target.
    let mut running = Vec::with_capacity(2);
    for (tool, mappings) in [(&sources.newuidmap, uids), (&sources.newgidmap, gids)] {
        let args = mappings
            .iter()
            .flat_map(|m| [m.container_id, m.host_id, m.size].map(|n| n.to_string()));
        let child = std::process::Command::new(tool)
            .arg(target.to_string())
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("run {}: {e}", tool.display()));
        running.push((tool, child));
    }
    let mut failure = None;
    for (tool, child) in running {
        let outcome = child.and_then(|child| {
            let out = child
                .wait_with_output()
                .map_err(|e| format!("wait for {}: {e}", tool.display()))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{} {target} ... ({}): {}",
                    tool.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        });
        // Both are waited for; the first failure is reported.
        if let Err(message) = outcome {
            failure.get_or_insert(message);
        }
    }
    failure.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(user_ns: bool, annotations: &[(&str, &str)]) -> Spec {
        let mut kinds = vec![r#"{"type":"mount"}"#];
        if user_ns {
            kinds.push(r#"{"type":"user"}"#);
        }
        let annotations: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let json = format!(
            r#"{{"ociVersion":"1.0.2","linux":{{"namespaces":[{}]}},"annotations":{}}}"#,
            kinds.join(","),
            serde_json::Value::Object(annotations)
        );
        serde_json::from_str(&json).unwrap()
    }

    #[test]
    fn only_a_spec_without_a_user_namespace_and_with_both_maps_is_the_workers() {
        let maps = [
            (subids::UID_MAP_ANNOTATION, "0:1001:1,1:100000:65536"),
            (subids::GID_MAP_ANNOTATION, "0:1001:1,1:100000:65536"),
        ];
        let (uids, gids) = worker_made(&spec(false, &maps)).unwrap();
        assert_eq!((uids.len(), gids.len()), (2, 2));
        assert_eq!(uids[1].host_id, 100000);
        // libcontainer makes a listed user namespace itself (the single-id fallback).
        assert!(worker_made(&spec(true, &maps)).is_none());
        assert!(worker_made(&spec(false, &maps[..1])).is_none());
        assert!(worker_made(&spec(false, &[(maps[0].0, "x"), maps[1]])).is_none());
        assert!(worker_made(&spec(false, &[])).is_none());
    }
}
