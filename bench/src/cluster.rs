//! What the API benchmarks share: the `ironlet` binary they start, the load average they
//! print, waiting for a node to be Ready, and what it runs (busybox pods of a script, sleep
//! pods); [`PodWatch`], the watch that stamps when each bench pod was first seen Running and
//! Ready; [`teardown`], the end of every run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures_util::StreamExt;
use ironlet_e2e::{eventually, ClusterAgent, ControlPlane};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::json;

use crate::peer_node::PeerNode;

/// `IRONLET_BIN`, else the `ironlet` beside this executable (the same build profile).
pub fn ironlet_beside_this() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("IRONLET_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let bin = exe.with_file_name("ironlet");
    ensure!(
        bin.exists(),
        "{} missing: cargo build --release -p ironlet, or set IRONLET_BIN",
        bin.display()
    );
    Ok(bin)
}

/// Sets `IRONLET_BIN` (what `ClusterAgent` starts) to the `ironlet` beside this executable
/// unless it is set. Call it before any thread exists.
pub fn ironlet_bin_beside_this() -> Result<()> {
    if std::env::var_os("IRONLET_BIN").is_none() {
        std::env::set_var("IRONLET_BIN", ironlet_beside_this()?);
    }
    Ok(())
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Waits (up to 120 s) until node `node` exists with the Ready condition True.
pub async fn wait_node_ready(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(
        &format!("node {node} Ready"),
        Duration::from_secs(120),
        || async {
            let Some(n) = nodes.get_opt(node).await? else {
                return Ok(None);
            };
            let ready = n
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Ok(ready.then_some(()))
        },
    )
    .await
}

/// `node NAME: kubelet VERSION runtime RUNTIME` from the node's status.
pub async fn describe_node(client: &Client, node: &str) -> Result<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let info = nodes
        .get(node)
        .await?
        .status
        .and_then(|s| s.node_info)
        .context("node without nodeInfo")?;
    Ok(format!(
        "node {node}: kubelet {} runtime {}",
        info.kubelet_version, info.container_runtime_version
    ))
}

/// Deletes every pod matching `label` (1 s grace) and waits (up to 180 s) until the API has
/// none left, i.e. until their nodes confirmed the containers stopped.
pub async fn delete_labelled(pods: &Api<Pod>, label: &str) -> Result<()> {
    let params = DeleteParams::default().grace_period(1);
    let list = ListParams::default().labels(label);
    pods.delete_collection(&params, &list)
        .await
        .context("deleting the bench pods")?;
    eventually("every bench pod gone", Duration::from_secs(180), || async {
        Ok(pods.list(&list).await?.items.is_empty().then_some(()))
    })
    .await
}

/// A pod on `node` running `sh -c script` in busybox (container `main`, the imported image,
/// never restarted, 1 s grace) in `namespace`, labelled `key=value`.
pub fn busybox_pod(
    name: &str,
    namespace: &str,
    (key, value): (&str, &str),
    node: &str,
    script: &str,
) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace, "labels": { key: value } },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
            }],
        },
    }))?)
}

/// The bench pod `name` in `namespace`, labelled `ironlet-bench=BENCH`: busybox `sleep 3600`
/// (image present, never pulled), `restartPolicy: Always`, 1 s grace, bound to `node` when
/// given (else a static pod's manifest).
pub fn sleep_pod(
    name: &str,
    namespace: &str,
    bench: &str,
    node: Option<&str>,
) -> serde_json::Value {
    let mut spec = json!({
        "restartPolicy": "Always",
        // Both nodes use the host's resolv.conf (no cluster DNS here).
        "dnsPolicy": "Default",
        // No projected token volume: ironlet does not issue service-account tokens
        // (it skips that projection), kubelet would; like for like, neither gets one.
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "main",
            "image": "busybox",
            "imagePullPolicy": "Never",
            "command": ["sleep", "3600"],
        }],
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { "ironlet-bench": bench },
        },
        "spec": spec,
    })
}

/// [`delete_labelled`] of the bench pods in `namespace`, as the control plane's
/// administrator.
pub async fn delete_all_labelled(plane: &ControlPlane, namespace: &str, label: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(plane.admin_client().await?, namespace);
    delete_labelled(&pods, label).await
}

