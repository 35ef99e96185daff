//! The static pod file source end to end: a real temporary directory, inotify, the merger, and
//! the update stream the sync loop reads.

use std::path::Path;
use std::time::Duration;

use ironlet::config::{
    annotation, pod_uid, ConfigSource, FileSource, FileSourceConfig, ManifestError, ManifestOrigin,
    PodConfig, PodConfigOptions, PodOp, PodUpdate, SourceChange, SourcesReady, CONFIG_HASH,
    CONFIG_SEEN, CONFIG_SOURCE,
};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};

const NODE: &str = "Node-1";
const WAIT: Duration = Duration::from_secs(10);

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: kube-system\nspec:\n  containers:\n  - name: main\n    image: {image}\n"
    )
}

struct Harness {
    updates: mpsc::Receiver<PodUpdate>,
    problems: watch::Receiver<Vec<ManifestError>>,
    ready: SourcesReady,
    config: PodConfig,
}

/// Starts a file source on `path`; with a long resync period every change must come through
/// inotify.
fn start(path: &Path, resync: Duration) -> Harness {
    let (config, updates) = PodConfig::new(&PodConfigOptions::default());
    let source = FileSource::new(
        FileSourceConfig::new(path, NODE)
            .resync_period(resync)
            .debounce(Duration::from_millis(50)),
    );
    let problems = source.problems();
    config.spawn(source).expect("file source registers once");
    let ready = config.sources_ready();
    Harness {
        updates,
        problems,
        ready,
        config,
    }
}

impl Harness {
    async fn next(&mut self, expecting: &str) -> PodUpdate {
        tokio::time::timeout(WAIT, self.updates.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("no pod update within {WAIT:?} while expecting {expecting}: the file source's inotify watch or re-read probably never fired")
            })
            .expect("update stream ended: the merger stopped")
    }

    /// Asserts nothing arrives for a while (the source must deduplicate).
    async fn quiet(&mut self, why: &str) {
        if let Ok(update) =
            tokio::time::timeout(Duration::from_millis(500), self.updates.recv()).await
        {
            panic!("expected no update ({why}), got {update:?}");
        }
    }

    async fn problems_where(
        &mut self,
        what: &str,
        ok: impl FnMut(&Vec<ManifestError>) -> bool,
    ) -> Vec<ManifestError> {
        tokio::time::timeout(WAIT, self.problems.wait_for(ok))
            .await
            .unwrap_or_else(|_| panic!("problems never became: {what}"))
            .expect("problem channel closed")
            .clone()
    }
}

fn names(update: &PodUpdate) -> Vec<&str> {
    update
        .pods
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap_or_default())
        .collect()
}

fn only_pod(update: &PodUpdate) -> &Pod {
    assert_eq!(update.pods.len(), 1, "{update:?}");
    &update.pods[0]
}

#[tokio::test]
async fn the_first_read_of_an_empty_directory_makes_the_source_ready() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    let first = h.next("the empty readiness ADD").await;
    assert_eq!(
        (first.op, first.source, first.pods.len()),
        (PodOp::Add, ConfigSource::File, 0)
    );
    tokio::time::timeout(WAIT, h.ready.wait_all_ready())
        .await
        .expect("sources_ready never flipped after the first read");
    assert!(h.config.all_sources_ready());
}

#[tokio::test]
async fn writing_a_manifest_delivers_an_add_of_a_defaulted_static_pod() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    h.next("the empty readiness ADD").await;

    std::fs::write(dir.path().join("etcd.yaml"), manifest("etcd", "etcd:3.5")).unwrap();
    let add = h.next("ADD of etcd").await;
    assert_eq!(add.op, PodOp::Add);
    let pod = only_pod(&add);
    assert_eq!(pod.metadata.name.as_deref(), Some("etcd-node-1"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(annotation(pod, CONFIG_SOURCE), Some("file"));
    assert_eq!(annotation(pod, CONFIG_HASH), Some(pod_uid(pod)));
    assert!(annotation(pod, CONFIG_SEEN).is_some_and(|t| t.ends_with('Z')));
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(NODE));
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );

    std::fs::write(dir.path().join("etcd.yaml"), manifest("etcd", "etcd:3.5")).unwrap();
    h.quiet("rewriting identical content changes nothing").await;
}

