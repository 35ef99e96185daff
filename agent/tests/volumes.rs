//! Pod volumes on a real filesystem: a temporary root directory, real tmpfs and bind mounts
//! (checked in `/proc/self/mountinfo`), ConfigMaps and Secrets read from files beside the
//! manifests, subPath safety and hostPath type checks. Mounting needs root (CI runs as root);
//! the tests that mount skip otherwise.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ironlet::config::{read_manifest, ManifestOrigin};
use ironlet::env::Allocatable;
use ironlet::objects::FileObjectSource;
use ironlet::volumes::{container_mounts, Medium, PodVolumes, VolumeManager, VolumePlugin};
use k8s_openapi::api::core::v1::Pod;

const NODE: &str = "node-1";
const LIMIT: Duration = Duration::from_secs(20);

const ALLOCATABLE: Allocatable = Allocatable {
    cpu_milli: 4000,
    memory_bytes: 2 << 30,
    ephemeral_storage_bytes: 10 << 30,
};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// One node: a manifest directory and a root directory; unmounts whatever a failed test
/// left below the root when dropped.
struct Node {
    dir: tempfile::TempDir,
    manager: VolumeManager,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir(dir.path().join("manifests")).unwrap();
        let objects = Arc::new(FileObjectSource::new(dir.path().join("manifests")));
        let manager = VolumeManager::new(dir.path().join("root"), objects);
        Self { dir, manager }
    }

    fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Writes a manifest file (atomically, as writers should) and returns its pods.
    fn write_manifest(&self, file: &str, text: &str) -> Vec<Pod> {
        let path = self.manifests().join(file);
        let tmp = self.manifests().join(format!(".{file}.tmp"));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, &path).unwrap();
        read_manifest(text.as_bytes(), &ManifestOrigin::File(path), NODE)
            .expect("manifest decodes")
            .pods
    }

    async fn setup(&self, pod: &Pod) -> Result<PodVolumes, ironlet::volumes::VolumeError> {
        tokio::time::timeout(LIMIT, self.manager.setup_pod_volumes(pod, &ALLOCATABLE))
            .await
            .expect("setup_pod_volumes hung (blocking task or object lookup stuck?)")
    }

    async fn teardown(&self, pod: &Pod) {
        let uid = pod.metadata.uid.as_deref().unwrap();
        tokio::time::timeout(LIMIT, self.manager.teardown_pod_volumes(uid))
            .await
            .expect("teardown_pod_volumes hung")
            .expect("teardown succeeds");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let root = fs::canonicalize(self.dir.path()).unwrap_or_default();
        let mut left: Vec<_> = mount_table()
            .into_iter()
            .filter(|(p, _, _)| p.starts_with(&root))
            .collect();
        left.sort_by_key(|(p, _, _)| std::cmp::Reverse(p.components().count()));
        for (path, _, _) in left {
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// `(mount point, fs type, super options)` of every mount, escapes undone for spaces only
/// (test paths have no other special characters).
fn mount_table() -> Vec<(PathBuf, String, String)> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            Some((
                PathBuf::from(fields[4].replace("\\040", " ")),
                fields.get(sep + 1)?.to_string(),
                fields.get(sep + 3)?.to_string(),
            ))
        })
        .collect()
}

fn mounts_at(path: &Path) -> Vec<(String, String)> {
    let path = fs::canonicalize(path).unwrap();
    mount_table()
        .into_iter()
        .filter(|(p, _, _)| *p == path)
        .map(|(_, t, o)| (t, o))
        .collect()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn pod_yaml(volumes: &str, mounts: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {{app: web}}\nspec:\n  containers:\n  - name: app\n    image: busybox\n    resources: {{limits: {{memory: 256Mi}}}}\n    volumeMounts:\n{mounts}  volumes:\n{volumes}"
    )
}

