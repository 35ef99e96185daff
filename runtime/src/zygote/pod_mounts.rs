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
//!  zygote:          once per bind, a template namespace: a copy of the host's, made a
//!                   slave, with <root>'s bind detached (MountTemplate)
//!  worker:          open_tree(CLONE) of what this container names: its rootfs, its pod's
//!                   namespace pins, its bind sources (volumes)
//!                   setns(template), unshare(NEWNS)   ── a copy of a few dozen mounts
//!                   move_mount each clone to its own path
//!    (no template:  unshare(NEWNS), / rslave, clone what is under <root>,
//!                   umount2(<root>, DETACH), move the clones back)
//!  init:            clones a table of the host's own mounts plus this container's
//! ```
//!
//! Guarantees: the host sees one extra mount, made only while nothing is mounted under the
//! root (a bind made later would hide those mounts) and removed only when nothing is (also at
//! start, for a runtime stopped after its last pod); a root that is a file system of its own
//! gets the bind on top, so the worker finds the same files beneath and the file system itself
//! is never unmounted. Without the bind (an older ironlet's pods still mounted there) the
//! runtime passes no root and the worker prunes nothing: slower, never wrong. Detaching
//! happens in namespaces made slaves first, so the host is untouched. The template is made
//! for one bind (its mount id): a bind made again later would propagate into an old template
//! on a host whose `/` is shared, so a new bind gets a new template. A host mount made after
//! the template on a host whose mounts are private does not reach it, which is why the
//! worker clones every path its container names, outside the root too; a clone that finds no
//! place in the template sends the worker back to copying the host's table. The zygote drops
//! the template once it owns no process, so it never holds a file system the host has let go.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

fn statx(path: &Path, mask: u32) -> io::Result<libc::statx> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statx is plain data; zeroed is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and stx a valid out pointer for the call.
    let ret = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            mask,
            &mut stx,
        )
    };
    if ret == 0 {
        Ok(stx)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `path` is the root of a mount (`statx`'s `STATX_ATTR_MOUNT_ROOT`); a bind of a
/// directory onto itself keeps its device, so comparing devices would miss it.
pub fn is_mount_root(path: &Path) -> bool {
    let mount_root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    statx(path, libc::STATX_BASIC_STATS).is_ok_and(|stx| {
        stx.stx_attributes_mask & mount_root != 0 && stx.stx_attributes & mount_root != 0
    })
}

/// The id of the mount `path` is on (`STATX_MNT_ID`, as in mountinfo's first field).
fn mount_id(path: &Path) -> io::Result<u64> {
    let stx = statx(path, libc::STATX_MNT_ID)?;
    if stx.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    Ok(stx.stx_mnt_id)
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

/// The zygote's template namespace for one bind of one root: see the module docs.
pub(crate) struct MountTemplate {
    root: PathBuf,
    /// The mount id of the root's bind when it was made (ids are reused: a first check).
    bind: u64,
    /// `None`: making it failed; not tried again for this bind.
    ns: Option<TemplateNs>,
}

/// A template namespace and the mount id of `root` inside it, which a create's worker gets:
/// a worker that finds another mount there (a bind made again later, propagated in) does
/// not use it.
pub(crate) struct TemplateNs {
    ns: OwnedFd,
    root_inside: u64,
}

impl MountTemplate {
    /// The template for the bind now on top of `root`: `current` if it was made for it, else
    /// a new one (the zygote, single-threaded, forks a child to make it). `None` when the bind
    /// cannot be told (a kernel before 5.8): workers copy the host's table then.
    pub(crate) fn for_root(current: Option<Self>, root: &Path) -> Option<Self> {
        let bind = mount_id(root).ok()?;
        if let Some(t) = current.filter(|t| t.root == root && t.bind == bind) {
            return Some(t);
        }
        let ns = match make_template(root) {
            Ok(made) => {
                tracing::debug!(root = %root.display(), bind, "pod mounts: template namespace made");
                Some(made)
            }
            Err(err) => {
                // Not tried again for this bind.
                tracing::warn!(root = %root.display(), %err,
                    "pod mounts: no template namespace; containers copy the host's mount table");
                None
            }
        };
        Some(Self {
            root: root.to_owned(),
            bind,
            ns,
        })
    }

    pub(crate) fn into_ns(self) -> Option<TemplateNs> {
        self.ns
    }
}

/// Forks a child that unshares its mount namespace, makes it a slave and detaches `root`'s
/// bind, then waits while the caller opens that namespace. The caller must be
/// single-threaded (the zygote).
fn make_template(root: &Path) -> Result<TemplateNs, String> {
    let (ready_r, ready_w) = super::sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    let (hold_r, hold_w) = super::sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the zygote is single-threaded; the child only makes system calls and exits.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop((ready_r, hold_w));
            let made = (|| {
                nix::sched::unshare(CloneFlags::CLONE_NEWNS)
                    .map_err(|e| format!("unshare mount namespace: {e}"))?;
                super::worker::set_root_propagation(MsFlags::MS_SLAVE, "template")?;
                nix::mount::umount2(root, MntFlags::MNT_DETACH)
                    .map_err(|e| format!("detach {}: {e}", root.display()))?;
                mount_id(root).map_err(|e| format!("statx {}: {e}", root.display()))
            })();
            // A zero byte and the id, or an error's text.
            let answer = match made {
                Ok(id) => [&[0u8][..], &id.to_le_bytes()].concat(),
                Err(e) => e.into_bytes(),
            };
            let _ = nix::unistd::write(&ready_w, &answer);
            drop(ready_w);
            // Until the caller has opened the namespace (or is gone).
            let _ = nix::unistd::read(hold_r.as_raw_fd(), &mut [0u8; 1]);
            // SAFETY: leave without running the parent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop((ready_w, hold_r));
            let mut answer = [0u8; 512];
            let read = loop {
                match nix::unistd::read(ready_r.as_raw_fd(), &mut answer) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other,
                }
            };
            let made = match read {
                Ok(9) if answer[0] == 0 => std::fs::File::open(format!("/proc/{child}/ns/mnt"))
                    .map(|ns| TemplateNs {
                        ns: OwnedFd::from(ns),
                        root_inside: u64::from_le_bytes(
                            answer[1..9].try_into().unwrap_or_default(),
                        ),
                    })
                    .map_err(|e| format!("open the namespace: {e}")),
                Ok(0) => Err("the child ended without an answer".to_owned()),
                Ok(n) => Err(String::from_utf8_lossy(&answer[..n]).into_owned()),
                Err(e) => Err(format!("read the child's answer: {e}")),
            };
            drop(hold_w);
            while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(child, None) {}
            made
        }
        Err(e) => Err(format!("fork: {e}")),
    }
}

