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
//!
//! Without `noNewPrivileges` (kubelet's default: `allowPrivilegeEscalation` unset) the
//! profile stays in the spec, for libcontainer to install in the init while it still has
//! CAP_SYS_ADMIN, and a copy goes to `<bundle>/seccomp-exec.json`: libcontainer runs an
//! exec'd process without the spec's profile, so the zygote installs that copy in exec'd
//! processes only, which hold CAP_SYS_ADMIN until then (see `zygote::exec_process`).
//!
//! A zygote that lives for one container (`ironlet ctr run`) would still compile every
//! time, so compiled programs are also kept on disk in `<root-dir>/seccomp-bpf/` (beside
//! libcontainer's state root; 0700, files 0600, written atomically), keyed by the hash of
//! the profile, the ironlet version and the libseccomp version. A file that does not hold a
//! well-formed program is ignored and replaced; the directory is root's (or the rootless
//! user's) own, like the rest of the state, so it is trusted as much as the state is.

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

/// The copy of a profile that libcontainer installs in the container's init itself (no
/// `noNewPrivileges`), which the zygote installs in exec'd processes.
pub const EXEC_PROFILE_FILE: &str = "seccomp-exec.json";

/// Moves the spec's seccomp profile to `<bundle>/seccomp.json` for the zygote to compile
/// once and install at exec (see `zygote::seccomp`). Only with `noNewPrivileges`: without
/// it the filter must go in while the process still has CAP_SYS_ADMIN, which only
/// libcontainer's own path does, so the profile stays and a copy goes to
/// `<bundle>/seccomp-exec.json` for exec'd processes; notify profiles stay with libcontainer.
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
    if notify {
        return Ok(spec);
    }
    let path = bundle.join(if nnp { PROFILE_FILE } else { EXEC_PROFILE_FILE });
    let bytes = serde_json::to_vec(&profile)
        .map_err(|e| crate::RuntimeError::InvalidConfig(format!("seccomp profile: {e}")))?;
    crate::fsutil::write_state(&path, &bytes)
        .map_err(|e| crate::RuntimeError::io("write", &path, e))?;
    if !nnp {
        return Ok(spec);
    }
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
    /// The compiled program of `<bundle>/seccomp.json` (for an exec'd process, else of
    /// `<bundle>/seccomp-exec.json`), if the bundle has one: from memory, else from the disk
    /// cache `disk_dir` (when given), else compiled (and then stored in both).
    pub(crate) fn for_bundle(
        &mut self,
        bundle: &Path,
        disk_dir: Option<&Path>,
        exec: bool,
    ) -> Result<Option<std::sync::Arc<Vec<libc::sock_filter>>>, String> {
        let files: &[&str] = if exec {
            &[PROFILE_FILE, EXEC_PROFILE_FILE]
        } else {
            &[PROFILE_FILE]
        };
        let mut found = None;
        for file in files {
            let path = bundle.join(file);
            match std::fs::read(&path) {
                Ok(b) => {
                    found = Some((path, b));
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("read {}: {e}", path.display())),
            }
        }
        let Some((path, bytes)) = found else {
            return Ok(None);
        };
        let key: [u8; 32] = Sha256::digest(&bytes).into();
        if let Some(program) = self.programs.get(&key) {
            return Ok(Some(program.clone()));
        }
        let disk_file = disk_dir.map(|dir| dir.join(disk_file_name(&key)));
        let cached = disk_file
            .as_deref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| decode_program(&b).ok());
        let program = match cached {
            Some(program) => program,
            None => {
                let profile: LinuxSeccomp = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("parse {}: {e}", path.display()))?;
                let program = compile(&profile)?;
                if let (Some(dir), Some(file)) = (disk_dir, &disk_file) {
                    // A cache that cannot be written costs the next zygote a compile, no more.
                    if let Err(e) = store_program(dir, file, &program) {
                        tracing::debug!(file = %file.display(), error = %e, "seccomp program not cached");
                    }
                }
                program
            }
        };
        let program = std::sync::Arc::new(program);
        self.programs.insert(key, program.clone());
        Ok(Some(program))
    }
}

/// The disk cache directory for a libcontainer state root: `<root-dir>/seccomp-bpf` (not
/// `<root-dir>/seccomp`, which holds the `Localhost` profiles pods name, as on kubelet).
pub(crate) fn disk_cache_dir(state_root: &Path) -> Option<std::path::PathBuf> {
    state_root.parent().map(|root| root.join("seccomp-bpf"))
}

fn disk_file_name(profile_hash: &[u8; 32]) -> String {
    let mut key = Sha256::new();
    key.update(profile_hash);
    key.update(env!("CARGO_PKG_VERSION").as_bytes());
    let v = libseccomp::ScmpVersion::current().ok();
    key.update(format!("{:?}", v.map(|v| (v.major, v.minor, v.micro))).as_bytes());
    format!("{}.bpf", hex::encode(key.finalize()))
}

