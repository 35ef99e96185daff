//! Unit tests of the worker state machine with a recording syncer (the real syncer is
//! covered by the static-pod end-to-end tests in `agent/tests/`).

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::mpsc;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Sync(String, String),
    Terminating(String, Duration),
    Terminated(String),
}

struct Recorder {
    calls: mpsc::UnboundedSender<Call>,
    /// Pods whose sync reports them terminal.
    terminal: Mutex<HashSet<String>>,
    sync_delay: Duration,
}

#[async_trait]
impl PodSyncer for Recorder {
    async fn sync_pod(&self, pod: &Arc<Pod>, _: Instant) -> Result<SyncOutcome, SyncError> {
        tokio::time::sleep(self.sync_delay).await;
        let uid = pod_uid(pod).to_owned();
        let image = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("v").cloned())
            .unwrap_or_default();
        let _ = self.calls.send(Call::Sync(uid.clone(), image));
        let terminal = self
            .terminal
            .lock()
            .map(|t| t.contains(&uid))
            .unwrap_or(false);
        Ok(if terminal {
            SyncOutcome::Terminal
        } else {
            SyncOutcome::Running { resync_after: None }
        })
    }
    async fn sync_terminating_pod(
        &self,
        pod: &Arc<Pod>,
        grace: Duration,
        _: Instant,
    ) -> Result<(), SyncError> {
        let _ = self
            .calls
            .send(Call::Terminating(pod_uid(pod).to_owned(), grace));
        Ok(())
    }
    async fn sync_terminated_pod(&self, pod: &Arc<Pod>) -> Result<(), SyncError> {
        let _ = self.calls.send(Call::Terminated(pod_uid(pod).to_owned()));
        Ok(())
    }
}

fn pod(uid: &str, version: &str, grace: i64) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(format!("p-{uid}")),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            labels: Some([("v".to_owned(), version.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: Some(grace),
            ..Default::default()
        }),
        ..Pod::default()
    })
}

fn workers(delay: Duration) -> (PodWorkers, mpsc::UnboundedReceiver<Call>, Arc<Recorder>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let recorder = Arc::new(Recorder {
        calls: tx,
        terminal: Mutex::new(HashSet::new()),
        sync_delay: delay,
    });
    let workers = PodWorkers::new(recorder.clone(), PodWorkersConfig::default());
    (workers, rx, recorder)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Call>) -> Call {
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Some(call)) => call,
        other => panic!("no worker call within 5 s (worker deadlocked?): {other:?}"),
    }
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn a_new_pod_is_synced_and_could_have_running_containers() {
    let (w, mut rx, _) = workers(Duration::ZERO);
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("a", "1", 30)));
    assert_eq!(next(&mut rx).await, Call::Sync("a".into(), "1".into()));
    assert!(w.could_have_running_containers("a"));
    assert!(!w.is_pod_termination_requested("a"));
    assert!(!w.should_pod_content_be_removed("a"));
}

#[tokio::test]
async fn updates_arriving_during_a_sync_are_coalesced_to_the_newest_spec() {
    let (w, mut rx, _) = workers(Duration::from_millis(100));
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("a", "1", 30)));
    settle().await;
    for v in ["2", "3", "4"] {
        w.update_pod(UpdatePodOptions::new(UpdateType::Update, pod("a", v, 30)));
    }
    assert_eq!(next(&mut rx).await, Call::Sync("a".into(), "1".into()));
    assert_eq!(next(&mut rx).await, Call::Sync("a".into(), "4".into()));
    settle().await;
    assert!(rx.try_recv().is_err(), "coalesced updates must sync once");
}

#[tokio::test]
async fn kill_runs_terminating_then_terminated_once_and_completes() {
    let (w, mut rx, _) = workers(Duration::ZERO);
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("a", "1", 30)));
    assert!(matches!(next(&mut rx).await, Call::Sync(..)));
    let (done_tx, done_rx) = oneshot::channel();
    w.update_pod(UpdatePodOptions {
        update_type: UpdateType::Kill,
        pod: pod("a", "1", 30),
        kill: Some(KillPodOptions {
            grace_period_override: Some(2),
            completed: Some(done_tx),
        }),
    });
    assert_eq!(
        next(&mut rx).await,
        Call::Terminating("a".into(), Duration::from_secs(2))
    );
    assert_eq!(next(&mut rx).await, Call::Terminated("a".into()));
    assert!(tokio::time::timeout(Duration::from_secs(5), done_rx)
        .await
        .is_ok());
    assert!(w.is_pod_terminated("a"));
    assert!(!w.could_have_running_containers("a"));
    assert!(w.should_pod_content_be_removed("a"));
    settle().await;
    assert!(rx.try_recv().is_err(), "a finished pod is not synced again");
}

