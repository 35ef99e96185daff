//! Rootless id ranges end to end (issue 16, "Full id ranges"), as unprivileged users the test
//! creates and removes: with a `/etc/subuid` and `/etc/subgid` range, an image's `USER` and
//! its files' owners are what the image says inside the container, `runAsUser`, `fsGroup`
//! and supplemental groups work in a static pod, and ids beyond the range are refused naming
//! it; without a range, only the user's own id is mapped and a warning says so; the root file
//! system is an overlay mounted in the container's user namespace, whose whiteouts hide the
//! lower files and whose writes never reach the image store. Real
//! containers through `ironlet ctr run` and `ironlet run`; needs root to create the users
//! (CI runs as root), skips otherwise.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::is_root;
use support::rootless::{range_start, text, TestUser};

/// The mapping lines of `/proc/self/uid_map` output, whitespace-normalised.
fn map_lines(out: &str) -> Vec<String> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| l.split(' ').count() == 3 && l.split(' ').all(|f| f.parse::<u64>().is_ok()))
        .collect()
}

#[test]
fn an_image_user_and_its_file_owners_are_what_the_image_says_rootless() {
    if !is_root() {
        return;
    }
    let start = range_start();
    let user = TestUser::new("ids", Some((start, 65536)));
    user.import("nonroot");
    let run = user.sh(
        "nonroot",
        &[],
        "id -u; stat -c '%u:%g %n' /home/app/owned.txt /home/app /srv/root.txt /srv/group.txt; \
         cat /srv/group.txt; cat /proc/self/uid_map /proc/self/gid_map",
    );
    let out = text(&run.stdout);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"1234"), "the image's USER: {out}");
    for owned in [
        "1000:1000 /home/app/owned.txt",
        "1000:1000 /home/app",
        "0:0 /srv/root.txt",
        "1234:2000 /srv/group.txt",
    ] {
        assert!(lines.contains(&owned), "{owned} inside: {out}");
    }
    // 0640 1234:2000: only readable because the owner really is 1234.
    assert!(lines.contains(&"1234:2000"), "{out}");
    let expected = [format!("0 {} 1", user.uid), format!("1 {start} 65536")];
    let maps = map_lines(&out);
    assert_eq!(maps, [&expected[..], &expected[..]].concat(), "{out}");
    assert!(
        !text(&run.stderr).contains("only uid"),
        "no fallback warning with a range: {}",
        text(&run.stderr)
    );
    user.assert_no_containers();

    // Owners are effective: uid 1000 writes into its own directory; 1234 may not.
    let run = user.sh(
        "nonroot",
        &["-u", "1000:1000"],
        "touch /home/app/new && stat -c %u /home/app/new; touch /srv/x 2>/dev/null || echo denied",
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "1000\ndenied\n");
    user.assert_no_containers();

    // A running container as 1234: its process runs as the mapped host id, exec and a
    // forced removal work on it (they join the container's namespace).
    let run = user.run(&[
        "ctr", "run", "-d", "--name", "long", "nonroot", "--", "sleep", "300",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let host_uid = (start + 1233).to_string();
    let ps = Command::new("ps")
        .args(["-o", "uid=,args=", "-U", &host_uid])
        .output()
        .expect("ps");
    assert!(
        text(&ps.stdout).contains("sleep 300"),
        "the container process runs as host uid {host_uid}: {}",
        text(&ps.stdout)
    );
    let exec = user.run(&["ctr", "exec", "long", "--", "stat", "-c", "%u", "/home/app"]);
    assert!(exec.status.success(), "exec: {}", text(&exec.stderr));
    assert_eq!(text(&exec.stdout), "1000\n");
    let rm = user.run(&["ctr", "rm", "-f", "long"]);
    assert!(rm.status.success(), "rm -f: {}", text(&rm.stderr));
    user.assert_no_containers();

    // Beyond the range: refused, naming it.
    let run = user.sh("nonroot", &["-u", "70000"], "id -u");
    assert!(!run.status.success());
    let err = text(&run.stderr);
    assert!(
        err.contains("uid 70000 is not mapped") && err.contains("0,1-65536"),
        "{err}"
    );
    user.assert_no_containers();
}

#[test]
fn without_a_subordinate_range_only_the_own_id_is_mapped_with_a_warning() {
    if !is_root() {
        return;
    }
    let user = TestUser::new("single", None);
    user.import("busybox");
    let run = user.sh("busybox", &[], "id -u; cat /proc/self/uid_map");
    assert!(run.status.success(), "{}", text(&run.stderr));
    let out = text(&run.stdout);
    assert_eq!(out.lines().next(), Some("0"), "{out}");
    assert_eq!(map_lines(&out), [format!("0 {} 1", user.uid)], "{out}");
    let err = text(&run.stderr);
    assert!(
        err.contains(&format!("only uid {} is mapped", user.uid))
            && err.contains("has no range for user"),
        "the fallback warning: {err}"
    );
    assert_eq!(err.matches("only uid").count(), 1, "one warning: {err}");
    let run = user.sh("busybox", &["-u", "1234"], "id -u");
    assert!(!run.status.success());
    assert!(
        text(&run.stderr).contains("uid 1234 is not mapped")
            && text(&run.stderr).contains("maps container ids 0;"),
        "{}",
        text(&run.stderr)
    );
    user.assert_no_containers();
}

/// A file named `name` anywhere under `dir` (the pod's emptyDir on the host).
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(_) if entry.file_name() == name => return Some(path),
                _ => {}
            }
        }
    }
    None
}