fn store_program(dir: &Path, file: &Path, program: &[libc::sock_filter]) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    crate::fsutil::write_atomic(file, &encode_program(program))
}

fn encode_program(program: &[libc::sock_filter]) -> Vec<u8> {
    program
        .iter()
        .flat_map(|i| {
            let mut b = [0u8; 8];
            b[..2].copy_from_slice(&i.code.to_ne_bytes());
            b[2] = i.jt;
            b[3] = i.jf;
            b[4..].copy_from_slice(&i.k.to_ne_bytes());
            b
        })
        .collect()
}

/// The kernel accepts at most this many instructions in one filter (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;

fn decode_program(bytes: &[u8]) -> Result<Vec<libc::sock_filter>, String> {
    let size = std::mem::size_of::<libc::sock_filter>();
    if bytes.is_empty()
        || !bytes.len().is_multiple_of(size)
        || bytes.len() / size > MAX_INSTRUCTIONS
    {
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
    decode_program(&bytes)
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
    pub program: Option<std::sync::Arc<Vec<libc::sock_filter>>>,
    /// Stdin is a pty slave to make the controlling terminal first (see `zygote::tty`).
    pub terminal: bool,
    /// Capabilities held only to install the program (see `zygote::exec_process`).
    pub temporary: super::exec_process::Temporary,
}

impl Executor for SeccompExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        if self.terminal {
            super::tty::make_controlling().map_err(|e| {
                ExecutorError::Other(format!("making the pty the controlling terminal: {e}"))
            })?;
        }
        let Some(program) = &self.program else {
            return libcontainer::workload::default::get_executor().exec(spec);
        };
        let prog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr() as *mut libc::sock_filter,
        };
        let install = || {
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
            Ok(())
        };
        self.temporary.around(install, ExecutorError::Other)?;
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
            rootfs_layers: &[],
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
        let a = cache
            .for_bundle(dir.path(), None, false)
            .expect("ok")
            .expect("program");
        let b = cache
            .for_bundle(dir.path(), None, false)
            .expect("ok")
            .expect("program");
        assert!(std::sync::Arc::ptr_eq(&a, &b), "compiled twice");
        let none = cache
            .for_bundle(&dir.path().join("missing"), None, false)
            .expect("ok");
        assert!(none.is_none());
    }

    fn same_program(a: &[libc::sock_filter], b: &[libc::sock_filter]) -> bool {
        encode_program(a) == encode_program(b)
    }

    #[test]
    fn a_new_zygote_loads_the_program_another_one_compiled_from_disk() {
        use std::os::unix::fs::PermissionsExt;
        let bundle = tempfile::tempdir().expect("tempdir");
        let root = tempfile::tempdir().expect("tempdir");
        let disk = disk_cache_dir(&root.path().join("libcontainer")).expect("parent");
        let bytes = serde_json::to_vec(&runtime_default_profile()).expect("json");
        std::fs::write(bundle.path().join(PROFILE_FILE), bytes).expect("write");
        let compiled = FilterCache::default()
            .for_bundle(bundle.path(), Some(&disk), false)
            .expect("ok")
            .expect("program");
        let files: Vec<_> = std::fs::read_dir(&disk)
            .expect("cache dir")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&disk), 0o700);
        assert_eq!(mode(&files[0]), 0o600);
        // A marker instruction proves the second cache read the file instead of compiling.
        let mut marked = (*compiled).clone();
        marked[0].k ^= 0x5a5a;
        std::fs::write(&files[0], encode_program(&marked)).expect("rewrite");
        let loaded = FilterCache::default()
            .for_bundle(bundle.path(), Some(&disk), false)
            .expect("ok")
            .expect("program");
        assert!(same_program(&loaded, &marked), "not served from disk");
        // A malformed file is ignored, recompiled and replaced.
        std::fs::write(&files[0], b"garbage").expect("corrupt");
        let recompiled = FilterCache::default()
            .for_bundle(bundle.path(), Some(&disk), false)
            .expect("ok")
            .expect("program");
        assert!(same_program(&recompiled, &compiled));
        let on_disk = std::fs::read(&files[0]).expect("read");
        assert_eq!(on_disk, encode_program(&compiled));
    }

    #[test]
    fn programs_longer_than_the_kernel_accepts_are_refused() {
        assert!(decode_program(&vec![0u8; 8 * (MAX_INSTRUCTIONS + 1)]).is_err());
        assert!(decode_program(&[0u8; 12]).is_err());
        assert!(decode_program(&[]).is_err());
        assert_eq!(decode_program(&[0u8; 16]).expect("two").len(), 2);
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
        // The copy for exec'd processes, which libcontainer runs without the spec's profile.
        let mut cache = FilterCache::default();
        assert!(cache
            .for_bundle(dir.path(), None, false)
            .expect("ok")
            .is_none());
        assert!(cache
            .for_bundle(dir.path(), None, true)
            .expect("ok")
            .is_some());
    }
}
