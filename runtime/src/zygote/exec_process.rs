//! The process an exec runs (exec probes, `kubectl exec`, exec lifecycle hooks), as runc
//! runs it: the container's own `process` from its `config.json` (user and groups,
//! capabilities, `noNewPrivileges`, AppArmor profile, rlimits) with the exec's arguments,
//! environment and working directory, handed to libcontainer's tenant builder as a
//! `process.json`.
//!
//! Without it the tenant builder makes a process of its own defaults: root, and
//! `no_new_privs` always (oci-spec's default `Process`), so a process exec'd in a container
//! allowed to escalate (`allowPrivilegeEscalation` not false) could not, unlike on kubelet
//! with runc, and one in a `runAsUser` container ran as uid 0.
//!
//! A process without `no_new_privs` can only install a seccomp filter with CAP_SYS_ADMIN
//! (seccomp(2)), and the zygote installs the container's profile at the last moment, after
//! libcontainer has dropped the capabilities (see `zygote::seccomp`). runc installs it
//! before the capabilities go; here the process keeps CAP_SYS_ADMIN and CAP_SETPCAP until
//! then ([`Temporary`]): the executor drops them from the bounding set, installs the filter
//! and drops them from the effective and permitted sets, before `execve`, so the command
//! never runs with them.

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{Capability, Process, Spec};

/// Capabilities an exec'd process holds only until its seccomp filter is in (the ones the
/// container does not have of CAP_SYS_ADMIN, to install it, and CAP_SETPCAP, to drop them
/// from the bounding set).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Temporary(pub Vec<caps::Capability>);

impl Temporary {
    /// Drops the temporary capabilities from the bounding set (while CAP_SETPCAP is still
    /// effective), runs `install` (while CAP_SYS_ADMIN is), then drops them from the
    /// effective and permitted sets.
    pub(crate) fn around<E>(
        &self,
        install: impl FnOnce() -> Result<(), E>,
        error: impl Fn(String) -> E,
    ) -> Result<(), E> {
        for cap in &self.0 {
            caps::drop(None, caps::CapSet::Bounding, *cap)
                .map_err(|e| error(format!("dropping {cap} from the bounding set: {e}")))?;
        }
        install()?;
        for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
            for cap in &self.0 {
                caps::drop(None, set, *cap)
                    .map_err(|e| error(format!("dropping {cap} from {set:?}: {e}")))?;
            }
        }
        Ok(())
    }
}

/// The exec's process: the container's `process` with `args`, `env` (added to the
/// container's, replacing the same names, as libcontainer and runc do) and `cwd` (the
/// container's when `None`), never on a terminal of libcontainer's (the zygote gives an
/// exec its own). With `seccomp` (a filter the zygote installs) and without
/// `noNewPrivileges`, the process gets the [`Temporary`] capabilities the install needs.
pub(crate) fn exec_process(
    spec: &Spec,
    args: Vec<String>,
    env: &[(String, String)],
    cwd: Option<PathBuf>,
    seccomp: bool,
) -> Result<(Process, Temporary), String> {
    let mut process = spec
        .process()
        .clone()
        .ok_or("the container's config.json has no process")?;
    let mut merged: Vec<String> = process
        .env()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| {
            let name = entry.split('=').next().unwrap_or("");
            !env.iter().any(|(n, _)| n == name)
        })
        .collect();
    merged.extend(env.iter().map(|(n, v)| format!("{n}={v}")));
    process
        .set_args(Some(args))
        .set_env(Some(merged))
        .set_terminal(Some(false))
        .set_console_size(None);
    if let Some(cwd) = cwd {
        process.set_cwd(cwd);
    }
    let mut temporary = Temporary::default();
    if seccomp && process.no_new_privileges() != Some(true) {
        let mut capabilities = process.capabilities().clone().unwrap_or_default();
        let held = |c: &Capability| {
            let effective = capabilities
                .effective()
                .as_ref()
                .is_some_and(|s| s.contains(c));
            let permitted = capabilities
                .permitted()
                .as_ref()
                .is_some_and(|s| s.contains(c));
            let bounding = capabilities
                .bounding()
                .as_ref()
                .is_some_and(|s| s.contains(c));
            effective && permitted && bounding
        };
        let needed: Vec<(Capability, caps::Capability)> = [
            (Capability::SysAdmin, caps::Capability::CAP_SYS_ADMIN),
            (Capability::Setpcap, caps::Capability::CAP_SETPCAP),
        ]
        .into_iter()
        .filter(|(c, _)| !held(c))
        .collect();
        let add = |set: Option<HashSet<Capability>>| {
            let mut set = set.unwrap_or_default();
            set.extend(needed.iter().map(|(c, _)| *c));
            Some(set)
        };
        let (bounding, effective, permitted) = (
            add(capabilities.bounding().clone()),
            add(capabilities.effective().clone()),
            add(capabilities.permitted().clone()),
        );
        capabilities
            .set_bounding(bounding)
            .set_effective(effective)
            .set_permitted(permitted);
        process.set_capabilities(Some(capabilities));
        temporary = Temporary(needed.into_iter().map(|(_, c)| c).collect());
    }
    Ok((process, temporary))
}