/// How a worker's mount namespace came to be without other pods' mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pruned {
    /// It was not: the worker is still in the host's namespace.
    Not,
    /// A copy of the zygote's template with this container's mounts put in.
    FromTemplate,
    /// A copy of the host's table with the root's bind detached.
    FromHostCopy,
}

impl Pruned {
    /// Whether the worker is in a private mount namespace of its own.
    pub(crate) fn is_private(self) -> bool {
        self != Self::Not
    }
}

/// In a create's worker, before libcontainer runs: see the module docs. `root` comes from the
/// runtime only while its bind is on top ([`ensure_root_mount`]); `template` from the zygote.
pub(crate) fn prune_in_worker(
    root: &Path,
    bundle: &Path,
    template: Option<TemplateNs>,
) -> Result<Pruned, String> {
    if !is_mount_root(root) {
        return Ok(Pruned::Not);
    }
    let wanted = wanted_paths(bundle)?;
    if let Some(template) = template {
        match enter_template(&template, root, &wanted) {
            Ok(()) => return Ok(Pruned::FromTemplate),
            Err(err) => tracing::debug!(%err,
                "pod mounts: the template does not fit; copying the host's table"),
        }
    }
    let kept = outermost(wanted, |p| p != root && p.starts_with(root));
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("pod mounts: unshare mount namespace: {e}"))?;
    // Detaching below must not reach the host.
    super::worker::set_root_propagation(MsFlags::MS_SLAVE, "pod mounts")?;
    let clones = clone_all(kept)?;
    nix::mount::umount2(root, MntFlags::MNT_DETACH)
        .map_err(|e| format!("pod mounts: detach {}: {e}", root.display()))?;
    put_back(clones)?;
    Ok(Pruned::FromHostCopy)
}

