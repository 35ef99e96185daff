//! Other pods' mounts kept out of a new container's mount namespace.
//!
//! Every pod adds mounts to the host's table under the runtime's root: its namespace pins
//! (`sandboxes/<id>/ns/{net,ipc,uts}`) and its containers' overlays (`containers/<id>/rootfs`),
//! about four per pod. A create copies the table twice (the worker's private namespace, then
//! the init's), and the init parses and detaches its copy at `pivot_root`: at 2000 mounts
//! (500 pods) that is 10 of a create's 15 ms (`docs/BENCHMARKS.md`). So:
//!
//! ```text
//!  runtime (host):  <root> made a bind mount of itself before anything is mounted under it
//!                   (as kubelet does with its root dir), undone once no pod is left
//!  worker:          unshare(NEWNS), / rslave
//!                   open_tree(CLONE) of what this container names under <root>:
//!                     its rootfs, its pod's namespace pins, its bind sources (volumes)
//!                   umount2(<root>, DETACH)  ── every pod's pins and overlays go at once
//!                   move_mount each clone back to its own path
//!  init:            clones a table of the host's own mounts plus this container's
//! ```
//!
//! Guarantees: the host sees one extra mount, made only while nothing is mounted under the
//! root (a bind made later would hide those mounts) and removed only when nothing is (also at
//! start, for a runtime stopped after its last pod); a root that is a file system of its own
//! gets the bind on top, so the worker finds the same files beneath and the file system itself
//! is never unmounted. Without the bind (an older ironlet's pods still mounted there) the
//! runtime passes no root and the worker prunes nothing: slower, never wrong. Detaching
//! happens in the worker's namespace, made a slave first, so the host is untouched.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// Whether `path` is the root of a mount (`statx`'s `STATX_ATTR_MOUNT_ROOT`); a bind of a
/// directory onto itself keeps its device, so comparing devices would miss it.
pub fn is_mount_root(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statx is plain data; zeroed is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and stx a valid out pointer for the call.
    let ret = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
            &mut stx,
        )
    };
    let mount_root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    ret == 0 && stx.stx_attributes_mask & mount_root != 0 && stx.stx_attributes & mount_root != 0
}

/// One line of `/proc/self/mountinfo`: the mount point and the path of its root within its
/// file system.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry {
    /// `major:minor` of the file system.
    device: String,
    fs_root: PathBuf,
    mount_point: PathBuf,
}

fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let device = fields.nth(2)?;
            let fs_root = fields.next()?;
            let mount_point = fields.next()?;
            Some(MountEntry {
                device: device.to_owned(),
                fs_root: ironlet_cgroups::unescape_mountinfo_path(fs_root),
                mount_point: ironlet_cgroups::unescape_mountinfo_path(mount_point),
            })
        })
        .collect()
}

/// What the table says about `root`: whether anything is mounted strictly under it, and
/// whether its top mount is a bind of itself (the one [`ensure_root_mount`] makes).
#[derive(Debug, PartialEq, Eq)]
struct RootMounts {
    anything_under: bool,
    self_bind_on_top: bool,
}

fn root_mounts(table: &[MountEntry], root: &Path) -> RootMounts {
    let anything_under = table
        .iter()
        .any(|m| m.mount_point != root && m.mount_point.starts_with(root));
    // The top mount at `root` (mountinfo lists mounts in the order they were made) and what
    // `root` was before it: the mount it covers at the same point (a root that is a file
    // system of its own), or the directory `root` in the mount holding it.
    let mut at_root = table.iter().filter(|m| m.mount_point == root).rev();
    let top = at_root.next();
    let below = at_root.next().map(|m| (m, m.fs_root.clone())).or_else(|| {
        table
            .iter()
            .filter(|m| m.mount_point != root && root.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len())
            .and_then(|p| {
                let rel = root.strip_prefix(&p.mount_point).ok()?;
                Some((p, p.fs_root.join(rel)))
            })
    });
    let self_bind_on_top = match (top, below) {
        (Some(top), Some((below, fs_root))) => top.device == below.device && top.fs_root == fs_root,
        _ => false,
    };
    RootMounts {
        anything_under,
        self_bind_on_top,
    }
}

