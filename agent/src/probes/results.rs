//! The published probe results, one slot per (pod uid, container name, kind), each tagged
//! with the container id it belongs to (kubelet's `results.Manager`, one for all kinds).
//!
//! Guarantees: a slot is created only by [`ResultStore::init`] (the manager, when it starts
//! a container's workers); [`ResultStore::set`] and [`ResultStore::remove`] act only on a
//! slot holding the same container id, so a worker that outlives its container (a stop
//! racing a probe) can never write into its successor's slot.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ironlet_runtime::types::ContainerId;

use super::{ProbeKind, ProbeResult};

/// Names one slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ResultKey {
    pub pod_uid: String,
    pub container: String,
    pub kind: ProbeKind,
}

/// What a slot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub id: ContainerId,
    /// `None`: not known yet (a startup probe that has not decided).
    pub result: Option<ProbeResult>,
    /// The last failure or error message, or why the probe is invalid.
    pub message: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct ResultStore {
    slots: Mutex<HashMap<ResultKey, Slot>>,
}

impl ResultStore {
    fn lock(&self) -> MutexGuard<'_, HashMap<ResultKey, Slot>> {
        // Every critical section is a single map operation: a panic cannot leave it torn.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates or replaces the slot with a new container's initial value.
    pub fn init(&self, key: ResultKey, slot: Slot) {
        self.lock().insert(key, slot);
    }

    /// Publishes a result for container `id`; true when the published result changed.
    /// Ignored (false) when the slot belongs to another container or is gone.
    pub fn set(
        &self,
        key: &ResultKey,
        id: &ContainerId,
        result: ProbeResult,
        message: Option<String>,
    ) -> bool {
        let mut slots = self.lock();
        match slots.get_mut(key) {
            Some(slot) if slot.id == *id => {
                let changed = slot.result != Some(result);
                slot.result = Some(result);
                slot.message = message;
                changed
            }
            _ => false,
        }
    }

    /// The slot, if it belongs to container `id`.
    pub fn get(&self, key: &ResultKey, id: &ContainerId) -> Option<Slot> {
        self.lock().get(key).filter(|s| s.id == *id).cloned()
    }

    /// Forgets the slot if it belongs to container `id`.
    pub fn remove(&self, key: &ResultKey, id: &ContainerId) {
        let mut slots = self.lock();
        if slots.get(key).is_some_and(|s| s.id == *id) {
            slots.remove(key);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ResultKey {
        ResultKey {
            pod_uid: "uid".into(),
            container: "web".into(),
            kind: ProbeKind::Readiness,
        }
    }

    fn slot(id: &ContainerId) -> Slot {
        Slot {
            id: id.clone(),
            result: Some(ProbeResult::Failure),
            message: None,
        }
    }

    #[test]
    fn set_reports_a_change_only_when_the_result_differs() {
        let store = ResultStore::default();
        let id = ContainerId::random();
        store.init(key(), slot(&id));
        assert!(!store.set(&key(), &id, ProbeResult::Failure, None));
        assert!(store.set(&key(), &id, ProbeResult::Success, None));
        assert!(!store.set(&key(), &id, ProbeResult::Success, None));
    }

    #[test]
    fn a_stale_worker_cannot_write_into_the_next_containers_slot() {
        let store = ResultStore::default();
        let (old, new) = (ContainerId::random(), ContainerId::random());
        store.init(key(), slot(&new));
        assert!(!store.set(&key(), &old, ProbeResult::Success, None));
        store.remove(&key(), &old);
        assert_eq!(store.get(&key(), &new), Some(slot(&new)));
        assert_eq!(store.get(&key(), &old), None);
        store.remove(&key(), &new);
        assert_eq!(store.len(), 0);
        assert!(!store.set(&key(), &new, ProbeResult::Success, None));
        assert_eq!(store.len(), 0);
    }
}