/// The template's way: clones of everything the container names (its rootfs and pins under
/// the root; outside it, what the template may lack), then a private copy of the template
/// with the clones in place. On failure the worker is back in the host's namespace.
fn enter_template(template: &TemplateNs, root: &Path, wanted: &[PathBuf]) -> Result<(), String> {
    let kept = outermost(wanted.to_vec(), |p| {
        p != root && !root.starts_with(p) && !p.starts_with("/proc")
    });
    let clones = clone_all(kept)?;
    let host = std::fs::File::open("/proc/self/ns/mnt")
        .map_err(|e| format!("pod mounts: open the host's namespace: {e}"))?;
    nix::sched::setns(template.ns.as_fd(), CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("pod mounts: enter the template: {e}"))?;
    let entered = match mount_id(root) {
        Ok(id) if id == template.root_inside => Ok(()),
        Ok(_) => Err(format!(
            "pod mounts: {} is another mount in the template than when it was made",
            root.display()
        )),
        Err(e) => Err(format!("pod mounts: statx {}: {e}", root.display())),
    }
    .and_then(|()| {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("pod mounts: copy the template: {e}"))
    })
    .and_then(|()| super::worker::set_root_propagation(MsFlags::MS_SLAVE, "pod mounts"))
    .and_then(|()| put_back(clones));
    if entered.is_err() {
        nix::sched::setns(host.as_fd(), CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("pod mounts: back to the host's namespace: {e}"))?;
    }
    entered
}

fn clone_all(paths: Vec<PathBuf>) -> Result<Vec<(PathBuf, OwnedFd)>, String> {
    paths
        .into_iter()
        .map(|path| {
            let tree = crate::image::mount::open_tree_clone(&path)
                .map_err(|e| format!("pod mounts: clone {}: {e}", path.display()))?;
            Ok((path, tree))
        })
        .collect()
}

