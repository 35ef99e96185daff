//! Unit tests of [`ProbeManager`] with a scripted prober and paused time: worker start and
//! stop, per-container-id results, startup gating, invalid probes.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ExecAction, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::probes::worker::fake::ScriptedProber;
use crate::probes::ProbeOutcome;

const UID: &str = "pod-uid";

fn exec_probe(script: &str) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![script.to_owned()]),
        }),
        period_seconds: Some(1),
        ..Probe::default()
    }
}

fn pod(containers: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some(UID.into()),
            name: Some("web".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers,
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        ..Container::default()
    }
}

fn running(name: &str) -> RunningContainer {
    RunningContainer {
        name: name.into(),
        id: ContainerId::random(),
        started_at: SystemTime::now(),
        carried: Default::default(),
    }
}

fn manager() -> (
    ProbeManager,
    mpsc::UnboundedReceiver<ProbeUpdate>,
    Arc<ScriptedProber>,
) {
    let prober = Arc::new(ScriptedProber::default());
    let (manager, rx) = ProbeManager::with_runner(prober.clone());
    (manager, rx, prober)
}

fn fail() -> ProbeOutcome {
    ProbeOutcome::Failure("nope".into())
}

/// The next update that publishes a result, skipping those that only carry a run's event.
fn next_result(rx: &mut mpsc::UnboundedReceiver<ProbeUpdate>) -> Option<ProbeUpdate> {
    std::iter::from_fn(|| rx.try_recv().ok()).find(|u| u.event.is_none())
}

async fn settle(secs: f64) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
}

#[tokio::test(start_paused = true)]
async fn a_container_without_probes_is_started_and_ready_once_running() {
    let (m, _rx, _) = manager();
    let c = running("app");
    assert_eq!(m.readiness(UID, "app"), None, "unknown before update_pod");
    m.update_pod(
        &pod(vec![container("app")]),
        std::slice::from_ref(&c),
        &ProbeNetwork::default(),
    );
    assert_eq!(m.startup_done(UID, "app", &c.id), Some(true));
    assert!(m.is_ready(UID, "app", &c.id));
    assert_eq!(m.readiness(UID, "app"), Some(true));
    assert!(
        !m.is_ready(UID, "app", &ContainerId::random()),
        "another id"
    );
}

#[tokio::test(start_paused = true)]
async fn readiness_starts_not_ready_and_turns_ready_after_a_success() {
    let (m, mut rx, prober) = manager();
    prober.script("ready", [fail(), ProbeOutcome::Success]);
    let c = running("app");
    let spec = Container {
        readiness_probe: Some(exec_probe("ready")),
        ..container("app")
    };
    m.update_pod(
        &pod(vec![spec]),
        std::slice::from_ref(&c),
        &ProbeNetwork::default(),
    );
    assert!(!m.is_ready(UID, "app", &c.id));
    settle(0.5).await;
    assert!(!m.is_ready(UID, "app", &c.id), "ready after a failure");
    settle(1.0).await;
    assert!(m.is_ready(UID, "app", &c.id));
    let update = next_result(&mut rx).expect("a readiness update");
    assert_eq!(
        (update.kind, update.result, update.container_id),
        (ProbeKind::Readiness, ProbeResult::Success, c.id.clone())
    );
}

#[tokio::test(start_paused = true)]
async fn a_startup_probe_holds_liveness_and_readiness_back_until_it_succeeds() {
    let (m, _rx, prober) = manager();
    prober.script("start", [fail(), fail()]);
    let c = running("app");
    let spec = Container {
        startup_probe: Some(Probe {
            failure_threshold: Some(10),
            ..exec_probe("start")
        }),
        liveness_probe: Some(exec_probe("live")),
        readiness_probe: Some(exec_probe("ready")),
        ..container("app")
    };
    m.update_pod(
        &pod(vec![spec]),
        std::slice::from_ref(&c),
        &ProbeNetwork::default(),
    );
    settle(1.5).await;
    assert_eq!(m.startup_done(UID, "app", &c.id), Some(false));
    assert!(!m.is_ready(UID, "app", &c.id));
    assert!(prober.calls_of("live").is_empty() && prober.calls_of("ready").is_empty());
    settle(1.0).await;
    assert_eq!(m.startup_done(UID, "app", &c.id), Some(true));
    assert!(m.is_ready(UID, "app", &c.id));
    assert_eq!(prober.calls_of("live").len(), 1);
    assert_eq!(
        prober.calls_of("start").len(),
        3,
        "startup probed after success"
    );
}