#[tokio::test]
async fn editing_a_manifest_replaces_the_pod_under_a_new_uid() {
    // Static pod UIDs are derived from the content, so an edit is a new pod: REMOVE the old
    // UID, then ADD the new one (kubelet does the same).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, manifest("web", "nginx:1.26")).unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    let add = h.next("ADD of web").await;
    let old_uid = pod_uid(only_pod(&add)).to_owned();

    std::fs::write(&file, manifest("web", "nginx:1.27")).unwrap();
    let remove = h.next("REMOVE of the old web").await;
    assert_eq!(
        (remove.op, pod_uid(only_pod(&remove))),
        (PodOp::Remove, old_uid.as_str())
    );
    let add = h.next("ADD of the new web").await;
    assert_eq!(add.op, PodOp::Add);
    let new = only_pod(&add);
    assert_ne!(pod_uid(new), old_uid);
    assert_eq!(new.metadata.name.as_deref(), Some("web-node-1"));
    assert_eq!(
        new.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some("nginx:1.27")
    );
}

#[tokio::test]
async fn editing_a_manifest_with_an_explicit_uid_is_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    let with_uid = |image: &str| {
        manifest("web", image).replace("  name: web\n", "  name: web\n  uid: fixed-uid\n")
    };
    std::fs::write(&file, with_uid("nginx:1.26")).unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    assert_eq!(h.next("ADD of web").await.op, PodOp::Add);
    std::fs::write(&file, with_uid("nginx:1.27")).unwrap();
    let update = h.next("UPDATE of web").await;
    assert_eq!(
        (update.op, pod_uid(only_pod(&update))),
        (PodOp::Update, "fixed-uid")
    );
}

#[tokio::test]
async fn a_malformed_manifest_is_reported_by_path_and_does_not_hide_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: Pod\nmetadata: [oops\n").unwrap();
    std::fs::write(
        dir.path().join("good.yaml"),
        manifest("good", "busybox:1.36"),
    )
    .unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));

    let add = h.next("ADD of the good pod").await;
    assert_eq!((add.op, names(&add)), (PodOp::Add, vec!["good-node-1"]));
    let problems = h
        .problems_where("an error about bad.yaml", |p| !p.is_empty())
        .await;
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].origin(), &ManifestOrigin::File(bad.clone()));
    assert!(
        problems[0].to_string().contains("bad.yaml"),
        "{}",
        problems[0]
    );

    // Fixing the file clears the problem and adds its pod.
    std::fs::write(&bad, manifest("fixed", "busybox:1.36")).unwrap();
    let add = h.next("ADD of the fixed pod").await;
    assert_eq!(names(&add), ["fixed-node-1"]);
    h.problems_where("no problems", Vec::is_empty).await;
}

#[tokio::test]
async fn breaking_a_manifest_keeps_its_running_pod() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api.yaml");
    std::fs::write(&file, manifest("api", "kube-apiserver:1")).unwrap();
    let mut h = start(dir.path(), Duration::from_millis(200));
    h.next("ADD of api").await;
    std::fs::write(&file, "kind: Pod\nspec: {containers: 7}\n").unwrap();
    h.problems_where("an error about api.yaml", |p| !p.is_empty())
        .await;
    h.quiet("the last good pod stays while the file is broken, across re-reads")
        .await;
}

#[tokio::test]
async fn an_invalid_pod_is_reported_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("two.yaml"),
        format!(
            "{}---\n{}",
            manifest("ok", "i:1"),
            manifest("Not_Valid", "i:1")
        ),
    )
    .unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    let add = h.next("ADD of the valid pod").await;
    assert_eq!(names(&add), ["ok-node-1"]);
    let problems = h.problems_where("the invalid pod", |p| !p.is_empty()).await;
    assert!(
        matches!(&problems[0], ManifestError::Invalid { pod, .. } if pod == "Not_Valid"),
        "{problems:?}"
    );
}

