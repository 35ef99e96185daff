//! Container garbage collection — kubelet's `containerGC` (`kuberuntime_gc.go`), run once
//! at start and every minute: dead containers beyond kubelet's `GCPolicy` are removed with
//! their log files, then sandboxes without containers that are no longer needed.
//!
//! The policy (`--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`,
//! `--maximum-dead-containers`) is applied as kubelet applies it:
//! - a container is evictable once it is not running and was created at least `min_age` ago;
//!   evictable containers are grouped by (pod UID, container name);
//! - every evictable container of a pod whose content may go (deleted and terminated) is
//!   removed, once all pod sources are ready;
//! - each group keeps its `max_per_pod_container` newest instances (negative: no limit);
//! - above `max_containers` (negative: no limit), every group is cut to an even share (at
//!   least 1), then the oldest go node-wide.
//!
//! One deviation, needed by ironlet: the newest dead instance of each container of a pod
//! still wanted is never removed, whatever the limits. `kubectl logs --previous` reads it,
//! the status's `lastState` comes from it, and the init walk (`sync::init`) needs the newest
//! instance of each finished init container. kubelet keeps these in its status cache and
//! container labels instead; with the default policy the result is the same.
//!
//! Sandboxes (`evictSandboxes`): one that is not ready and has no container left is
//! removed, except the newest of a pod still wanted. Log directories of removed pods are
//! housekeeping's business.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ironlet_runtime::types::{
    ContainerFilter, ContainerId, ContainerState, ContainerStatus, PodSandboxStatus, SandboxId,
    SandboxState,
};

use super::Kubelet;
use crate::config::pod_uid;
use crate::sync::labels;

/// kubelet's `GCPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    /// `--minimum-container-ttl-duration` (kubelet default 0).
    pub min_age: Duration,
    /// `--maximum-dead-containers-per-container` (kubelet default 1; negative: no limit).
    pub max_per_pod_container: i64,
    /// `--maximum-dead-containers` (kubelet default -1: no limit).
    pub max_containers: i64,
}

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// One container that is not running, as the selection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadContainer {
    pub id: ContainerId,
    pub pod_uid: String,
    pub name: String,
    pub created_at: SystemTime,
}

/// kubelet's `evictContainers` as a pure function: which of the `dead` containers to remove
/// at `now`. `pod_removed(uid)` says whether a pod's content may go (it is deleted and
/// terminated; kubelet's `ShouldPodContentBeRemoved`), false while sources are not ready.
pub fn select_containers(
    dead: &[DeadContainer],
    policy: &GcPolicy,
    now: SystemTime,
    pod_removed: impl Fn(&str) -> bool,
) -> Vec<ContainerId> {
    let newest_gc_time = now.checked_sub(policy.min_age);
    let mut units: HashMap<(&str, &str), Vec<&DeadContainer>> = HashMap::new();
    for c in dead {
        units
            .entry((c.pod_uid.as_str(), c.name.as_str()))
            .or_default()
            .push(c);
    }
    let mut victims = Vec::new();
    // Per unit: evictable instances newest first, and the one never to remove.
    let mut kept: HashMap<(&str, &str), Vec<&DeadContainer>> = HashMap::new();
    let mut protected: HashSet<&ContainerId> = HashSet::new();
    for (key, mut all) in units {
        all.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let removed = pod_removed(key.0);
        if !removed {
            protected.insert(&all[0].id);
        }
        let evictable: Vec<&DeadContainer> = all
            .into_iter()
            .filter(|c| newest_gc_time.is_some_and(|t| c.created_at <= t))
            .collect();
        if removed {
            victims.extend(evictable.iter().map(|c| c.id.clone()));
        } else if !evictable.is_empty() {
            kept.insert(key, evictable);
        }
    }
    let mut enforce = |kept: &mut HashMap<_, Vec<&DeadContainer>>, limit: usize| {
        for unit in kept.values_mut() {
            let cut: Vec<&DeadContainer> = unit.split_off(limit.min(unit.len()));
            for c in cut {
                if protected.contains(&c.id) {
                    unit.push(c);
                } else {
                    victims.push(c.id.clone());
                }
            }
        }
    };
    if let Ok(limit) = usize::try_from(policy.max_per_pod_container) {
        enforce(&mut kept, limit);
    }
    let total = |kept: &HashMap<_, Vec<&DeadContainer>>| kept.values().map(Vec::len).sum::<usize>();
    if let Ok(max) = usize::try_from(policy.max_containers) {
        if total(&kept) > max {
            let share = (max / kept.len().max(1)).max(1);
            enforce(&mut kept, share);
            let count = total(&kept);
            if count > max {
                let mut flat: Vec<&DeadContainer> = kept.into_values().flatten().collect();
                flat.sort_by_key(|c| c.created_at);
                victims.extend(
                    flat.into_iter()
                        .filter(|c| !protected.contains(&c.id))
                        .take(count - max)
                        .map(|c| c.id.clone()),
                );
            }
        }
    }
    victims
}

