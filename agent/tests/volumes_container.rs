//! Environment and volumes seen from inside a real container: a static manifest with a
//! ConfigMap and a Secret beside the pod, the env built by `container_env`, the volumes set up
//! by `VolumeManager` and mounted through `container_mounts` into a busybox container run by
//! the in-process runtime; then, as a non-root user with an `fsGroup`, ConfigMap, Secret and
//! projected files with a `defaultMode` read through the group kubelet gives them, and
//! emptyDirs (disk and memory) owned by that group with the setgid bit. Needs
//! root; skips otherwise. A custom harness (`harness = false`)
//! forks the zygote before any thread exists, as the binary does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ironlet::config::{read_manifest, ManifestOrigin};
use ironlet::env::{container_env, expand_command_and_args, Allocatable, EnvContext};
use ironlet::kubelet::container_config::{container_config, ContainerInputs};
use ironlet::objects::FileObjectSource;
use ironlet::volumes::{container_mounts, VolumeManager};
use ironlet_runtime::types::{ContainerConfig, PodSandboxConfig};
use ironlet_runtime::{LocalRuntime, LocalRuntimeConfig, Runtime};

const NODE: &str = "node-1";

const MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: app
    image: busybox
    command: [sh, -c]
    args:
    - |
      echo "greeting=$(cat /etc/app/greeting)"
      echo "single=$(cat /single)"
      echo "password=$(cat /creds/password) mode=$(stat -L -c %a /creds/password)"
      echo "labels=$(cat /info/labels)"
      echo "env=$GREETING/$PASSWORD/$POD_NAME/$(MEM_MI)"
      touch /etc/app/new 2>/dev/null && echo cfg=writable || echo cfg=read-only
      echo "scratch=$(grep ' /scratch ' /proc/mounts | cut -d' ' -f3)"
      echo hi > /scratch/out && echo "scratch-write=$(cat /scratch/out)"
    env:
    - {name: GREETING, valueFrom: {configMapKeyRef: {name: app-config, key: greeting}}}
    - {name: PASSWORD, valueFrom: {secretKeyRef: {name: creds, key: password}}}
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    resources: {limits: {memory: 64Mi}}
    volumeMounts:
    - {name: cfg, mountPath: /etc/app}
    - {name: cfg, mountPath: /single, subPath: greeting}
    - {name: creds, mountPath: /creds}
    - {name: info, mountPath: /info}
    - {name: scratch, mountPath: /scratch}
  volumes:
  - name: cfg
    configMap: {name: app-config}
  - name: creds
    secret: {secretName: creds, defaultMode: 0400}
  - name: info
    downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
  - name: scratch
    emptyDir: {medium: Memory}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {greeting: hello}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: hunter2}
"#;

/// A non-root pod with an `fsGroup` reading volumes whose `defaultMode` leaves other users out
/// (the e2e "as non-root with defaultMode and fsGroup set" specs).
const FS_GROUP_MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: nonroot}
spec:
  securityContext: {runAsUser: 1000, fsGroup: 1001}
  containers:
  - name: app
    image: busybox
    command: [sh, -c]
    args:
    - |
      echo "groups=$(id -G)"
      echo "cfg=$(cat /etc/cfg/greeting) $(stat -L -c '%a %g' /etc/cfg/greeting)"
      echo "secret=$(cat /creds/password) $(stat -L -c '%a %g' /creds/password)"
      touch /scratch/f /mem/f
      echo "scratch=$(stat -c '%A %g' /scratch) $(stat -c '%g' /scratch/f)"
      echo "mem=$(stat -c '%A %g' /mem) $(stat -c '%g' /mem/f)"
      echo "projected=$(cat /all/password) $(stat -L -c '%a %g' /all/password)"
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
    - {name: creds, mountPath: /creds}
    - {name: all, mountPath: /all}
    - {name: scratch, mountPath: /scratch}
    - {name: mem, mountPath: /mem}
  volumes:
  - name: scratch
    emptyDir: {}
  - name: mem
    emptyDir: {medium: Memory}
  - name: cfg
    configMap: {name: app-config, defaultMode: 0400}
  - name: creds
    secret: {secretName: creds, defaultMode: 0440}
  - name: all
    projected: {defaultMode: 0400, sources: [{secret: {name: creds}}]}