#[tokio::test(start_paused = true)]
async fn a_liveness_failure_is_reported_and_names_the_restart_reason() {
    let (m, mut rx, prober) = manager();
    prober.script("live", [fail(), fail(), fail()]);
    let c = running("app");
    let spec = Container {
        liveness_probe: Some(exec_probe("live")),
        ..container("app")
    };
    m.update_pod(
        &pod(vec![spec]),
        std::slice::from_ref(&c),
        &ProbeNetwork::default(),
    );
    settle(1.5).await;
    assert!(
        !m.liveness_failed(UID, "app", &c.id),
        "failed before the threshold"
    );
    settle(1.0).await;
    assert!(m.liveness_failed(UID, "app", &c.id));
    assert_eq!(
        m.restart_reason(UID, "app", &c.id),
        Some(ProbeKind::Liveness)
    );
    assert_eq!(
        m.message(UID, "app", &c.id, ProbeKind::Liveness).as_deref(),
        Some("nope")
    );
    let update = next_result(&mut rx).expect("a liveness update");
    assert_eq!(
        (update.kind, update.result),
        (ProbeKind::Liveness, ProbeResult::Failure)
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_container_id_starts_from_the_initial_results_and_stops_the_old_workers() {
    let (m, _rx, prober) = manager();
    prober.script("live", [fail(), fail(), fail()]);
    let spec = Container {
        liveness_probe: Some(exec_probe("live")),
        readiness_probe: Some(exec_probe("ready")),
        ..container("app")
    };
    let first = running("app");
    let p = pod(vec![spec]);
    m.update_pod(&p, std::slice::from_ref(&first), &ProbeNetwork::default());
    settle(2.5).await;
    assert!(m.liveness_failed(UID, "app", &first.id));
    assert!(m.is_ready(UID, "app", &first.id));
    let second = running("app");
    m.update_pod(&p, std::slice::from_ref(&second), &ProbeNetwork::default());
    assert!(!m.liveness_failed(UID, "app", &second.id));
    assert!(
        !m.is_ready(UID, "app", &second.id),
        "readiness carried over"
    );
    assert!(
        !m.liveness_failed(UID, "app", &first.id),
        "old results kept"
    );
    settle(3.0).await;
    let old_runs = prober
        .calls
        .lock()
        .expect("calls lock")
        .iter()
        .filter(|(_, id, _)| *id == first.id)
        .count();
    assert_eq!(old_runs, 3 + 3, "old workers kept probing: {old_runs}");
    assert!(m.is_ready(UID, "app", &second.id));
}

#[tokio::test(start_paused = true)]
async fn update_pod_is_idempotent_and_remove_pod_stops_everything() {
    let (m, _rx, prober) = manager();
    let c = running("app");
    let p = pod(vec![Container {
        readiness_probe: Some(exec_probe("ready")),
        ..container("app")
    }]);
    m.update_pod(&p, std::slice::from_ref(&c), &ProbeNetwork::default());
    settle(0.5).await;
    m.update_pod(&p, std::slice::from_ref(&c), &ProbeNetwork::default());
    settle(1.0).await;
    // One worker: probes at 0 s and 1 s, not restarted at 0.5 s.
    assert_eq!(prober.calls_of("ready").len(), 2);
    m.remove_pod(UID);
    assert_eq!(m.readiness(UID, "app"), None);
    settle(3.0).await;
    assert_eq!(
        prober.calls_of("ready").len(),
        2,
        "probing after remove_pod"
    );
    assert_eq!(m.results.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_container_that_stops_running_loses_its_workers() {
    let (m, _rx, prober) = manager();
    let c = running("app");
    let p = pod(vec![Container {
        readiness_probe: Some(exec_probe("ready")),
        ..container("app")
    }]);
    m.update_pod(&p, std::slice::from_ref(&c), &ProbeNetwork::default());
    settle(0.5).await;
    m.update_pod(&p, &[], &ProbeNetwork::default());
    settle(3.0).await;
    assert_eq!(prober.calls_of("ready").len(), 1);
    assert_eq!(m.startup_done(UID, "app", &c.id), None);
}

#[tokio::test(start_paused = true)]
async fn the_initial_delay_counts_from_the_container_start() {
    let (m, _rx, prober) = manager();
    let t0 = tokio::time::Instant::now();
    let c = RunningContainer {
        started_at: SystemTime::now() - Duration::from_secs(3),
        ..running("app")
    };
    let p = pod(vec![Container {
        readiness_probe: Some(Probe {
            initial_delay_seconds: Some(5),
            ..exec_probe("ready")
        }),
        ..container("app")
    }]);
    m.update_pod(&p, &[c], &ProbeNetwork::default());
    settle(2.5).await;
    let runs = prober.calls_of("ready");
    assert_eq!(runs.len(), 1, "runs {runs:?}");
    let after = runs[0] - t0;
    assert!(
        after > Duration::from_millis(1900) && after <= Duration::from_secs(2),
        "first probe {after:?} after start-up"
    );
}

#[tokio::test(start_paused = true)]
async fn an_invalid_probe_is_not_run_and_keeps_the_initial_result_with_its_reason() {
    let (m, _rx, prober) = manager();
    let c = running("app");
    let p = pod(vec![Container {
        readiness_probe: Some(Probe::default()),
        liveness_probe: Some(exec_probe("live")),
        ..container("app")
    }]);
    m.update_pod(&p, std::slice::from_ref(&c), &ProbeNetwork::default());
    settle(1.5).await;
    assert!(!m.is_ready(UID, "app", &c.id));
    assert_eq!(
        m.message(UID, "app", &c.id, ProbeKind::Readiness)
            .as_deref(),
        Some("Readiness probe: no action is set")
    );
    assert_eq!(prober.calls_of("live").len(), 2, "valid probes still run");
}

#[tokio::test(start_paused = true)]
async fn restartable_init_containers_are_probed_and_other_init_containers_are_not() {
    let (m, _rx, prober) = manager();
    let sidecar = Container {
        restart_policy: Some("Always".into()),
        readiness_probe: Some(exec_probe("sidecar")),
        ..container("sidecar")
    };
    let init = Container {
        readiness_probe: Some(exec_probe("init")),
        ..container("init")
    };
    let mut p = pod(vec![container("app")]);
    if let Some(spec) = p.spec.as_mut() {
        spec.init_containers = Some(vec![init, sidecar]);
    }
    m.update_pod(
        &p,
        &[running("init"), running("sidecar"), running("app")],
        &ProbeNetwork::default(),
    );
    settle(0.5).await;
    assert_eq!(prober.calls_of("sidecar").len(), 1);
    assert!(prober.calls_of("init").is_empty());
    assert_eq!(m.readiness(UID, "init"), None);
}

#[tokio::test(start_paused = true)]
async fn a_re_adopted_container_carries_readiness_and_started_until_its_probes_say_otherwise() {
    let (m, mut rx, prober) = manager();
    // Readiness fails from now on: failureThreshold (3) runs later it turns not ready.
    prober.script("ready", [fail(), fail(), fail()]);
    let c = RunningContainer {
        carried: Carried {
            started: true,
            ready: true,
        },
        ..running("app")
    };
    let spec = Container {
        startup_probe: Some(exec_probe("start")),
        readiness_probe: Some(Probe {
            failure_threshold: Some(3),
            ..exec_probe("ready")
        }),
        ..container("app")
    };
    m.update_pod(
        &pod(vec![spec]),
        std::slice::from_ref(&c),
        &ProbeNetwork::default(),
    );
    assert_eq!(m.startup_done(UID, "app", &c.id), Some(true));
    assert!(m.is_ready(UID, "app", &c.id), "ready from the first moment");
    settle(1.5).await;
    assert!(
        m.is_ready(UID, "app", &c.id),
        "two failures are below the threshold"
    );
    assert_eq!(next_result(&mut rx), None, "no update: nothing changed");
    settle(1.0).await;
    assert!(!m.is_ready(UID, "app", &c.id), "the third failure counts");
    assert!(
        prober.calls_of("start").is_empty(),
        "a started container's startup probe is not run again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_re_adopted_container_that_was_not_ready_waits_for_its_probe() {
    let (m, _rx, _) = manager();
    let c = RunningContainer {
        carried: Carried {
            started: true,
            ready: false,
        },
        ..running("app")
    };
    let spec = Container {
        readiness_probe: Some(exec_probe("ready")),
        ..container("app")
    };
    m.update_pod(
        &pod(vec![spec]),
        std::slice::from_ref(&c),
        &ProbeNetwork::default(),
    );
    assert!(!m.is_ready(UID, "app", &c.id));
    settle(1.5).await;
    assert!(m.is_ready(UID, "app", &c.id), "its probe succeeded");
}

#[tokio::test(start_paused = true)]
async fn a_terminating_pod_keeps_readiness_probes_but_stops_liveness_with_a_success() {
    let (m, _rx, prober) = manager();
    let c = running("app");
    let p = pod(vec![Container {
        readiness_probe: Some(exec_probe("ready")),
        liveness_probe: Some(Probe {
            failure_threshold: Some(1),
            ..exec_probe("live")
        }),
        ..container("app")
    }]);
    m.update_pod(&p, std::slice::from_ref(&c), &ProbeNetwork::default());
    settle(1.5).await;
    assert!(m.is_ready(UID, "app", &c.id));
    m.stop_liveness_and_startup(UID);
    let live_runs = prober.calls_of("live").len();
    prober.script("live", vec![fail(); 10]);
    prober.script("ready", vec![fail(); 10]);
    settle(3.0).await;
    assert_eq!(
        prober.calls_of("live").len(),
        live_runs,
        "liveness probed on"
    );
    assert!(!m.liveness_failed(UID, "app", &c.id));
    assert_eq!(m.restart_reason(UID, "app", &c.id), None);
    assert!(
        !m.is_ready(UID, "app", &c.id),
        "readiness is still probed and now fails"
    );
}