#[test]
fn a_rootless_pod_runs_as_run_as_user_with_fs_group_and_a_writable_empty_dir() {
    if !is_root() {
        return;
    }
    let start = range_start() + 65536 * 600;
    let user = TestUser::new("pod", Some((start, 65536)));
    user.import("busybox");
    let (agent, log_path) = user.start_agent("rootless-ids");
    let manifests = agent.manifests.clone();
    let manifest = manifests.join("ids.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: v1
kind: Pod
metadata: {name: ids}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1234, runAsGroup: 1234, fsGroup: 2000, supplementalGroups: [3000]}
  volumes:
  - {name: scratch, emptyDir: {}}
  - name: info
    downwardAPI: {defaultMode: 0400, items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}
  containers:
  - name: c
    image: busybox
    volumeMounts: [{name: scratch, mountPath: /scratch}, {name: info, mountPath: /info}]
    command: [sh, -c, "echo written > /scratch/probe && cat /info/name > /scratch/info && id > /scratch/id.tmp && mv /scratch/id.tmp /scratch/id-out; sleep 3600"]
"#,
    )
    .expect("manifest");
    let deadline = Instant::now() + Duration::from_secs(40);
    let found = loop {
        if let Some(path) = find_file(&user.root_dir(), "id-out") {
            break path;
        }
        assert!(
            Instant::now() < deadline,
            "the pod never wrote its ids; agent log:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let ids = std::fs::read_to_string(&found).unwrap_or_default();
    assert!(
        ids.starts_with("uid=1234 gid=1234 groups="),
        "runAsUser/runAsGroup: {ids}"
    );
    for group in ["2000", "3000"] {
        assert!(ids.contains(group), "fsGroup and supplementalGroups: {ids}");
    }
    // A payload volume of an fsGroup pod (defaultMode 0400) is readable by the pod's user.
    let info = std::fs::read_to_string(found.with_file_name("info")).unwrap_or_default();
    assert!(
        info.starts_with("ids"),
        "downwardAPI file read as 1234: {info:?}"
    );
    // Written by container uid 1234: on the host, the range's id for it.
    let probe = found.with_file_name("probe");
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&probe).expect("probe"));
    assert_eq!(owner, start + 1233, "host owner of the emptyDir file");

    std::fs::remove_file(&manifest).expect("remove manifest");
    let deadline = Instant::now() + Duration::from_secs(30);
    while find_file(&user.root_dir(), "id-out").is_some() || !containers_gone(&user) {
        assert!(
            Instant::now() < deadline,
            "the pod was not removed; agent log:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(agent);
}

fn containers_gone(user: &TestUser) -> bool {
    std::fs::read_dir(user.root_dir().join("containers"))
        .map(|d| d.count() == 0)
        .unwrap_or(true)
}

/// Every file of `dir` (recursively) with its kind, size, mode, owner, mtime and user xattrs:
/// what must not change when containers write.
fn tree_state(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(m) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let mut xattrs: Vec<String> = xattr::list(&path)
                .into_iter()
                .flatten()
                .map(|n| n.to_string_lossy().into_owned())
                .collect();
            xattrs.sort();
            out.push(format!(
                "{} {:o} {} {}:{} {}.{} {:?}",
                path.display(),
                m.mode(),
                m.len(),
                m.uid(),
                m.gid(),
                m.mtime(),
                m.mtime_nsec(),
                xattrs
            ));
            if m.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_rootless_rootfs_is_an_overlay_that_hides_whiteouts_and_leaves_the_store_alone() {
    if !is_root() {
        return;
    }
    let user = TestUser::new("ovl", Some((range_start() + 65536 * 300, 65536)));
    user.import("layered");
    let snapshots = user.root_dir().join("images/snapshots");
    let before = tree_state(&snapshots);
    assert!(
        before.len() > 10,
        "the layered image's snapshots: {before:?}"
    );
    // Writes, deletions (of lower files and of a whole directory) and a new file.
    let run = user.sh(
        "layered",
        &[],
        "awk '$5 == \"/\"' /proc/self/mountinfo; ls /data /opaque; \
         echo changed > /data/keep.txt && rm /data/late.txt && rm -r /opaque && echo n > /etc/new \
         && cat /data/keep.txt && ls /",
    );
    let out = text(&run.stdout);
    assert!(run.status.success(), "{out}{}", text(&run.stderr));
    let root = out.lines().next().unwrap_or_default();
    assert!(
        root.contains(" - overlay ") && root.contains("userxattr"),
        "/ is an overlay mounted in the user namespace: {out}"
    );
    let lines: Vec<&str> = out.lines().collect();
    for present in ["keep.txt", "late.txt", "late-link", "rel-link", "new.txt"] {
        assert!(lines.contains(&present), "{present} inside: {out}");
    }
    // Whited out by layer 3 (a file, a directory, an opaque directory's older content).
    for hidden in ["gone.txt", "dir", "old1.txt", "old2.txt"] {
        assert!(!lines.contains(&hidden), "{hidden} must be hidden: {out}");
    }
    assert!(!out.contains(".wh."), "{out}");
    assert!(
        lines.contains(&"changed") && !lines.contains(&"opaque"),
        "{out}"
    );
    assert_eq!(
        tree_state(&snapshots),
        before,
        "the container's writes reached the image store"
    );
    // The next container sees the image as it was.
    let run = user.sh(
        "layered",
        &[],
        "cat /data/keep.txt; ls /opaque; test -e /data/late.txt && echo late; test -e /etc/new || echo no-new",
    );
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "keep\nnew.txt\nlate\nno-new\n");
    user.assert_no_containers();
    assert!(
        containers_gone(&user),
        "a removed container leaves no directory (upper, work, description)"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(
        !mounts.contains(&*user.root_dir().to_string_lossy()),
        "nothing of the user's is mounted on the host: {mounts}"
    );
}