/// `process` as a `process.json` libcontainer can open by path: a memfd, reached
/// through `/proc/self/fd` by this (worker) process. The descriptor must stay open until
/// the tenant builder has read it.
pub(crate) fn process_file(process: &Process) -> Result<(OwnedFd, PathBuf), String> {
    let json = serde_json::to_vec(process).map_err(|e| format!("process.json: {e}"))?;
    // SAFETY: a NUL-terminated name; the result is checked before use.
    let raw = unsafe { libc::memfd_create(c"process.json".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(format!(
            "memfd for process.json: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: raw is a fresh descriptor owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut file = std::fs::File::from(fd.try_clone().map_err(|e| format!("memfd: {e}"))?);
    file.write_all(&json)
        .map_err(|e| format!("write process.json: {e}"))?;
    let path = Path::new("/proc/self/fd").join(fd.as_raw_fd().to_string());
    Ok((fd, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxCapabilitiesBuilder, ProcessBuilder, SpecBuilder, UserBuilder};

    fn spec(no_new_privileges: Option<bool>) -> Spec {
        let caps: HashSet<Capability> = [Capability::Chown, Capability::NetBindService].into();
        let mut process = ProcessBuilder::default()
            .args(vec!["sleep".to_string(), "60".to_string()])
            .env(vec!["PATH=/bin".to_string(), "A=container".to_string()])
            .cwd("/work")
            .user(
                UserBuilder::default()
                    .uid(1000u32)
                    .gid(3000u32)
                    .additional_gids(vec![4000u32])
                    .build()
                    .expect("user"),
            )
            .capabilities(
                LinuxCapabilitiesBuilder::default()
                    .bounding(caps.clone())
                    .effective(caps.clone())
                    .permitted(caps)
                    .build()
                    .expect("capabilities"),
            )
            .build()
            .expect("process");
        process.set_no_new_privileges(no_new_privileges);
        SpecBuilder::default()
            .process(process)
            .build()
            .expect("spec")
    }

    #[test]
    fn an_exec_runs_as_the_containers_user_with_its_no_new_privileges() {
        for nnp in [None, Some(true)] {
            let (p, temporary) = exec_process(
                &spec(nnp),
                vec!["id".into()],
                &[("A".into(), "exec".into()), ("B".into(), "b".into())],
                None,
                false,
            )
            .expect("process");
            assert_eq!(p.no_new_privileges(), nnp);
            assert_eq!(p.user().uid(), 1000);
            assert_eq!(p.user().gid(), 3000);
            assert_eq!(p.user().additional_gids(), &Some(vec![4000]));
            assert_eq!(p.args(), &Some(vec!["id".to_string()]));
            assert_eq!(
                p.env(),
                &Some(vec!["PATH=/bin".into(), "A=exec".into(), "B=b".into()])
            );
            assert_eq!(p.cwd(), Path::new("/work"));
            assert_eq!(p.terminal(), Some(false));
            assert_eq!(temporary, Temporary::default());
        }
    }

    #[test]
    fn a_seccomp_filter_without_no_new_privileges_gets_capabilities_until_it_is_in() {
        let (p, temporary) =
            exec_process(&spec(None), vec!["id".into()], &[], Some("/".into()), true)
                .expect("process");
        assert_eq!(
            temporary.0,
            vec![
                caps::Capability::CAP_SYS_ADMIN,
                caps::Capability::CAP_SETPCAP
            ]
        );
        let c = p.capabilities().clone().expect("capabilities");
        for set in [c.bounding(), c.effective(), c.permitted()] {
            let set = set.clone().expect("set");
            assert!(set.contains(&Capability::SysAdmin) && set.contains(&Capability::Setpcap));
            assert!(set.contains(&Capability::Chown), "the container's own stay");
        }
        assert_eq!(p.cwd(), Path::new("/"));
        // With no_new_privs the filter needs no privilege.
        let (_, temporary) =
            exec_process(&spec(Some(true)), vec!["id".into()], &[], None, true).expect("process");
        assert_eq!(temporary, Temporary::default());
    }
}