#[tokio::test]
async fn a_memory_empty_dir_is_a_sized_tmpfs_until_teardown() {
    if !is_root() {
        eprintln!("skipping: needs root to mount tmpfs");
        return;
    }
    let node = Node::new();
    let pods = node.write_manifest(
        "pod.yaml",
        &pod_yaml(
            "  - name: scratch\n    emptyDir: {medium: Memory, sizeLimit: 16Mi}\n  - name: disk\n    emptyDir: {sizeLimit: 1Gi}\n",
            "    - {name: scratch, mountPath: /scratch}\n",
        ),
    );
    let pod = &pods[0];
    let volumes = node.setup(pod).await.unwrap();
    let scratch = &volumes.volumes["scratch"];
    assert_eq!(scratch.plugin, VolumePlugin::EmptyDir);
    assert_eq!(
        scratch.medium,
        Medium::Memory {
            size_bytes: Some(16 << 20)
        }
    );
    assert!(scratch
        .path
        .ends_with("volumes/kubernetes.io~empty-dir/scratch"));
    let found = mounts_at(&scratch.path);
    assert_eq!(found.len(), 1, "one tmpfs: {found:?}");
    assert_eq!(found[0].0, "tmpfs");
    assert!(found[0].1.contains("size=16384k"), "{found:?}");
    fs::write(scratch.path.join("data"), "in memory").unwrap();

    let disk = &volumes.volumes["disk"];
    assert_eq!(disk.medium, Medium::Disk);
    assert_eq!(disk.size_limit_bytes, Some(1 << 30));
    assert_eq!(mode(&disk.path), 0o777);

    // A second sync neither stacks a mount nor loses data.
    node.setup(pod).await.unwrap();
    assert_eq!(mounts_at(&scratch.path).len(), 1);
    assert_eq!(
        fs::read_to_string(scratch.path.join("data")).unwrap(),
        "in memory"
    );

    let canonical = fs::canonicalize(&volumes.pod_dir).unwrap();
    node.teardown(pod).await;
    assert!(
        !mount_table()
            .iter()
            .any(|(p, _, _)| p.starts_with(&canonical)),
        "a mount outlived teardown"
    );
    assert!(!volumes.pod_dir.exists());
}

#[tokio::test]
async fn a_config_map_beside_the_manifests_appears_as_files_and_updates_are_refreshed() {
    let node = Node::new();
    let config = |greeting: &str, extra: &str| {
        format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-config}}\ndata:\n  greeting: {greeting}\n  app.conf: \"port=80\\n\"\n{extra}")
    };
    let pod_text = pod_yaml(
        "  - name: cfg\n    configMap:\n      name: app-config\n      defaultMode: 0640\n      items:\n      - {key: greeting, path: hello/greeting.txt, mode: 0400}\n      - {key: app.conf, path: app.conf}\n  - name: all\n    configMap: {name: app-config}\n",
        "    - {name: cfg, mountPath: /etc/app}\n",
    );
    let pods = node.write_manifest(
        "web.yaml",
        &format!("{pod_text}{}", config("hello", "  old: gone-soon\n")),
    );
    assert_eq!(pods.len(), 1, "the ConfigMap document is not a pod");
    let pod = &pods[0];

    let volumes = node.setup(pod).await.unwrap();
    let cfg = &volumes.volumes["cfg"];
    assert!(cfg.path.ends_with("volumes/kubernetes.io~configmap/cfg"));
    assert_eq!(
        fs::read_to_string(cfg.path.join("hello/greeting.txt")).unwrap(),
        "hello"
    );
    assert_eq!(
        fs::read_to_string(cfg.path.join("app.conf")).unwrap(),
        "port=80\n"
    );
    assert_eq!(mode(&cfg.path.join("hello/greeting.txt")), 0o400);
    assert_eq!(mode(&cfg.path.join("app.conf")), 0o640);
    assert_eq!(
        fs::read_link(cfg.path.join("app.conf")).unwrap(),
        Path::new("..data/app.conf")
    );
    let all = &volumes.volumes["all"];
    assert_eq!(
        fs::read_to_string(all.path.join("old")).unwrap(),
        "gone-soon"
    );
    assert_eq!(mode(&all.path.join("greeting")), 0o644);

    let mounts = container_mounts(
        pod,
        &pod.spec.as_ref().unwrap().containers[0],
        &volumes,
        &[],
    )
    .unwrap();
    assert_eq!(mounts.len(), 1);
    assert!(
        mounts[0].read_only,
        "configMap volumes are always read-only"
    );
    assert_eq!(mounts[0].host_path, cfg.path);

    // Edit only the ConfigMap (the pod document stays the same, so the pod is not replaced).
    node.write_manifest("web.yaml", &format!("{pod_text}{}", config("bonjour", "")));
    let again = node.setup(pod).await.unwrap();
    assert_eq!(again, volumes);
    assert_eq!(
        fs::read_to_string(cfg.path.join("hello/greeting.txt")).unwrap(),
        "bonjour"
    );
    assert!(
        fs::symlink_metadata(all.path.join("old")).is_err(),
        "a removed key disappears"
    );
    let payload_dirs = fs::read_dir(&all.path)
        .unwrap()
        .filter(|e| {
            let e = e.as_ref().unwrap();
            e.file_name().to_string_lossy().starts_with("..") && e.file_type().unwrap().is_dir()
        })
        .count();
    assert_eq!(payload_dirs, 1, "the previous payload directory is removed");

    node.teardown(pod).await;
    assert!(!volumes.pod_dir.exists());
}

