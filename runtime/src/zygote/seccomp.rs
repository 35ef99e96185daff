//! Seccomp filters compiled once per profile, not once per container.
//!
//! libcontainer compiles the spec's `linux.seccomp` with libseccomp inside every container
//! init; for the RuntimeDefault profile that is ~15 ms of each create. Instead, the runtime
//! moves the profile out of the spec into `<bundle>/seccomp.json` (only when the process
//! has `noNewPrivileges`, so no privilege is needed to install a filter late), the zygote
//! compiles it to BPF once and caches it by content hash, and every worker it forks
//! inherits the program. [`SeccompExecutor`] installs it in the container process right
//! before `execve` — the same point libcontainer would have — for the container's init
//! and for every exec'd process alike.

use std::collections::HashMap;
use std::collections::HashSet;
use std::path::Path;

use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};
use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompOperator, Spec};
use sha2::{Digest, Sha256};

/// The file a bundle's seccomp profile lives in when it is compiled by the zygote.
pub const PROFILE_FILE: &str = "seccomp.json";

/// Moves the spec's seccomp profile to `<bundle>/seccomp.json` for the zygote to compile
/// once and install at exec (see `zygote::seccomp`). Only with `noNewPrivileges`: without
/// it the filter must go in while the process still has CAP_SYS_ADMIN, which only
/// libcontainer's own path does; notify profiles also stay with libcontainer.
pub fn precompile_profile(
    mut spec: oci_spec::runtime::Spec,
    bundle: &Path,
) -> Result<oci_spec::runtime::Spec, crate::RuntimeError> {
    let nnp = spec
        .process()
        .as_ref()
        .and_then(|p| p.no_new_privileges())
        .unwrap_or(false);
    let Some(mut linux) = spec.linux().clone() else {
        return Ok(spec);
    };
    let Some(profile) = linux.seccomp().clone() else {
        return Ok(spec);
    };
    let notify = profile.default_action() == oci_spec::runtime::LinuxSeccompAction::ScmpActNotify
        || profile
            .syscalls()
            .iter()
            .flatten()
            .any(|r| r.action() == oci_spec::runtime::LinuxSeccompAction::ScmpActNotify);
    if !nnp || notify {
        return Ok(spec);
    }
    let path = bundle.join(PROFILE_FILE);
    let bytes = serde_json::to_vec(&profile)
        .map_err(|e| crate::RuntimeError::InvalidConfig(format!("seccomp profile: {e}")))?;
    crate::fsutil::write_atomic(&path, &bytes)
        .map_err(|e| crate::RuntimeError::io("write", &path, e))?;
    linux.set_seccomp(None);
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// Compiled programs by profile hash. Lives in the zygote; workers inherit it.
#[derive(Default)]
pub(crate) struct FilterCache {
    programs: HashMap<[u8; 32], std::sync::Arc<Vec<libc::sock_filter>>>,
}

impl FilterCache {
    /// The compiled program of `<bundle>/seccomp.json`, if the bundle has one.
    pub(crate) fn for_bundle(
        &mut self,
        bundle: &Path,
    ) -> Result<Option<std::sync::Arc<Vec<libc::sock_filter>>>, String> {
        let path = bundle.join(PROFILE_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("read {}: {e}", path.display())),
        };
        let key: [u8; 32] = Sha256::digest(&bytes).into();
        if let Some(program) = self.programs.get(&key) {
            return Ok(Some(program.clone()));
        }
        let profile: LinuxSeccomp =
            serde_json::from_slice(&bytes).map_err(|e| format!("parse {}: {e}", path.display()))?;
        let program = std::sync::Arc::new(compile(&profile)?);
        self.programs.insert(key, program.clone());
        Ok(Some(program))
    }
}