/// Ends an API benchmark whose measurement gave `outcome` and whose pods' removal gave
/// `cleanup`: after either failed, prints the tails of the agent's log and of the peer's;
/// then stops the runtime, the peer (`down`), the agent (its mounts, bridge and cgroups
/// removed) and the control plane, in that order, and prints the load average at the end.
/// Returns `outcome`, else `cleanup`.
pub fn teardown(
    rt: tokio::runtime::Runtime,
    plane: ControlPlane,
    agent: ClusterAgent,
    peer: Option<PeerNode>,
    outcome: Result<()>,
    cleanup: Result<()>,
) -> Result<()> {
    if outcome.is_err() || cleanup.is_err() {
        eprintln!("ironlet agent log tail:\n{}", agent.log_tail(40));
        if let Some(peer) = &peer {
            eprintln!("{}", peer.log_tails(30));
        }
    }
    drop(rt);
    drop(peer);
    drop(agent);
    drop(plane);
    println!("load average at end: {}", load_average());
    outcome.and(cleanup)
}

/// First sightings, on a [`PodWatch`], of a pod's phase Running and of its Ready condition
/// True.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodStamps {
    pub running: Option<Instant>,
    pub ready: Option<Instant>,
}

impl PodStamps {
    /// Records what `pod`, received at `now`, shows for the first time.
    fn stamp(&mut self, pod: &Pod, now: Instant) {
        let status = pod.status.as_ref();
        let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if running && self.running.is_none() {
            self.running = Some(now);
        }
        if ready && self.ready.is_none() {
            self.ready = Some(now);
        }
    }
}

/// The stamps of the pods a [`PodWatch`] saw, by name.
pub type Seen = HashMap<String, PodStamps>;

/// Applies one watch event received at `now` to `seen`: a pod's stamps are kept from its
/// first sighting until it is deleted (so a pod created again under the same name starts
/// afresh). Returns whether the event ends the initial list.
fn record(seen: &mut Seen, event: Event<Pod>, now: Instant) -> bool {
    match event {
        Event::Apply(pod) | Event::InitApply(pod) => {
            if let Some(name) = pod.metadata.name.clone() {
                seen.entry(name).or_default().stamp(&pod, now);
            }
        }
        Event::Delete(pod) => {
            if let Some(name) = pod.metadata.name {
                seen.remove(&name);
            }
        }
        Event::InitDone => return true,
        Event::Init => {}
    }
    false
}

/// A watch of the bench pods (by label) that stamps each one's first sightings of Running
/// and Ready, stamped when the event is received, for benchmarks that measure from a
/// POST or a manifest write to what the API shows. Stopped when dropped.
pub struct PodWatch {
    seen: Arc<Mutex<Seen>>,
    changes: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    /// Starts the watch of the pods of `pods` labelled `label` and returns once it has
    /// listed them (30 s at most), so that no later event is missed.
    pub async fn start(pods: Api<Pod>, label: &str) -> Result<Self> {
        let stream =
            watcher::watcher(pods, watcher::Config::default().labels(label)).default_backoff();
        Self::of(stream).await
    }

    /// The watch of `stream`'s events, once they have listed the pods (30 s at most).
    async fn of(
        stream: impl futures_util::Stream<Item = watcher::Result<Event<Pod>>> + Send + 'static,
    ) -> Result<Self> {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let (changed, changes) = tokio::sync::watch::channel(0u64);
        let (synced, is_synced) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(watch(stream, seen.clone(), changed, synced));
        let watch = Self {
            seen,
            changes,
            task,
        };
        tokio::time::timeout(Duration::from_secs(30), is_synced)
            .await
            .context("the pod watch did not sync within 30 s")?
            .context("the pod watch ended")?;
        Ok(watch)
    }