#[tokio::test]
async fn secrets_downward_api_and_projected_volumes_are_written_on_tmpfs() {
    if !is_root() {
        eprintln!("skipping: needs root to mount tmpfs");
        return;
    }
    let node = Node::new();
    node.write_manifest(
        "secret.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\ndata: {password: aHVudGVyMg==}\nstringData: {user: admin}\n",
    );
    let pods = node.write_manifest(
        "pod.yaml",
        &pod_yaml(
            "  - name: creds\n    secret: {secretName: creds, defaultMode: 0400}\n  - name: info\n    downwardAPI:\n      items:\n      - {path: labels, fieldRef: {fieldPath: metadata.labels}}\n      - {path: mem, resourceFieldRef: {containerName: app, resource: limits.memory, divisor: 1Mi}}\n  - name: all\n    projected:\n      sources:\n      - secret: {name: creds, items: [{key: user, path: user}]}\n      - downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}\n      - serviceAccountToken: {path: token}\n      - configMap: {name: absent, optional: true}\n",
            "    - {name: creds, mountPath: /creds}\n",
        ),
    );
    let pod = &pods[0];
    let volumes = node.setup(pod).await.unwrap();

    let creds = &volumes.volumes["creds"];
    assert_eq!(mounts_at(&creds.path)[0].0, "tmpfs");
    assert_eq!(
        fs::read_to_string(creds.path.join("password")).unwrap(),
        "hunter2"
    );
    assert_eq!(
        fs::read_to_string(creds.path.join("user")).unwrap(),
        "admin"
    );
    assert_eq!(mode(&creds.path.join("password")), 0o400);
    // The pod's only container limits memory: the tmpfs is sized to it.
    assert!(mounts_at(&creds.path)[0].1.contains("size=262144k"));

    let info = &volumes.volumes["info"];
    assert_eq!(
        fs::read_to_string(info.path.join("labels")).unwrap(),
        "app=\"web\""
    );
    assert_eq!(fs::read_to_string(info.path.join("mem")).unwrap(), "256");

    let all = &volumes.volumes["all"];
    assert!(all.path.ends_with("volumes/kubernetes.io~projected/all"));
    assert_eq!(fs::read_to_string(all.path.join("user")).unwrap(), "admin");
    assert_eq!(
        fs::read_to_string(all.path.join("name")).unwrap(),
        "web-node-1"
    );
    assert!(
        !all.path.join("token").exists(),
        "service account tokens are skipped"
    );

    let canonical = fs::canonicalize(&volumes.pod_dir).unwrap();
    node.teardown(pod).await;
    assert!(
        !mount_table()
            .iter()
            .any(|(p, _, _)| p.starts_with(&canonical)),
        "a tmpfs outlived teardown"
    );
    assert!(!volumes.pod_dir.exists());
}

#[tokio::test]
async fn a_missing_config_map_fails_the_volume_unless_optional() {
    let node = Node::new();
    let pods = node.write_manifest(
        "pod.yaml",
        &pod_yaml("  - name: cfg\n    configMap: {name: nope}\n", "      []\n"),
    );
    let err = node.setup(&pods[0]).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "MountVolume.SetUp failed for volume \"cfg\" : configmap \"nope\" not found"
    );
    assert_eq!(err.reason(), "FailedMount");

    let pods = node.write_manifest(
        "pod.yaml",
        &pod_yaml(
            "  - name: cfg\n    configMap: {name: nope, optional: true}\n",
            "      []\n",
        ),
    );
    let volumes = node.setup(&pods[0]).await.unwrap();
    let files: Vec<_> = fs::read_dir(&volumes.volumes["cfg"].path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".."))
        .collect();
    assert!(files.is_empty(), "{files:?}");
    node.teardown(&pods[0]).await;
}