/// Compiles an OCI seccomp profile to a BPF program, as libcontainer would load it.
pub(crate) fn compile(profile: &LinuxSeccomp) -> Result<Vec<libc::sock_filter>, String> {
    let default = action(profile.default_action(), profile.default_errno_ret())?;
    let mut ctx = ScmpFilterContext::new(default).map_err(|e| format!("seccomp filter: {e}"))?;
    if let Some(arches) = profile.architectures() {
        for arch in arches {
            let arch = architecture(*arch)
                .ok_or_else(|| format!("seccomp architecture {arch:?} is not supported"))?;
            ctx.add_arch(arch)
                .map_err(|e| format!("seccomp arch {arch:?}: {e}"))?;
        }
    }
    // Installing happens after `no_new_privs` is set; libseccomp must not set it itself.
    ctx.set_ctl_nnp(false)
        .map_err(|e| format!("seccomp nnp: {e}"))?;
    for rule in profile.syscalls().iter().flatten() {
        let act = action(rule.action(), rule.errno_ret())?;
        if act == default {
            continue;
        }
        for name in rule.names() {
            // A syscall this kernel or libseccomp does not know cannot be called anyway.
            let Ok(syscall) = ScmpSyscall::from_name(name) else {
                continue;
            };
            let args = rule.args().clone().unwrap_or_default();
            let comparators: Vec<ScmpArgCompare> = args
                .iter()
                .map(|a| {
                    ScmpArgCompare::new(
                        a.index() as u32,
                        operator(a.op(), a.value_two()),
                        a.value(),
                    )
                })
                .collect();
            let mut seen = HashSet::new();
            let repeated = args.iter().any(|a| !seen.insert(a.index()));
            let result = if comparators.is_empty() {
                ctx.add_rule(act, syscall).map(drop)
            } else if repeated {
                // One comparison per argument and rule (seccomp_rule_add(3)), as runc does.
                comparators.iter().try_for_each(|c| {
                    ctx.add_rule_conditional(act, syscall, std::slice::from_ref(c))
                        .map(drop)
                })
            } else {
                ctx.add_rule_conditional(act, syscall, &comparators)
                    .map(drop)
            };
            result.map_err(|e| format!("seccomp rule for {name}: {e}"))?;
        }
    }
    export(&ctx)
}