"#;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!("volumes_container: skipped, needs root");
        return;
    }
    // Before any thread: the zygote forks from a single-threaded process.
    let zygote = match ironlet_runtime::zygote::spawn() {
        Ok(z) => z,
        Err(e) => {
            eprintln!("cannot spawn the zygote: {e}");
            std::process::exit(1);
        }
    };
    let root = std::env::temp_dir().join(format!("ironlet-vol-test-{}", std::process::id()));
    let results = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")
        .and_then(|rt| rt.block_on(run_all(zygote, &root)));
    let _ = std::fs::remove_dir_all(&root);
    ironlet_runtime::testkit::remove_cgroup_parent(&cgroup_parent());
    let results = match results {
        Ok(results) => results,
        Err(e) => {
            eprintln!("test setup failed: {e:#}");
            std::process::exit(1);
        }
    };
    let mut failed = false;
    for (name, result) in results {
        match result {
            Ok(()) => println!("test {name} ... ok"),
            Err(e) => {
                eprintln!("test {name} ... FAILED: {e:#}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}

type Outcomes = Vec<(&'static str, Result<()>)>;

/// Sets up the runtime once and runs every test against it.
async fn run_all(zygote: ironlet_runtime::zygote::ZygoteHandle, root: &Path) -> Result<Outcomes> {
    let store = ironlet_runtime::testkit::busybox_store(root).await?;
    let runtime = LocalRuntime::new(
        LocalRuntimeConfig {
            root_dir: root.join("runtime"),
            rootless: false,
            default_cgroup_parent: Some(format!("/{}", cgroup_parent())),
            cni: None,
            log_rotation: Default::default(),
        },
        zygote,
        store,
    )
    .await?;
    Ok(vec![
        (
            "a_container_sees_its_env_and_volumes",
            run(&runtime, root).await,
        ),
        (
            "a_non_root_container_reads_volumes_with_default_mode_through_its_fs_group",
            run_fs_group(&runtime, root).await,
        ),
    ])
}

/// The runtime's cgroup parent for this test, relative to each hierarchy root.
fn cgroup_parent() -> String {
    format!("ironlet-vol-test-{}", std::process::id())
}

async fn run(runtime: &LocalRuntime, root: &Path) -> Result<()> {
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let manifest_path = manifests.join("web.yaml");
    std::fs::write(&manifest_path, MANIFEST)?;
    let pods = read_manifest(
        MANIFEST.as_bytes(),
        &ManifestOrigin::File(manifest_path),
        NODE,
    )?;
    ensure!(pods.invalid.is_empty(), "invalid pods: {:?}", pods.invalid);
    let pod = pods.pods.first().context("one pod")?;
    let spec = pod.spec.as_ref().context("pod spec")?;
    let container = &spec.containers[0];
    let uid = pod.metadata.uid.clone().context("uid")?;

    let objects = Arc::new(FileObjectSource::new(&manifests));
    let allocatable = Allocatable {
        cpu_milli: 2000,
        memory_bytes: 1 << 30,
        ephemeral_storage_bytes: 0,
    };
    let volumes = VolumeManager::new(root.join("agent"), objects.clone());
    let pod_volumes = volumes.setup_pod_volumes(pod, &allocatable).await?;
    let ctx = EnvContext {
        objects: objects.as_ref(),
        services: None,
        node_name: NODE,
        pod_ip: None,
        host_ip: None,
        allocatable,
    };
    let env = container_env(pod, container, &ctx).await?;
    let mounts = container_mounts(pod, container, &pod_volumes, &env)?;
    let (command, args) = expand_command_and_args(container, &env);

    let config = ContainerConfig {
        name: container.name.clone(),
        image: "busybox".into(),
        command,
        args,
        env,
        mounts,
        log_path: PathBuf::from("app/0.log"),
        labels: BTreeMap::new(),
        ..ContainerConfig::default()
    };
    let outcome = run_to_exit(runtime, root, &uid, "web", &config, "scratch-write=")
        .await
        .and_then(|log| {
            expect_lines(
                &log,
                &[
                    "greeting=hello",
                    "single=hello",
                    "password=hunter2 mode=400",
                    "labels=app=\"web\"",
                    "env=hello/hunter2/web-node-1/64",
                    "cfg=read-only",
                    "scratch=tmpfs",
                    "scratch-write=hi",
                ],
            )
        });
    volumes.teardown_pod_volumes(&uid).await?;
    outcome
}

/// The fsGroup pod: its container config comes from `container_config` (the fsGroup is a
/// supplemental group) and its volumes from the `VolumeManager` (files of that group, 0440).
async fn run_fs_group(runtime: &LocalRuntime, root: &Path) -> Result<()> {
    let root = root.join("fs-group");
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let objects_only = MANIFEST
        .split("\n---\n")
        .skip(1)
        .collect::<Vec<_>>()
        .join("\n---\n");
    std::fs::write(manifests.join("objects.yaml"), objects_only)?;
    let manifest_path = manifests.join("nonroot.yaml");
    let pods = read_manifest(
        FS_GROUP_MANIFEST.as_bytes(),
        &ManifestOrigin::File(manifest_path),
        NODE,
    )?;
    ensure!(pods.invalid.is_empty(), "invalid pods: {:?}", pods.invalid);
    let pod = pods.pods.first().context("one pod")?;
    let container = &pod.spec.as_ref().context("pod spec")?.containers[0];
    let uid = pod.metadata.uid.clone().context("uid")?;
    let objects = Arc::new(FileObjectSource::new(&manifests));
    let allocatable = Allocatable {
        cpu_milli: 2000,
        memory_bytes: 1 << 30,
        ephemeral_storage_bytes: 0,
    };
    let volumes = VolumeManager::new(root.join("agent"), objects.clone());
    let pod_volumes = volumes.setup_pod_volumes(pod, &allocatable).await?;
    let mounts = container_mounts(pod, container, &pod_volumes, &[])?;
    let config = container_config(ContainerInputs {
        pod,
        container,
        attempt: 0,
        env: Vec::new(),
        mounts,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        qos: ironlet_cgroups::QosClass::BestEffort,
        node_memory_bytes: 1 << 30,
        cgroup_options: &ironlet_cgroups::CgroupOptions::default(),
        seccomp_default: false,
        seccomp_dir: &root.join("seccomp"),
    })?;
    let outcome = run_to_exit(runtime, &root, &uid, "nonroot", &config, "projected=")
        .await
        .and_then(|log| {
            ensure!(
                log.split_whitespace().any(|w| w == "1001") && log.contains("groups="),
                "the fsGroup is not among the process groups:\n{log}"
            );
            expect_lines(
                &log,
                &[
                    "cfg=hello 440 1001",
                    "secret=hunter2 440 1001",
                    // emptyDirs: group-owned, setgid (what is created in them inherits the
                    // group); the tmpfs root keeps its sticky bit
                    "scratch=drwxrwsrwx 1001 1001",
                    "mem=drwxrwsrwt 1001 1001",
                    "projected=hunter2 440 1001",
                ],
            )
        });
    volumes.teardown_pod_volumes(&uid).await?;
    outcome
}

/// Runs `config` in a new sandbox of pod `uid` until it exits 0; its output, once `marker`
/// is in it. The sandbox is removed whatever happens.
async fn run_to_exit(
    runtime: &LocalRuntime,
    root: &Path,
    uid: &str,
    name: &str,
    config: &ContainerConfig,
    marker: &str,
) -> Result<String> {
    let sandbox = runtime
        .run_pod_sandbox(&PodSandboxConfig {
            pod_uid: uid.to_owned(),
            name: name.into(),
            namespace: "default".into(),
            hostname: name.into(),
            log_directory: root.join("logs"),
            ..PodSandboxConfig::default()
        })
        .await?;
    let outcome = async {
        let id = runtime.create_container(&sandbox, config).await?;
        runtime.start_container(&id).await?;
        let status = tokio::time::timeout(Duration::from_secs(30), runtime.wait(&id))
            .await
            .context("the container did not exit within 30 s")??;
        let log = log_text(&status.log_path, marker).await;
        ensure!(
            status.exit_code == Some(0),
            "exit code {:?}:\n{log}",
            status.exit_code
        );
        anyhow::Ok(log)
    }
    .await;
    runtime.stop_pod_sandbox(&sandbox).await?;
    runtime.remove_pod_sandbox(&sandbox).await?;
    outcome
}

/// Every line of `wants` is in the container output `log`.
fn expect_lines(log: &str, wants: &[&str]) -> Result<()> {
    for want in wants {
        ensure!(
            log.contains(want),
            "{want:?} missing from the container output:\n{log}"
        );
    }
    Ok(())
}

/// The container's log as text, once `marker` is in it (or after 5 s).
async fn log_text(path: &Path, marker: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text: String = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(ironlet_runtime::local::logs::parse_record)
            .map(|(_, _, content)| format!("{content}\n"))
            .collect();
        if text.contains(marker) || Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