/// One sandbox, as the selection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    pub id: SandboxId,
    pub pod_uid: String,
    pub created_at: SystemTime,
    /// Ready, or still holding a container: never removed.
    pub active: bool,
}

/// kubelet's `evictSandboxes`: inactive sandboxes of removed pods, and inactive ones but
/// the newest of other pods.
pub fn select_sandboxes(
    sandboxes: &[SandboxInfo],
    pod_removed: impl Fn(&str) -> bool,
) -> Vec<SandboxId> {
    let mut by_pod: HashMap<&str, Vec<&SandboxInfo>> = HashMap::new();
    for s in sandboxes {
        by_pod.entry(s.pod_uid.as_str()).or_default().push(s);
    }
    let mut victims = Vec::new();
    for (uid, mut list) in by_pod {
        list.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let skip = usize::from(!pod_removed(uid));
        victims.extend(
            list.into_iter()
                .skip(skip)
                .filter(|s| !s.active)
                .map(|s| s.id.clone()),
        );
    }
    victims
}

/// The pod a container belongs to: its sandbox's, else its label.
fn container_pod_uid(c: &ContainerStatus, sandboxes: &HashMap<&SandboxId, &str>) -> String {
    sandboxes
        .get(&c.sandbox_id)
        .map(|uid| (*uid).to_owned())
        .or_else(|| c.labels.get(labels::POD_UID).cloned())
        .unwrap_or_default()
}

impl Kubelet {
    /// kubelet's `containerGC.GarbageCollect`.
    pub(super) async fn garbage_collect(&self) {
        let all_sources_ready = self.pod_config.all_sources_ready();
        let desired: HashSet<String> = self
            .lock_manager()
            .pods()
            .iter()
            .map(|p| pod_uid(p).to_owned())
            .collect();
        let pod_removed = |uid: &str| {
            all_sources_ready
                && !desired.contains(uid)
                && self.workers.should_pod_content_be_removed(uid)
        };
        let (sandboxes, containers) = match self.list_runtime().await {
            Some(listed) => listed,
            None => return,
        };
        let uids: HashMap<&SandboxId, &str> = sandboxes
            .iter()
            .map(|s| (&s.id, s.config.pod_uid.as_str()))
            .collect();
        let dead: Vec<DeadContainer> = containers
            .iter()
            .filter(|c| c.state != ContainerState::Running)
            .map(|c| DeadContainer {
                id: c.id.clone(),
                pod_uid: container_pod_uid(c, &uids),
                name: c.name.clone(),
                created_at: c.created_at,
            })
            .collect();
        let victims = select_containers(
            &dead,
            &self.config.gc_policy,
            SystemTime::now(),
            pod_removed,
        );
        let logs: HashMap<&ContainerId, &PathBuf> =
            containers.iter().map(|c| (&c.id, &c.log_path)).collect();
        let mut removed = 0;
        for id in &victims {
            // kubelet's removeContainer: the log file first, then the container.
            if let Some(path) = logs.get(id) {
                remove_log_file(path);
            }
            match self.runtime.remove_container(id).await {
                Ok(()) => removed += 1,
                Err(err) => {
                    tracing::warn!(container_id = %id, %err, "Failed to remove container")
                }
            }
        }
        if removed > 0 {
            tracing::info!(removed, "garbage collected dead containers");
        }

        let Some((sandboxes, containers)) = self.list_runtime().await else {
            return;
        };
        let holding: HashSet<&SandboxId> = containers.iter().map(|c| &c.sandbox_id).collect();
        let infos: Vec<SandboxInfo> = sandboxes
            .iter()
            .map(|s| SandboxInfo {
                id: s.id.clone(),
                pod_uid: s.config.pod_uid.clone(),
                created_at: s.created_at,
                active: s.state == SandboxState::Ready || holding.contains(&s.id),
            })
            .collect();
        for id in select_sandboxes(&infos, pod_removed) {
            match self.runtime.remove_pod_sandbox(&id).await {
                Ok(()) => tracing::info!(sandbox = %id, "garbage collected sandbox"),
                Err(err) => tracing::warn!(sandbox = %id, %err, "Failed to remove sandbox"),
            }
        }
    }

