//! Shared fixtures of the `spec_*` tests: a minimal root filesystem with `/etc/passwd` and
//! `/etc/group`, a container config, and the inputs of `build_spec`.
//!
//! The rootfs is made directly (the host's statically linked `/bin/busybox` plus applet
//! symlinks) so that the tests need neither the image store nor `images/build`.

#![allow(dead_code)] // each test crate uses a different part of the fixtures

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::collections::HashSet;

use anyhow::{Context, Result};
use ironlet_runtime::spec::{build_spec, SandboxNamespaces, SpecError, SpecInputs};
use ironlet_runtime::types::{ContainerConfig, ImageConfig};
use oci_spec::runtime::{Capability, Spec};

pub const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                          daemon:x:1:1:daemon:/usr/sbin:/bin/false\n\
                          app:x:1000:1000:app:/home/app:/bin/sh\n";
pub const GROUP: &str = "root:x:0:\n\
                         daemon:x:1:\n\
                         tty:x:5:\n\
                         app:x:1000:app\n\
                         audio:x:29:app,daemon\n\
                         video:x:44:root\n";

/// Busybox applets the container tests call.
const APPLETS: &[&str] = &[
    "sh", "echo", "id", "cat", "grep", "touch", "unshare", "wc", "head", "true", "false", "ls",
    "mount", "sleep", "hostname", "env",
];

/// A temporary root filesystem; removed on drop.
pub struct Rootfs {
    pub dir: tempfile::TempDir,
}

impl Rootfs {
    /// Directories and `/etc/passwd`, `/etc/group`, without binaries.
    pub fn minimal() -> Result<Self> {
        let dir = tempfile::tempdir().context("tempdir")?;
        for sub in [
            "bin", "etc", "proc", "sys", "dev", "tmp", "mnt", "root", "home/app",
        ] {
            std::fs::create_dir_all(dir.path().join(sub))
                .with_context(|| format!("mkdir {sub}"))?;
        }
        std::fs::write(dir.path().join("etc/passwd"), PASSWD).context("write passwd")?;
        std::fs::write(dir.path().join("etc/group"), GROUP).context("write group")?;
        Ok(Self { dir })
    }

    /// [`Rootfs::minimal`] plus the host's static busybox and applet symlinks.
    pub fn busybox() -> Result<Self> {
        let rootfs = Self::minimal()?;
        let bin = rootfs.dir.path().join("bin");
        std::fs::copy("/bin/busybox", bin.join("busybox")).context("copy /bin/busybox")?;
        for applet in APPLETS {
            std::os::unix::fs::symlink("busybox", bin.join(applet))
                .with_context(|| format!("symlink {applet}"))?;
        }
        Ok(rootfs)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// An image config with a busybox-like entrypoint and cmd.
pub fn image() -> ImageConfig {
    ImageConfig {
        entrypoint: vec!["/bin/sh".into(), "-c".into()],
        cmd: vec!["echo image-cmd".into()],
        env: vec![
            "PATH=/usr/local/bin:/usr/bin:/bin".into(),
            "IMAGE_ONLY=1".into(),
            "SHARED=image".into(),
        ],
        working_dir: None,
        user: None,
        labels: BTreeMap::new(),
    }
}

pub fn container(name: &str) -> ContainerConfig {
    ContainerConfig {
        name: name.to_owned(),
        image: "busybox".into(),
        ..Default::default()
    }
}

/// The inputs of an ordinary (rootful, new namespaces) container.
pub fn inputs<'a>(
    container: &'a ContainerConfig,
    image: &'a ImageConfig,
    rootfs: &'a Path,
    namespaces: &'a SandboxNamespaces,
) -> SpecInputs<'a> {
    SpecInputs {
        container,
        image,
        rootfs,
        rootfs_layers: &[],
        hostname: "pod-a",
        namespaces,
        cgroups_path: Some("/kubepods/burstable/podabc/0123456789abcdef".into()),
        user_namespace: None,
    }
}

/// Absolute path of a file that surely does not exist inside any rootfs.
pub fn outside_file(dir: &Path, name: &str, content: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, content).context("write outside file")?;
    Ok(path)
}

// ---- reading generated specs ----

/// Builds the spec of `c` over a fresh minimal rootfs with new namespaces.
pub fn build(c: &ContainerConfig, img: &ImageConfig) -> Result<Spec, SpecError> {
    let rootfs = Rootfs::minimal().map_err(|e| SpecError::InvalidValue {
        field: "test rootfs",
        value: e.to_string(),
        reason: "fixture failed",
    })?;
    let ns = SandboxNamespaces::default();
    build_spec(&inputs(c, img, rootfs.path(), &ns))
}

pub fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

pub fn args_of(spec: &Spec) -> Vec<String> {
    spec.process()
        .as_ref()
        .and_then(|p| p.args().clone())
        .unwrap_or_default()
}

pub fn env_of(spec: &Spec) -> Vec<String> {
    spec.process()
        .as_ref()
        .and_then(|p| p.env().clone())
        .unwrap_or_default()
}

pub fn user_of(spec: &Spec) -> (u32, u32, Vec<u32>) {
    let user = spec
        .process()
        .as_ref()
        .map(|p| p.user().clone())
        .unwrap_or_default();
    (
        user.uid(),
        user.gid(),
        user.additional_gids().clone().unwrap_or_default(),
    )
}

pub fn bounding(spec: &Spec) -> HashSet<Capability> {
    spec.process()
        .as_ref()
        .and_then(|p| p.capabilities().as_ref())
        .and_then(|c| c.bounding().clone())
        .unwrap_or_default()
}

pub fn mount_destinations(spec: &Spec) -> Vec<PathBuf> {
    spec.mounts()
        .iter()
        .flatten()
        .map(|m| m.destination().clone())
        .collect()
}

pub fn mount_at<'a>(spec: &'a Spec, dst: &str) -> Option<&'a oci_spec::runtime::Mount> {
    spec.mounts()
        .iter()
        .flatten()
        .find(|m| m.destination() == Path::new(dst))
}

pub fn linux(spec: &Spec) -> &oci_spec::runtime::Linux {
    spec.linux().as_ref().expect("spec has a linux section")
}

pub const CONTAINERD_DEFAULT_CAPS: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];