fn export(ctx: &ScmpFilterContext) -> Result<Vec<libc::sock_filter>, String> {
    let memfd = nix::sys::memfd::memfd_create(
        c"seccomp-bpf",
        nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
    )
    .map_err(|e| format!("memfd for seccomp: {e}"))?;
    ctx.export_bpf(&memfd)
        .map_err(|e| format!("export seccomp: {e}"))?;
    let mut file = std::fs::File::from(memfd);
    use std::io::{Read, Seek};
    let mut bytes = Vec::new();
    file.seek(std::io::SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(|e| format!("read seccomp program: {e}"))?;
    let size = std::mem::size_of::<libc::sock_filter>();
    if bytes.len() % size != 0 || bytes.is_empty() {
        return Err(format!(
            "seccomp program of {} bytes is malformed",
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(size)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

fn action(action: LinuxSeccompAction, errno: Option<u32>) -> Result<ScmpAction, String> {
    let errno = errno.map_or(libc::EPERM, |e| e as i32);
    Ok(match action {
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => {
            ScmpAction::KillThread
        }
        LinuxSeccompAction::ScmpActKillProcess => ScmpAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => ScmpAction::Trap,
        LinuxSeccompAction::ScmpActErrno => ScmpAction::Errno(errno),
        LinuxSeccompAction::ScmpActTrace => ScmpAction::Trace(errno as u16),
        LinuxSeccompAction::ScmpActAllow => ScmpAction::Allow,
        LinuxSeccompAction::ScmpActLog => ScmpAction::Log,
        LinuxSeccompAction::ScmpActNotify => {
            return Err("seccomp notify needs libcontainer's own path".into())
        }
    })
}

fn operator(op: LinuxSeccompOperator, value_two: Option<u64>) -> ScmpCompareOp {
    match op {
        LinuxSeccompOperator::ScmpCmpNe => ScmpCompareOp::NotEqual,
        LinuxSeccompOperator::ScmpCmpLt => ScmpCompareOp::Less,
        LinuxSeccompOperator::ScmpCmpLe => ScmpCompareOp::LessOrEqual,
        LinuxSeccompOperator::ScmpCmpEq => ScmpCompareOp::Equal,
        LinuxSeccompOperator::ScmpCmpGe => ScmpCompareOp::GreaterEqual,
        LinuxSeccompOperator::ScmpCmpGt => ScmpCompareOp::Greater,
        LinuxSeccompOperator::ScmpCmpMaskedEq => ScmpCompareOp::MaskedEqual(value_two.unwrap_or(0)),
    }
}

fn architecture(arch: Arch) -> Option<ScmpArch> {
    Some(match arch {
        Arch::ScmpArchNative => ScmpArch::Native,
        Arch::ScmpArchX86 => ScmpArch::X86,
        Arch::ScmpArchX86_64 => ScmpArch::X8664,
        Arch::ScmpArchX32 => ScmpArch::X32,
        Arch::ScmpArchArm => ScmpArch::Arm,
        Arch::ScmpArchAarch64 => ScmpArch::Aarch64,
        Arch::ScmpArchPpc64le => ScmpArch::Ppc64Le,
        Arch::ScmpArchS390x => ScmpArch::S390X,
        Arch::ScmpArchRiscv64 => ScmpArch::Riscv64,
        _ => return None,
    })
}

/// Installs a precompiled filter, then runs the workload with libcontainer's default
/// executor.
#[derive(Clone)]
pub(crate) struct SeccompExecutor {
    pub program: std::sync::Arc<Vec<libc::sock_filter>>,
}

impl Executor for SeccompExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prog points at a live, well-formed program for the duration of the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc != 0 {
            return Err(ExecutorError::Other(format!(
                "installing the seccomp filter: {}",
                std::io::Error::last_os_error()
            )));
        }
        libcontainer::workload::default::get_executor().exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        libcontainer::workload::default::get_executor().validate(spec)
    }

    fn setup_envs(
        &self,
        envs: std::collections::HashMap<String, String>,
    ) -> Result<(), ExecutorSetEnvsError> {
        libcontainer::workload::default::get_executor().setup_envs(envs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{build_spec, SandboxNamespaces, SpecInputs};
    use crate::types::{ContainerConfig, ImageConfig};

    fn spec_running_true(security: crate::types::SecurityConfig) -> Spec {
        let config = ContainerConfig {
            name: "c".into(),
            command: vec!["true".into()],
            security,
            ..ContainerConfig::default()
        };
        build_spec(&SpecInputs {
            container: &config,
            image: &ImageConfig::default(),
            rootfs: Path::new("/"),
            hostname: "h",
            namespaces: &SandboxNamespaces::default(),
            cgroups_path: None,
            user_namespace: None,
        })
        .expect("spec")
    }

    fn runtime_default_profile() -> LinuxSeccomp {
        spec_running_true(Default::default())
            .linux()
            .as_ref()
            .and_then(|l| l.seccomp().clone())
            .expect("RuntimeDefault has a profile")
    }

    #[test]
    fn the_runtime_default_profile_compiles_to_a_bpf_program() {
        let program = compile(&runtime_default_profile()).expect("compiles");
        // Hundreds of allowed syscalls make for a long program; an empty one allows all.
        assert!(program.len() > 100, "{} instructions", program.len());
    }

    #[test]
    fn a_profile_is_compiled_once_and_then_served_from_the_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = serde_json::to_vec(&runtime_default_profile()).expect("json");
        std::fs::write(dir.path().join(PROFILE_FILE), bytes).expect("write");
        let mut cache = FilterCache::default();
        let a = cache.for_bundle(dir.path()).expect("ok").expect("program");
        let b = cache.for_bundle(dir.path()).expect("ok").expect("program");
        assert!(std::sync::Arc::ptr_eq(&a, &b), "compiled twice");
        let none = cache.for_bundle(&dir.path().join("missing")).expect("ok");
        assert!(none.is_none());
    }

    #[test]
    fn specs_without_no_new_privileges_keep_their_profile_for_libcontainer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = spec_running_true(crate::types::SecurityConfig {
            no_new_privs: false,
            ..Default::default()
        });
        let kept = precompile_profile(spec, dir.path()).expect("ok");
        assert!(kept
            .linux()
            .as_ref()
            .and_then(|l| l.seccomp().as_ref())
            .is_some());
        assert!(!dir.path().join(PROFILE_FILE).exists());
    }
}