fn put_back(clones: Vec<(PathBuf, OwnedFd)>) -> Result<(), String> {
    for (path, tree) in clones {
        crate::image::mount::move_mount(&tree, &path)
            .map_err(|e| format!("pod mounts: put back {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The paths the container in `bundle` uses from the host: its rootfs, its namespace paths
/// and its bind mounts' sources.
fn wanted_paths(bundle: &Path) -> Result<Vec<PathBuf>, String> {
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
    Ok(wanted)
}

/// `wanted`, resolved, those `keep` accepts, those inside another left out (the clone of the
/// outer one is recursive), outermost first.
fn outermost(wanted: Vec<PathBuf>, keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut resolved: Vec<PathBuf> = wanted
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(&p).ok())
        .filter(|p| keep(p))
        .collect();
    resolved.sort_by_key(|p| p.as_os_str().len());
    let mut kept: Vec<PathBuf> = Vec::with_capacity(resolved.len());
    for p in resolved {
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
        let kept = outermost(
            vec![
                root.join("pods/v/secret/sub"),
                root.join("c/rootfs"),
                root.join("s/ns/net"),
                root.join("pods/v/secret"),
                root.join("missing"),
                "/etc/hostname".into(),
                root.clone(),
            ],
            |p| p != root && p.starts_with(&root),
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
/// in a mount namespace of its own (as the worker is), from a copy of the host's table or
/// from a template made before the last mounts.
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

    /// Where the worker gets its namespace from.
    #[derive(Clone, Copy, PartialEq)]
    enum Case {
        HostCopy,
        /// A template made once the pods' mounts were there; a host mount outside the root,
        /// made after it, is a volume of the container.
        Template,
        /// The same, but the volume lies inside that late mount, where the template has no
        /// directory to put it on.
        TemplateWithoutAPlace,
    }

    #[test]
    fn a_worker_keeps_its_containers_mounts_and_detaches_the_other_pods() {
        prune_then_release(false, Case::HostCopy);
    }

    /// A root that is a file system of its own (a loop device, a tmpfs) gets the bind on top,
    /// so the worker finds the same files beneath, and keeps its file system afterwards.
    #[test]
    fn a_root_of_its_own_file_system_is_pruned_the_same_and_stays_mounted() {
        prune_then_release(true, Case::HostCopy);
    }

    #[test]
    fn a_template_gives_the_same_view_with_mounts_made_after_it() {
        prune_then_release(false, Case::Template);
        prune_then_release(true, Case::Template);
    }

    #[test]
    fn a_volume_the_template_has_no_place_for_sends_the_worker_to_the_host_copy() {
        prune_then_release(false, Case::TemplateWithoutAPlace);
    }

    fn prune_then_release(own_fs: bool, case: Case) {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let outside_dir = tempfile::tempdir().unwrap();
        let outside = outside_dir.path().canonicalize().unwrap();
        if own_fs {
            tmpfs(&root);
        } else {
            assert_eq!(
                prune_in_worker(&root, &root, None).unwrap(),
                Pruned::Not,
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
        tmpfs(&volume);
        let template = (case != Case::HostCopy).then(|| {
            let t = MountTemplate::for_root(None, &root).expect("the bind has a mount id");
            assert!(t.ns.is_some(), "no template made");
            t
        });
        // After the template: another pod's rootfs under the root, and a host mount outside.
        tmpfs(&other_rootfs);
        tmpfs(&outside);
        std::fs::create_dir(outside.join("sub")).unwrap();
        std::fs::write(outside.join("sub/marker"), "o").unwrap();
        let host_volume = match case {
            Case::TemplateWithoutAPlace => outside.join("sub"),
            _ => outside.clone(),
        };
        std::fs::write(own_rootfs.join("marker"), "c").unwrap();
        // A bundle as the runtime writes it (the fields read here).
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": own_rootfs},
            "mounts": [
                {"destination": "/etc/secret", "type": "bind", "source": volume, "options": ["rbind", "ro"]},
                {"destination": "/data", "type": "bind", "source": host_volume, "options": ["rbind"]},
                {"destination": "/proc", "type": "proc", "source": "proc"},
            ],
            "linux": {"namespaces": [{"type": "network", "path": own_pin}, {"type": "mount"}]},
        });
        let bundle = root.join("containers/c");
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        // Refused while something is mounted under it.
        release_root_mount(&root).unwrap();
        assert!(is_mount_root(&root), "released with pods mounted");

        let (r, b, v) = (root.clone(), bundle.clone(), host_volume.clone());
        let ns = template.and_then(MountTemplate::into_ns);
        let inside = std::thread::spawn(move || {
            // A thread shares its file system context; a worker process does not.
            nix::sched::unshare(CloneFlags::CLONE_FS).map_err(|e| e.to_string())?;
            let pruned = prune_in_worker(&r, &b, ns)?;
            let table = std::fs::read_to_string("/proc/thread-self/mountinfo")
                .map_err(|e| e.to_string())?;
            let read = |p: PathBuf| std::fs::read_to_string(p).map_err(|e| e.to_string());
            let marker = read(r.join("containers/c/rootfs/marker"))?;
            let late = read(v.join(if v.ends_with("sub") {
                "marker"
            } else {
                "sub/marker"
            }))?;
            Ok::<_, String>((pruned, table, marker, late))
        })
        .join()
        .unwrap();
        let (pruned, table, marker, late) = inside.unwrap();
        let expected = match case {
            Case::Template => Pruned::FromTemplate,
            Case::HostCopy | Case::TemplateWithoutAPlace => Pruned::FromHostCopy,
        };
        assert_eq!(pruned, expected);
        assert_eq!(marker, "c", "the kept rootfs is another file system");
        assert_eq!(
            late, "o",
            "the volume mounted after the template is not there"
        );
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
        let made = [
            &own_pin,
            &other_pin,
            &own_rootfs,
            &other_rootfs,
            &volume,
            &outside,
        ];
        for still in made.iter().chain([&&root]) {
            assert!(host.contains(still), "{still:?} gone from the host");
        }
        assert_eq!(
            host.iter().filter(|m| **m == outside).count(),
            1,
            "a clone reached the host"
        );

        for m in made {
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

    /// A bind made again while an old template lives (the pods gone, then new ones) reaches
    /// that template on a host whose `/` is shared, and mount ids are reused: a worker that
    /// finds another mount at the root inside the template copies the host's table instead.
    #[test]
    fn a_template_with_another_mount_at_the_root_is_not_used() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        assert!(ensure_root_mount(&root).unwrap());
        let rootfs = root.join("containers/c/rootfs");
        tmpfs(&rootfs);
        let spec = serde_json::json!({"ociVersion": "1.0.2", "root": {"path": rootfs}});
        let bundle = root.join("containers/c");
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let template = MountTemplate::for_root(None, &root).unwrap();
        let kept = MountTemplate::for_root(Some(template), &root).unwrap();
        let ns = kept.into_ns().expect("a template");
        let r = root.clone();
        let pruned = std::thread::spawn(move || {
            nix::sched::unshare(CloneFlags::CLONE_FS).unwrap();
            let host = std::fs::File::open("/proc/self/ns/mnt").unwrap();
            // As the host's new bind would arrive there.
            nix::sched::setns(ns.ns.as_fd(), CloneFlags::CLONE_NEWNS).unwrap();
            nix::mount::mount(Some(&r), &r, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
            nix::sched::setns(host.as_fd(), CloneFlags::CLONE_NEWNS).unwrap();
            prune_in_worker(&r, &r.join("containers/c"), Some(ns))
        })
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(pruned, Pruned::FromHostCopy);
        nix::mount::umount2(rootfs.as_path(), MntFlags::MNT_DETACH).unwrap();
        release_root_mount(&root).unwrap();
        assert!(!is_mount_root(&root));
    }
}