fn read_table() -> io::Result<Vec<MountEntry>> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t))
}

/// Makes the top mount at `root` a bind of `root` onto itself unless it is one already, so
/// that a worker can detach every pod's mounts at once and find the same files beneath; a
/// root that is a file system of its own gets the bind on top of it. Returns whether the bind
/// is there. Does nothing while something is mounted under `root` (pods of an ironlet from
/// before this bind, or another process): the bind would hide them. Reads the mount table:
/// the caller keeps the answer.
pub fn ensure_root_mount(root: &Path) -> io::Result<bool> {
    let state = root_mounts(&read_table()?, root);
    if state.self_bind_on_top {
        return Ok(true);
    }
    if state.anything_under {
        return Ok(false);
    }
    nix::mount::mount(
        Some(root),
        root,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    tracing::debug!(root = %root.display(), "runtime root bound onto itself");
    Ok(true)
}

/// Removes the bind [`ensure_root_mount`] made once nothing is mounted under `root`; what is
/// beneath it (a file system of its own) and any other mount at `root` is left alone.
pub fn release_root_mount(root: &Path) -> io::Result<()> {
    if !is_mount_root(root) {
        return Ok(());
    }
    let state = root_mounts(&read_table()?, root);
    if state.anything_under || !state.self_bind_on_top {
        return Ok(());
    }
    nix::mount::umount2(root, MntFlags::MNT_DETACH)?;
    tracing::debug!(root = %root.display(), "runtime root bind removed");
    Ok(())
}

/// In a create's worker, before libcontainer runs: see the module docs. `root` comes from the
/// runtime only while its bind is on top ([`ensure_root_mount`]). Returns whether the worker
/// is now in a private mount namespace of its own.
pub(crate) fn prune_in_worker(root: &Path, bundle: &Path) -> Result<bool, String> {
    if !is_mount_root(root) {
        return Ok(false);
    }
    let kept = kept_paths(root, bundle)?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("pod mounts: unshare mount namespace: {e}"))?;
    // Detaching below must not reach the host.
    super::worker::set_root_propagation(MsFlags::MS_SLAVE, "pod mounts")?;
    let mut clones = Vec::with_capacity(kept.len());
    for path in kept {
        let tree = crate::image::mount::open_tree_clone(&path)
            .map_err(|e| format!("pod mounts: clone {}: {e}", path.display()))?;
        clones.push((path, tree));
    }
    nix::mount::umount2(root, MntFlags::MNT_DETACH)
        .map_err(|e| format!("pod mounts: detach {}: {e}", root.display()))?;
    for (path, tree) in clones {
        crate::image::mount::move_mount(&tree, &path)
            .map_err(|e| format!("pod mounts: put back {}: {e}", path.display()))?;
    }
    Ok(true)
}

/// The paths under `root` the container in `bundle` uses: its rootfs, its namespace paths
/// and its bind mounts' sources, resolved, those inside another left out (the clone of the
/// outer one is recursive), outermost first.
fn kept_paths(root: &Path, bundle: &Path) -> Result<Vec<PathBuf>, String> {
    let spec = oci_spec::runtime::Spec::load(bundle.join("config.json"))
        .map_err(|e| format!("pod mounts: read the spec: {e}"))?;
    let mut wanted: Vec<PathBuf> = Vec::new();
    if let Some(r) = spec.root() {
        let path = r.path();
        wanted.push(if path.is_absolute() {
            path.clone()
        } else {
            bundle.join(path)
        });
    }
    if let Some(linux) = spec.linux() {
        for ns in linux.namespaces().iter().flatten() {
            wanted.extend(ns.path().clone());
        }
    }
    for m in spec.mounts().iter().flatten() {
        let bind = m.typ().as_deref() == Some("bind")
            || m.options()
                .iter()
                .flatten()
                .any(|o| o == "bind" || o == "rbind");
        if bind {
            wanted.extend(m.source().clone());
        }
    }
    Ok(outermost_under(root, wanted))
}