    async fn list_runtime(&self) -> Option<(Vec<PodSandboxStatus>, Vec<ContainerStatus>)> {
        let all = ContainerFilter::default();
        match tokio::try_join!(
            self.runtime.list_pod_sandboxes(),
            self.runtime.list_containers(&all)
        ) {
            Ok(listed) => Some(listed),
            Err(err) => {
                tracing::warn!(%err, "container garbage collection: listing the runtime failed");
                None
            }
        }
    }
}

fn remove_log_file(path: &PathBuf) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => tracing::warn!(path = %path.display(), %err, "removing container log failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    fn dead(id: &str, uid: &str, name: &str, created: u64) -> DeadContainer {
        DeadContainer {
            id: ContainerId::parse(id).expect("test id"),
            pod_uid: uid.into(),
            name: name.into(),
            created_at: t(created),
        }
    }

    fn ids(victims: Vec<ContainerId>) -> Vec<String> {
        let mut v: Vec<String> = victims
            .into_iter()
            .map(|id| id.as_str().to_owned())
            .collect();
        v.sort();
        v
    }

    fn policy(min_age: u64, per: i64, max: i64) -> GcPolicy {
        GcPolicy {
            min_age: Duration::from_secs(min_age),
            max_per_pod_container: per,
            max_containers: max,
        }
    }

    #[test]
    fn default_keeps_the_newest_dead_instance_per_container() {
        let list = [
            dead("a0", "p", "app", 0),
            dead("a1", "p", "app", 10),
            dead("a2", "p", "app", 20),
            dead("s0", "p", "side", 5),
            dead("q0", "q", "app", 1),
        ];
        let victims = select_containers(&list, &GcPolicy::default(), t(100), |_| false);
        assert_eq!(ids(victims), ["a0", "a1"]);
    }

    #[test]
    fn per_container_limit_and_no_limit() {
        let list: Vec<_> = (0..5)
            .map(|i| dead(&format!("c{i}"), "p", "app", i))
            .collect();
        let victims = select_containers(&list, &policy(0, 3, -1), t(100), |_| false);
        assert_eq!(ids(victims), ["c0", "c1"]);
        assert!(select_containers(&list, &policy(0, -1, -1), t(100), |_| false).is_empty());
    }

    #[test]
    fn younger_than_min_age_is_kept_and_does_not_count() {
        // Created at 0, 20, …, 80; at 95 with a 30 s minimum age c4 is too young (not
        // evictable, not counted): of c0..c3 the newest one is kept.
        let list: Vec<_> = (0..5)
            .map(|i| dead(&format!("c{i}"), "p", "app", i * 20))
            .collect();
        let victims = select_containers(&list, &policy(30, 1, -1), t(95), |_| false);
        assert_eq!(ids(victims), ["c0", "c1", "c2"]);
        // Nothing is old enough: nothing goes.
        assert!(select_containers(&list, &policy(300, 0, 0), t(95), |_| false).is_empty());
    }

    #[test]
    fn the_last_terminated_instance_survives_any_limit() {
        let list: Vec<_> = (0..3)
            .map(|i| dead(&format!("c{i}"), "p", "app", i))
            .collect();
        assert_eq!(
            ids(select_containers(&list, &policy(0, 0, -1), t(100), |_| {
                false
            })),
            ["c0", "c1"]
        );
        assert_eq!(
            ids(select_containers(&list, &policy(0, -1, 0), t(100), |_| {
                false
            })),
            ["c0", "c1"]
        );
        // c2, younger than the minimum age, is not evictable: of c0 and c1 the newest is
        // kept (kubelet counts only evictable instances against the limit).
        assert_eq!(
            ids(select_containers(&list, &policy(99, 1, -1), t(100), |_| {
                false
            })),
            ["c0"]
        );
    }

    #[test]
    fn removed_pods_lose_every_dead_container_old_enough() {
        let list = [
            dead("g0", "gone", "app", 0),
            dead("g1", "gone", "app", 50),
            dead("g2", "gone", "side", 95),
            dead("k0", "kept", "app", 0),
        ];
        let victims = select_containers(&list, &policy(10, 1, -1), t(100), |uid| uid == "gone");
        assert_eq!(ids(victims), ["g0", "g1"]);
    }

    #[test]
    fn node_limit_takes_an_even_share_then_the_oldest() {
        // Three units of three instances each, per-container unlimited, node-wide 4:
        // share = 4 / 3 = 1 per unit → 3 left (each unit's newest), within the limit.
        let mut list = Vec::new();
        for (u, base) in [("a", 0), ("b", 100), ("c", 200)] {
            for i in 0..3 {
                list.push(dead(&format!("{u}{i}"), "p", u, base + i));
            }
        }
        let victims = select_containers(&list, &policy(0, -1, 4), t(1000), |_| false);
        assert_eq!(ids(victims), ["a0", "a1", "b0", "b1", "c0", "c1"]);

        // Two units of four, limit 4: a share of 2 each is within the limit.
        let list: Vec<_> = (0..4)
            .map(|i| dead(&format!("x{i}"), "p", "x", i))
            .chain((0..4).map(|i| dead(&format!("y{i}"), "q", "y", 10 + i)))
            .collect();
        let victims = select_containers(&list, &policy(0, -1, 4), t(1000), |_| false);
        assert_eq!(ids(victims), ["x0", "x1", "y0", "y1"]);
    }

    #[test]
    fn node_limit_below_the_number_of_units_removes_the_oldest_but_protected() {
        // Share is at least 1; then the oldest go node-wide. Units of removed pods count
        // nothing (they are all gone), units of live pods keep their newest instance.
        let list = [
            dead("a0", "p", "a", 0),
            dead("a1", "p", "a", 1),
            dead("b0", "p", "b", 2),
            dead("b1", "p", "b", 3),
            dead("c0", "q", "c", 4),
        ];
        let victims = select_containers(&list, &policy(0, -1, 1), t(100), |_| false);
        assert_eq!(ids(victims), ["a0", "b0"]);
    }

    #[test]
    fn sandboxes_without_containers_go_but_the_newest_of_a_live_pod() {
        let sb = |id: &str, uid: &str, created: u64, active: bool| SandboxInfo {
            id: SandboxId::parse(id).expect("test id"),
            pod_uid: uid.into(),
            created_at: t(created),
            active,
        };
        let list = [
            sb("p-old", "p", 0, false),
            sb("p-mid", "p", 5, true),
            sb("p-new", "p", 10, false),
            sb("g-1", "gone", 0, false),
            sb("g-2", "gone", 1, false),
            sb("g-3", "gone", 2, true),
        ];
        let mut victims: Vec<String> = select_sandboxes(&list, |uid| uid == "gone")
            .into_iter()
            .map(|id| id.as_str().to_owned())
            .collect();
        victims.sort();
        assert_eq!(victims, ["g-1", "g-2", "p-old"]);
    }
}
