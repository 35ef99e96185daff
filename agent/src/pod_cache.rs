//! The pod status cache: the runtime's view of each pod ([`PodStatus`]) stamped with the
//! monotonic instant at which it was read.
//!
//! Guarantee: a status stored at instant `t` was read from the runtime *after* `t`, so it
//! reflects every runtime call that completed before `t`. A pod worker records the instant
//! of its last action and asks for [`PodCache::get_newer_than`] that instant: it can never
//! act on a status that predates its own action (upstream's Evented PLEG was reverted for
//! starting duplicate containers because its cache lacked exactly this ordering).
//!
//! The PLEG keeps entries fresh on events; when the entry is older than asked for, the
//! cache reads the runtime itself rather than waiting for the next event. Reading the
//! in-process runtime is a lock and a copy, so this costs microseconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ironlet_runtime::types::PodStatus;
use ironlet_runtime::{Runtime, RuntimeError};

/// One cached status and when it was read.
#[derive(Debug, Clone)]
pub struct CachedStatus {
    pub status: Arc<PodStatus>,
    /// The instant just before the runtime was asked.
    pub read_at: Instant,
}

/// Statuses by pod UID, each with its read instant.
pub struct PodCache {
    runtime: Arc<dyn Runtime>,
    entries: Mutex<HashMap<String, CachedStatus>>,
}

impl PodCache {
    pub fn new(runtime: Arc<dyn Runtime>) -> Self {
        Self {
            runtime,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CachedStatus>> {
        // Entries are replaced whole; a panic elsewhere cannot leave one half-written.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached status, however old.
    pub fn get(&self, uid: &str) -> Option<CachedStatus> {
        self.lock().get(uid).cloned()
    }

    /// A status read at or after `min`: the cached one if new enough, otherwise a fresh
    /// read from the runtime (which is then cached).
    pub async fn get_newer_than(
        &self,
        uid: &str,
        min: Instant,
    ) -> Result<CachedStatus, RuntimeError> {
        if let Some(cached) = self.get(uid).filter(|c| c.read_at >= min) {
            return Ok(cached);
        }
        self.refresh(uid).await
    }

    /// Reads the pod's status from the runtime now and caches it. Returns the previous
    /// entry's status too, so the PLEG can tell what changed.
    pub async fn refresh(&self, uid: &str) -> Result<CachedStatus, RuntimeError> {
        let read_at = Instant::now();
        let status = Arc::new(self.runtime.pod_status(uid).await?);
        Ok(self.store(uid, status, read_at))
    }

    /// Stores a status read at `read_at`, unless a newer one is already cached (two
    /// concurrent refreshes may finish out of order). Returns the entry now cached.
    pub fn store(&self, uid: &str, status: Arc<PodStatus>, read_at: Instant) -> CachedStatus {
        let mut entries = self.lock();
        match entries.get(uid) {
            Some(existing) if existing.read_at > read_at => existing.clone(),
            _ => {
                let entry = CachedStatus { status, read_at };
                entries.insert(uid.to_owned(), entry.clone());
                entry
            }
        }
    }

    /// Forgets a pod (after its worker finished and the pod is gone).
    pub fn remove(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Keeps only the pods `keep` names. Housekeeping drops the entries of pods that are
    /// neither desired nor have a worker or a sandbox: the PLEG refreshes the entry of a pod
    /// whose containers are removed after its worker finished, so removing it once when the
    /// worker goes is not enough (the cache grew with every pod ever run).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|uid, _| keep(uid));
    }

    /// UIDs with an entry.
    pub fn uids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status(uid: &str, name: &str) -> Arc<PodStatus> {
        Arc::new(PodStatus {
            pod_uid: uid.into(),
            name: name.into(),
            namespace: "default".into(),
            sandboxes: vec![],
            containers: vec![],
        })
    }

    fn cache() -> PodCache {
        PodCache::new(Arc::new(crate::testing::StaticRuntime))
    }

    #[test]
    fn an_older_read_never_replaces_a_newer_one() {
        let cache = cache();
        let early = Instant::now();
        let late = early + Duration::from_millis(5);
        cache.store("u", status("u", "new"), late);
        let kept = cache.store("u", status("u", "old"), early);
        assert_eq!(kept.status.name, "new");
        assert_eq!(
            cache.get("u").map(|c| c.status.name.clone()).as_deref(),
            Some("new")
        );
    }

    #[tokio::test]
    async fn a_stale_entry_is_refreshed_from_the_runtime() {
        let cache = cache();
        let before = Instant::now();
        cache.store("u", status("u", "cached"), before);
        let after = Instant::now() + Duration::from_millis(1);
        tokio::time::sleep(Duration::from_millis(2)).await;
        let got = cache
            .get_newer_than("u", after)
            .await
            .map_err(|e| e.to_string());
        let got = got.as_ref().map(|c| c.status.name.as_str());
        // StaticRuntime answers with an empty status named after nothing.
        assert_eq!(got, Ok(""));
        let fresh = cache
            .get_newer_than("u", before)
            .await
            .map(|c| c.read_at >= after);
        assert!(matches!(fresh, Ok(true)));
    }
}