fn outermost_under(root: &Path, wanted: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut under: Vec<PathBuf> = wanted
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(&p).ok())
        .filter(|p| p != root && p.starts_with(root))
        .collect();
    under.sort_by_key(|p| p.as_os_str().len());
    let mut kept: Vec<PathBuf> = Vec::with_capacity(under.len());
    for p in under {
        if !kept.iter().any(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fs_root: &str, mount_point: &str) -> MountEntry {
        on("254:0", fs_root, mount_point)
    }

    fn on(device: &str, fs_root: &str, mount_point: &str) -> MountEntry {
        MountEntry {
            device: device.into(),
            fs_root: fs_root.into(),
            mount_point: mount_point.into(),
        }
    }

    #[test]
    fn mountinfo_lines_give_the_root_and_the_mount_point_unescaped() {
        let text = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                    90 27 254:0 /var/lib/iron\\040let /var/lib/iron\\040let rw shared:3 - ext4 /dev/vda rw\n";
        assert_eq!(
            parse_mountinfo(text),
            vec![
                entry("/", "/"),
                entry("/var/lib/iron let", "/var/lib/iron let")
            ]
        );
    }

    #[test]
    fn only_a_bind_of_the_root_onto_itself_counts_as_ours() {
        let root = Path::new("/tmp/r");
        let base = vec![entry("/", "/"), entry("/", "/tmp")];
        let mut ours = base.clone();
        ours.push(entry("/r", "/tmp/r"));
        assert_eq!(
            root_mounts(&ours, root),
            RootMounts {
                anything_under: false,
                self_bind_on_top: true
            }
        );
        // A file system of its own, or a bind of another directory, is the user's; the bind
        // made on top of the former is ours.
        let mut own_fs = base.clone();
        own_fs.push(on("7:0", "/", "/tmp/r"));
        assert!(!root_mounts(&own_fs, root).self_bind_on_top);
        own_fs.push(on("7:0", "/", "/tmp/r"));
        assert!(root_mounts(&own_fs, root).self_bind_on_top);
        let mut other_fs_on_top = base.clone();
        other_fs_on_top.push(on("7:0", "/", "/tmp/r"));
        other_fs_on_top.push(on("0:55", "/", "/tmp/r"));
        assert!(!root_mounts(&other_fs_on_top, root).self_bind_on_top);
        let mut other_dir = base.clone();
        other_dir.push(entry("/elsewhere", "/tmp/r"));
        assert!(!root_mounts(&other_dir, root).self_bind_on_top);
        // A pin under it; a sibling with a common prefix is not under it.
        ours.push(entry("net:[4026532177]", "/tmp/r/sandboxes/a/ns/net"));
        assert!(root_mounts(&ours, root).anything_under);
        assert!(!root_mounts(&[entry("/", "/"), entry("/", "/tmp/rr/x")], root).anything_under);
    }

    #[test]
    fn kept_paths_are_the_outermost_ones_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for d in ["c/rootfs", "s/ns", "pods/v/secret/sub"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("s/ns/net"), "").unwrap();
        let kept = outermost_under(
            &root,
            vec![
                root.join("pods/v/secret/sub"),
                root.join("c/rootfs"),
                root.join("s/ns/net"),
                root.join("pods/v/secret"),
                root.join("missing"),
                "/etc/hostname".into(),
                root.clone(),
            ],
        );
        assert_eq!(
            kept,
            vec![
                root.join("c/rootfs"),
                root.join("s/ns/net"),
                root.join("pods/v/secret")
            ]
        );
    }
}

/// Real mounts, as root: a root with pins and rootfs stand-ins under it, pruned by a thread
/// in a mount namespace of its own (as the worker is).
#[cfg(test)]
mod mounts_as_root {
    use super::*;

    fn mount_points(table: &str) -> Vec<PathBuf> {
        parse_mountinfo(table)
            .into_iter()
            .map(|m| m.mount_point)
            .collect()
    }

    fn tmpfs(path: &Path) {
        std::fs::create_dir_all(path).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
    }