    /// Waits, at most `timeout`, until `check` of the stamps seen so far gives `Some`, and
    /// returns that; when the time is up, the error is `timed_out` of the stamps then.
    /// `waiting_for` names what is awaited should the watch end.
    pub async fn wait_until<T>(
        &mut self,
        timeout: Duration,
        waiting_for: &str,
        mut check: impl FnMut(&Seen) -> Option<T>,
        timed_out: impl FnOnce(&Seen) -> String,
    ) -> Result<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(done) = check(&lock(&self.seen)) {
                return Ok(done);
            }
            match tokio::time::timeout_at(deadline, self.changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => bail!("the pod watch ended while waiting for {waiting_for}"),
                Err(_) => bail!("{}", timed_out(&lock(&self.seen))),
            }
        }
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The watch's task: stamps each event when it is received, then tells the waiters.
async fn watch(
    stream: impl futures_util::Stream<Item = watcher::Result<Event<Pod>>>,
    seen: Arc<Mutex<Seen>>,
    changed: tokio::sync::watch::Sender<u64>,
    synced: tokio::sync::oneshot::Sender<()>,
) {
    futures_util::pin_mut!(stream);
    let mut synced = Some(synced);
    while let Some(event) = stream.next().await {
        let now = Instant::now();
        match event {
            Ok(event) => {
                if record(&mut lock(&seen), event, now) {
                    if let Some(synced) = synced.take() {
                        let _ = synced.send(());
                    }
                }
            }
            Err(err) => eprintln!("pod watch error (retrying): {err}"),
        }
        changed.send_modify(|v| *v += 1);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodCondition;
    use k8s_openapi::api::core::v1::PodStatus;

    use super::*;

    fn pod(name: &str, phase: &str, ready: bool) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.to_owned());
        pod.status = Some(PodStatus {
            phase: Some(phase.to_owned()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".to_owned(),
                status: if ready { "True" } else { "False" }.to_owned(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn each_state_is_stamped_at_its_first_sighting_only() {
        let t0 = Instant::now();
        let (t1, t2, t3) = (
            t0 + Duration::from_millis(1),
            t0 + Duration::from_millis(2),
            t0 + Duration::from_millis(3),
        );
        let mut seen = Seen::new();
        assert!(!record(
            &mut seen,
            Event::Apply(pod("a", "Pending", false)),
            t0
        ));
        assert_eq!(seen["a"], PodStamps::default());
        record(&mut seen, Event::Apply(pod("a", "Running", false)), t1);
        record(&mut seen, Event::Apply(pod("a", "Running", true)), t2);
        record(&mut seen, Event::Apply(pod("a", "Running", true)), t3);
        assert_eq!(
            seen["a"],
            PodStamps {
                running: Some(t1),
                ready: Some(t2)
            }
        );
    }

    #[test]
    fn a_deleted_pod_is_forgotten_and_the_initial_list_ends_at_init_done() {
        let t0 = Instant::now();
        let mut seen = Seen::new();
        assert!(!record(&mut seen, Event::Init, t0));
        assert!(!record(
            &mut seen,
            Event::InitApply(pod("a", "Running", true)),
            t0
        ));
        assert!(record(&mut seen, Event::InitDone, t0));
        assert_eq!(seen["a"].running, Some(t0));
        record(&mut seen, Event::Delete(pod("a", "Running", true)), t0);
        assert!(seen.is_empty());
        // Created again under the same name: stamped afresh.
        let t1 = t0 + Duration::from_millis(1);
        record(&mut seen, Event::Apply(pod("a", "Running", false)), t1);
        assert_eq!(seen["a"].running, Some(t1));
        assert_eq!(seen["a"].ready, None);
    }

    fn running_and_ready(name: &'static str) -> impl FnMut(&Seen) -> Option<PodStamps> {
        move |seen| {
            let stamps = seen.get(name).copied().unwrap_or_default();
            (stamps.running.is_some() && stamps.ready.is_some()).then_some(stamps)
        }
    }

    #[tokio::test]
    async fn a_waiter_gets_the_stamps_of_a_later_event_or_its_own_message_when_time_is_up() {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|event| (Ok(event), rx))
        });
        events
            .send(Event::InitDone)
            .expect("the watch reads events");
        let mut watch = PodWatch::of(stream).await.expect("synced");
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = events.send(Event::Apply(pod("a", "Running", true)));
            events
        });
        let stamps = watch
            .wait_until(Duration::from_secs(10), "a", running_and_ready("a"), |_| {
                "a never came".into()
            })
            .await
            .expect("a is Running and Ready");
        assert!(stamps.running.is_some() && stamps.running == stamps.ready);
        let events = late.await.expect("the sender task");
        let err = watch
            .wait_until(
                Duration::from_millis(50),
                "b",
                running_and_ready("b"),
                |seen| format!("b not Ready; {} pod seen", seen.len()),
            )
            .await
            .expect_err("b never comes");
        assert_eq!(err.to_string(), "b not Ready; 1 pod seen");
        drop(events);
        let err = watch
            .wait_until(Duration::from_secs(10), "b", running_and_ready("b"), |_| {
                String::new()
            })
            .await
            .expect_err("the watch ended");
        assert_eq!(err.to_string(), "the pod watch ended while waiting for b");
    }
}