#[tokio::test]
async fn a_terminal_pod_terminates_with_its_spec_grace_period() {
    let (w, mut rx, rec) = workers(Duration::ZERO);
    if let Ok(mut t) = rec.terminal.lock() {
        t.insert("a".into());
    }
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("a", "1", 7)));
    assert!(matches!(next(&mut rx).await, Call::Sync(..)));
    assert_eq!(
        next(&mut rx).await,
        Call::Terminating("a".into(), Duration::from_secs(7))
    );
    assert_eq!(next(&mut rx).await, Call::Terminated("a".into()));
}

#[tokio::test]
async fn terminated_uid_restarts_only_after_it_finished() {
    let (w, mut rx, _) = workers(Duration::ZERO);
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("a", "1", 0)));
    assert!(matches!(next(&mut rx).await, Call::Sync(..)));
    w.update_pod(UpdatePodOptions::new(UpdateType::Kill, pod("a", "1", 0)));
    // Re-added while terminating: must not sync before cleanup finished.
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("a", "2", 0)));
    assert!(matches!(next(&mut rx).await, Call::Terminating(..)));
    assert_eq!(next(&mut rx).await, Call::Terminated("a".into()));
    assert_eq!(next(&mut rx).await, Call::Sync("a".into(), "2".into()));
    assert!(w.could_have_running_containers("a"));
}

#[tokio::test]
async fn a_finished_uid_added_again_gets_a_new_worker() {
    let (w, mut rx, _) = workers(Duration::ZERO);
    w.update_pod(UpdatePodOptions::new(UpdateType::Kill, pod("a", "1", 0)));
    assert!(matches!(next(&mut rx).await, Call::Terminating(..)));
    assert!(matches!(next(&mut rx).await, Call::Terminated(..)));
    settle().await;
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("a", "2", 0)));
    assert_eq!(next(&mut rx).await, Call::Sync("a".into(), "2".into()));
}

#[tokio::test]
async fn a_shorter_grace_period_wins_while_terminating() {
    let (w, _rx, _) = workers(Duration::ZERO);
    // No task runs between these calls on a current-thread runtime.
    w.update_pod(UpdatePodOptions {
        update_type: UpdateType::Kill,
        pod: pod("a", "1", 30),
        kill: None,
    });
    w.update_pod(UpdatePodOptions {
        update_type: UpdateType::Kill,
        pod: pod("a", "1", 30),
        kill: Some(KillPodOptions {
            grace_period_override: Some(1),
            completed: None,
        }),
    });
    let grace = match w.pod("a").map(|(_, l)| l) {
        Some(PodLifecycle::Terminating { grace, .. }) => Some(grace),
        _ => None,
    };
    assert_eq!(grace, Some(Duration::from_secs(1)));
}

#[tokio::test]
async fn unknown_uids_are_assumed_running_until_known_pods_are_synced() {
    let (w, _rx, _) = workers(Duration::ZERO);
    assert!(w.could_have_running_containers("ghost"));
    assert!(!w.should_pod_runtime_be_removed("ghost"));
    w.sync_known_pods(&HashSet::new());
    assert!(!w.could_have_running_containers("ghost"));
    assert!(w.should_pod_runtime_be_removed("ghost"));
}

#[tokio::test]
async fn sync_known_pods_forgets_finished_workers_of_undesired_pods() {
    let (w, mut rx, _) = workers(Duration::ZERO);
    w.update_pod(UpdatePodOptions::new(UpdateType::Kill, pod("a", "1", 0)));
    w.update_pod(UpdatePodOptions::new(UpdateType::Create, pod("b", "1", 0)));
    for _ in 0..3 {
        next(&mut rx).await;
    }
    settle().await;
    let states = w.sync_known_pods(&["b".to_owned()].into());
    assert_eq!(states.get("a"), Some(&PodLifecycle::Finished));
    assert_eq!(states.get("b"), Some(&PodLifecycle::Syncing));
    assert_eq!(w.known_uids(), vec!["b".to_owned()]);
}