    fn pin(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
        nix::mount::mount(
            Some("/proc/self/ns/net"),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
    }

    #[test]
    fn a_worker_keeps_its_containers_mounts_and_detaches_the_other_pods() {
        prune_then_release(false);
    }

    /// A root that is a file system of its own (a loop device, a tmpfs) gets the bind on top,
    /// so the worker finds the same files beneath, and keeps its file system afterwards.
    #[test]
    fn a_root_of_its_own_file_system_is_pruned_the_same_and_stays_mounted() {
        prune_then_release(true);
    }

    fn prune_then_release(own_fs: bool) {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        if own_fs {
            tmpfs(&root);
        } else {
            assert!(
                !prune_in_worker(&root, &root).unwrap(),
                "pruned without a bind"
            );
        }
        assert!(ensure_root_mount(&root).unwrap());
        assert!(is_mount_root(&root));
        let (own_pin, other_pin) = (
            root.join("sandboxes/a/ns/net"),
            root.join("sandboxes/b/ns/net"),
        );
        let (own_rootfs, other_rootfs) = (
            root.join("containers/c/rootfs"),
            root.join("containers/d/rootfs"),
        );
        let volume = root.join("pods/p/volumes/secret");
        pin(&own_pin);
        pin(&other_pin);
        tmpfs(&own_rootfs);
        tmpfs(&other_rootfs);
        tmpfs(&volume);
        std::fs::write(own_rootfs.join("marker"), "c").unwrap();
        // A bundle as the runtime writes it (the fields read here).
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": own_rootfs},
            "mounts": [
                {"destination": "/etc/secret", "type": "bind", "source": volume, "options": ["rbind", "ro"]},
                {"destination": "/proc", "type": "proc", "source": "proc"},
            ],
            "linux": {"namespaces": [{"type": "network", "path": own_pin}, {"type": "mount"}]},
        });
        let bundle = root.join("containers/c");
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        // Refused while something is mounted under it.
        release_root_mount(&root).unwrap();
        assert!(is_mount_root(&root), "released with pods mounted");

        let (r, b) = (root.clone(), bundle.clone());
        let inside = std::thread::spawn(move || {
            let pruned = prune_in_worker(&r, &b)?;
            let table = std::fs::read_to_string("/proc/thread-self/mountinfo")
                .map_err(|e| e.to_string())?;
            let marker = std::fs::read_to_string(r.join("containers/c/rootfs/marker"))
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((pruned, table, marker))
        })
        .join()
        .unwrap();
        let (pruned, table, marker) = inside.unwrap();
        assert!(pruned);
        assert_eq!(marker, "c", "the kept rootfs is another file system");
        let inside = mount_points(&table);
        for kept in [&own_pin, &own_rootfs, &volume] {
            assert!(inside.contains(kept), "{kept:?} missing inside: {inside:?}");
        }
        for gone in [&other_pin, &other_rootfs] {
            assert!(!inside.contains(gone), "{gone:?} still inside");
        }
        // The bind went; a file system of its own stays beneath.
        let at_root = inside.iter().filter(|m| **m == root).count();
        assert_eq!(at_root, usize::from(own_fs), "mounts at the root inside");
        // The host is untouched.
        let host = mount_points(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
        for still in [
            &root,
            &own_pin,
            &other_pin,
            &own_rootfs,
            &other_rootfs,
            &volume,
        ] {
            assert!(host.contains(still), "{still:?} gone from the host");
        }

        for m in [&own_pin, &other_pin, &own_rootfs, &other_rootfs, &volume] {
            nix::mount::umount2(m.as_path(), MntFlags::MNT_DETACH).unwrap();
        }
        release_root_mount(&root).unwrap();
        let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let at_root = mount_points(&host).iter().filter(|m| **m == root).count();
        if own_fs {
            assert_eq!(
                at_root, 1,
                "the bind outlived the pods, or took the file system"
            );
            assert!(root.join("containers/c/config.json").exists());
            nix::mount::umount2(root.as_path(), MntFlags::MNT_DETACH).unwrap();
        } else {
            assert!(!is_mount_root(&root), "the bind outlived the pods");
            assert!(!host.contains(root.to_str().unwrap()), "{host}");
        }
    }
}