#[tokio::test]
async fn sub_paths_are_bind_mounted_inside_the_volume_and_escapes_are_refused() {
    if !is_root() {
        eprintln!("skipping: needs root to bind-mount");
        return;
    }
    let node = Node::new();
    let host = node.dir.path().join("host data");
    fs::create_dir_all(host.join("logs")).unwrap();
    fs::write(host.join("precious"), "keep me").unwrap();
    std::os::unix::fs::symlink("/etc", host.join("to-etc")).unwrap();
    std::os::unix::fs::symlink("logs", host.join("to-logs")).unwrap();
    let volumes_yaml = format!(
        "  - name: host\n    hostPath: {{path: '{}', type: Directory}}\n  - name: scratch\n    emptyDir: {{}}\n",
        host.display()
    );
    let mounts_yaml = "    - {name: host, mountPath: /logs, subPath: to-logs/app}\n    - {name: scratch, mountPath: /work, subPathExpr: 'w/$(POD)'}\n    - {name: host, mountPath: /precious, subPath: precious, readOnly: true}\n";
    let pods = node.write_manifest("pod.yaml", &pod_yaml(&volumes_yaml, mounts_yaml));
    let pod = &pods[0];
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let volumes = node.setup(pod).await.unwrap();
    let env = vec![("POD".to_owned(), "web".to_owned())];

    let mounts = container_mounts(pod, container, &volumes, &env).unwrap();
    let subpaths = volumes.pod_dir.join("volume-subpaths");
    assert_eq!(mounts[0].host_path, subpaths.join("host/app/0"));
    assert!(
        host.join("logs/app").is_dir(),
        "the missing subPath directory is created"
    );
    fs::write(mounts[0].host_path.join("through-bind"), "x").unwrap();
    assert!(
        host.join("logs/app/through-bind").exists(),
        "the bind shows the subPath"
    );
    let work = &volumes.volumes["scratch"].path;
    assert!(work.join("w/web").is_dir());
    assert_eq!(mounts[2].host_path, subpaths.join("host/app/2"));
    assert!(mounts[2].read_only);
    assert_eq!(fs::read_to_string(&mounts[2].host_path).unwrap(), "keep me");
    assert_eq!(
        fs::metadata(&mounts[2].host_path).unwrap().ino(),
        fs::metadata(host.join("precious")).unwrap().ino()
    );

    // A restart reuses the binds instead of stacking new ones.
    container_mounts(pod, container, &volumes, &env).unwrap();
    assert_eq!(mounts_at(&mounts[0].host_path).len(), 1);

    let mut escaping = container.clone();
    escaping.volume_mounts.as_mut().unwrap()[0].sub_path = Some("to-etc/passwd".into());
    let err = container_mounts(pod, &escaping, &volumes, &env).unwrap_err();
    assert!(err.to_string().contains("resolves outside volume"), "{err}");
    assert_eq!(err.reason(), "CreateContainerConfigError");

    let canonical = fs::canonicalize(&volumes.pod_dir).unwrap();
    node.teardown(pod).await;
    assert!(!mount_table()
        .iter()
        .any(|(p, _, _)| p.starts_with(&canonical)));
    assert!(!volumes.pod_dir.exists());
    assert_eq!(
        fs::read_to_string(host.join("precious")).unwrap(),
        "keep me"
    );
    assert!(
        host.join("logs/app/through-bind").exists(),
        "hostPath contents survive teardown"
    );
}

/// Sets up a pod whose only volume is hostPath `path` of `type_`; the error as text.
async fn check(node: &Node, path: &Path, type_: &str) -> Result<(), String> {
    let pods = node.write_manifest(
        "pod.yaml",
        &pod_yaml(
            &format!(
                "  - name: h\n    hostPath: {{path: '{}', type: {type_}}}\n",
                path.display()
            ),
            "      []\n",
        ),
    );
    node.setup(&pods[0])
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn host_path_types_are_checked_with_kubelets_messages() {
    let node = Node::new();
    let base = node.dir.path().join("host");
    fs::create_dir(&base).unwrap();
    fs::write(base.join("file"), "").unwrap();
    let socket = base.join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let prefix = "MountVolume.SetUp failed for volume \"h\" : ";

    let created = base.join("made/deep");
    check(&node, &created, "DirectoryOrCreate").await.unwrap();
    assert!(created.is_dir());
    assert_eq!(mode(&created), 0o755);
    check(&node, &base.join("new-file"), "FileOrCreate")
        .await
        .unwrap();
    assert!(base.join("new-file").is_file());
    check(&node, &base, "Directory").await.unwrap();
    check(&node, &base.join("file"), "File").await.unwrap();
    check(&node, &socket, "Socket").await.unwrap();
    check(&node, Path::new("/dev/null"), "CharDevice")
        .await
        .unwrap();

    let file = base.join("file");
    assert_eq!(
        check(&node, &file, "Directory").await.unwrap_err(),
        format!(
            "{prefix}hostPath type check failed: {} is not a directory, it's a File",
            file.display()
        )
    );
    check(&node, &base, "DirectoryOrCreate").await.unwrap();
    assert_eq!(
        check(&node, &base, "FileOrCreate").await.unwrap_err(),
        format!(
            "{prefix}hostPath type check failed: {} is not a file, it's a Directory",
            base.display()
        )
    );
    assert_eq!(
        check(&node, Path::new("/dev/null"), "BlockDevice").await.unwrap_err(),
        format!("{prefix}hostPath type check failed: /dev/null is not a block device, it's a CharDevice")
    );
    assert_eq!(
        check(&node, &file, "Socket").await.unwrap_err(),
        format!(
            "{prefix}hostPath type check failed: {} is not a socket file, it's a File",
            file.display()
        )
    );
    let missing = base.join("missing");
    assert_eq!(
        check(&node, &missing, "File").await.unwrap_err(),
        format!("{prefix}hostPath {} doesn't exist", missing.display())
    );
}