#[tokio::test]
async fn deleting_a_manifest_removes_its_pod() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, manifest("web", "nginx:1.27")).unwrap();
    std::fs::write(dir.path().join("db.yaml"), manifest("db", "postgres:17")).unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    let add = h.next("ADD of both pods").await;
    assert_eq!(names(&add), ["db-node-1", "web-node-1"]);

    std::fs::remove_file(&file).unwrap();
    let remove = h.next("REMOVE of web").await;
    assert_eq!(
        (remove.op, names(&remove)),
        (PodOp::Remove, vec!["web-node-1"])
    );
    h.quiet("db is untouched").await;
}

#[tokio::test]
async fn a_multi_document_manifest_delivers_every_pod() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    h.next("the empty readiness ADD").await;
    let text = format!(
        "---\n{}---\n{}---\n",
        manifest("a", "i:1"),
        manifest("b", "i:1")
    );
    std::fs::write(dir.path().join("pods.yaml"), text).unwrap();
    let add = h.next("ADD of a and b").await;
    assert_eq!(
        (add.op, names(&add)),
        (PodOp::Add, vec!["a-node-1", "b-node-1"])
    );
}

#[tokio::test]
async fn hidden_files_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    h.next("the empty readiness ADD").await;
    std::fs::write(dir.path().join(".web.yaml.swp"), manifest("swap", "i:1")).unwrap();
    h.quiet("a hidden file is not a manifest").await;
}

#[tokio::test]
async fn a_single_file_path_follows_an_editor_style_rename() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kube-scheduler.yaml");
    std::fs::write(&file, manifest("kube-scheduler", "sched:1")).unwrap();
    std::fs::write(dir.path().join("other.yaml"), manifest("other", "i:1")).unwrap();
    let mut h = start(&file, Duration::from_secs(60));
    let add = h.next("ADD of the scheduler only").await;
    assert_eq!(names(&add), ["kube-scheduler-node-1"]);

    let tmp = dir.path().join(".kube-scheduler.yaml.tmp");
    std::fs::write(&tmp, manifest("kube-scheduler", "sched:2")).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    assert_eq!(
        h.next("REMOVE of the old scheduler").await.op,
        PodOp::Remove
    );
    let add = h.next("ADD of the new scheduler").await;
    assert_eq!(
        add.pods[0].spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("sched:2")
    );
}

#[tokio::test]
async fn a_directory_created_after_start_is_picked_up() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    let mut h = start(&dir, Duration::from_millis(200));
    let first = h.next("the empty readiness ADD for a missing path").await;
    assert!(first.pods.is_empty());
    h.problems_where("a missing path is not a problem", Vec::is_empty)
        .await;

    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("late.yaml"), manifest("late", "i:1")).unwrap();
    let add = h.next("ADD of late once the directory exists").await;
    assert_eq!(names(&add), ["late-node-1"]);

    // The watch is established by now: a removal is seen.
    std::fs::remove_file(dir.join("late.yaml")).unwrap();
    assert_eq!(h.next("REMOVE of late").await.op, PodOp::Remove);
}

#[tokio::test]
async fn sources_ready_waits_for_every_registered_source() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = start(dir.path(), Duration::from_secs(60));
    let api = h.config.channel(ConfigSource::Api).unwrap();
    h.next("the file source's readiness ADD").await;
    assert!(
        !h.ready.all_ready(),
        "the api source has not sent a complete set yet"
    );
    api.send(SourceChange::Set(vec![])).await.unwrap();
    let update = h.next("the api source's readiness ADD").await;
    assert_eq!((update.op, update.source), (PodOp::Add, ConfigSource::Api));
    tokio::time::timeout(WAIT, h.ready.wait_all_ready())
        .await
        .expect("sources_ready never flipped after the api source's first set");
}
