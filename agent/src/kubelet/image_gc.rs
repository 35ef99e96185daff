//! Image garbage collection — kubelet's `realImageGCManager` (`images/image_gc_manager.go`),
//! run at start and every [`IMAGE_GC_PERIOD`] (5 min), and on demand through
//! [`ImageGc::free_space`] (the node-pressure eviction reclaims the image file system with
//! it, as kubelet's eviction manager calls `DeleteUnusedImages`).
//!
//! One run (kubelet's `GarbageCollect`):
//! 1. detect: list images and every container (running or dead but kept); an image a
//!    container references is in use (its last-used time becomes now); an image seen for
//!    the first time is first-detected now;
//! 2. candidates: images neither in use nor pinned, least recently used first (never used
//!    counts as oldest), then first detected first;
//! 3. `--image-maximum-gc-age` (0: off): candidates unused for longer are removed whatever
//!    the disk usage;
//! 4. when the image file system's usage is at or above `--image-gc-high-threshold`, the
//!    candidates first detected at least `--image-minimum-gc-age` ago are removed in order
//!    until `capacity × (100 − low) / 100 − available` bytes (image sizes, as kubelet
//!    counts them) are freed; when the eligible images do not add up to that, the run fails
//!    with kubelet's message, the `FreeDiskSpaceFailed` warning on the node, and — when two
//!    runs in a row failed — `ImageGCFailed` (kubelet's events).
//!
//! Removing an image is `ImageService::remove_image` of its id: every tag goes, then the
//! store's gc removes the blobs and snapshots nothing else references.
//!
//! Times across restarts: kubelet keeps first-detected and last-used in memory, so after a
//! restart every image is new again (the minimum age protects all of them, least recently
//! used order is lost, and the maximum age waits one full age since the start). ironlet
//! saves them in `<root-dir>/image-gc-state.json` after every run and reads them at start,
//! so order and ages survive agent restarts and upgrades. Nothing is removed in the first
//! minimum age after a start with saved state (the containers of pods started again after
//! a reboot do not exist yet: kubelet's newly detected images are protected that long),
//! and without saved state the maximum age waits one full age, as kubelet's. A second deviation,
//! for the maximum age: an image never used counts from its first detection (kubelet's
//! zero last-used time makes a just-pulled image "older than any maximum age" once the
//! kubelet has run that long, racing the container about to use it).
//!
//! Also kept here: the image list for the Node's `status.images` (kubelet's image cache,
//! refreshed every 30 s and after each pull), largest first.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ironlet_runtime::types::{ContainerFilter, Image};
use ironlet_runtime::{ImageService, Runtime};
use serde::{Deserialize, Serialize};

use super::events::EventRecorder;

/// kubelet's `ImageGCPeriod`.
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(5 * 60);
/// How often the image list of the node status is refreshed (kubelet: 30 s).
pub const IMAGE_CACHE_PERIOD: Duration = Duration::from_secs(30);
/// kubelet's `MaxNamesPerImageInNodeStatus`.
pub const MAX_NAMES_PER_IMAGE_IN_NODE_STATUS: usize = 5;

/// kubelet's `ImageGCPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `--image-gc-high-threshold`: usage percent of the image file system at or above
    /// which images are collected (kubelet default 85; 100 turns the threshold off).
    pub high_threshold_percent: u8,
    /// `--image-gc-low-threshold`: usage percent collection brings it down to (80).
    pub low_threshold_percent: u8,
    /// `--image-minimum-gc-age`: an image younger than this (since first detected) is not
    /// collected for space (2 min).
    pub min_age: Duration,
    /// `--image-maximum-gc-age`: an image unused for longer is collected whatever the usage
    /// (0, the default: off).
    pub max_age: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }
}

impl ImageGcPolicy {
    /// kubelet's validation of the thresholds.
    pub fn validate(&self) -> Result<(), String> {
        if self.high_threshold_percent > 100 {
            return Err(format!(
                "imageGCHighThresholdPercent (--image-gc-high-threshold) {} must be between 0 and 100, inclusive",
                self.high_threshold_percent
            ));
        }
        if self.low_threshold_percent > 100 {
            return Err(format!(
                "imageGCLowThresholdPercent (--image-gc-low-threshold) {} must be between 0 and 100, inclusive",
                self.low_threshold_percent
            ));
        }
        if self.low_threshold_percent >= self.high_threshold_percent {
            return Err(format!(
                "imageGCLowThresholdPercent (--image-gc-low-threshold) {} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {}",
                self.low_threshold_percent, self.high_threshold_percent
            ));
        }
        Ok(())
    }

    /// kubelet stubs image GC out when the high threshold is 100 and no maximum age is set.
    pub fn disabled(&self) -> bool {
        self.high_threshold_percent >= 100 && self.max_age.is_zero()
    }

    /// Bytes to free for `fs` (kubelet: none below the high threshold, else down to the
    /// low threshold).
    pub fn bytes_to_free(&self, fs: FsUsage) -> Option<u64> {
        if fs.capacity == 0 || self.high_threshold_percent >= 100 {
            return None;
        }
        let available = fs.available.min(fs.capacity);
        let usage_percent = 100 - available.saturating_mul(100) / fs.capacity;
        if usage_percent < u64::from(self.high_threshold_percent) {
            return None;
        }
        let target = fs.capacity / 100 * u64::from(100 - self.low_threshold_percent)
            + fs.capacity % 100 * u64::from(100 - self.low_threshold_percent) / 100;
        Some(target.saturating_sub(available))
    }
}

/// Capacity and available bytes of the image file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
}

impl FsUsage {
    /// `statvfs` of `dir` (the image store).
    pub fn of(dir: &Path) -> Result<Self, ImageGcError> {
        let stat = nix::sys::statvfs::statvfs(dir).map_err(|source| ImageGcError::Statvfs {
            path: dir.to_path_buf(),
            source,
        })?;
        let fragment = stat.fragment_size() as u64;
        Ok(Self {
            capacity: (stat.blocks() as u64).saturating_mul(fragment),
            available: (stat.blocks_available() as u64).saturating_mul(fragment),
        })
    }
}

/// What image GC knows of one image (kubelet's `imageRecord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    pub first_detected: SystemTime,
    /// When a container last referenced it; never: `None`.
    pub last_used: Option<SystemTime>,
}

/// One image that may be collected, as the selection sees it (kubelet's `evictionInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub size: u64,
    pub record: ImageRecord,
}

/// kubelet's `detectImages` on the records: new images are first-detected at `now`, the
/// images in use last-used at `now`, vanished images forgotten.
pub fn detect(
    records: &mut HashMap<String, ImageRecord>,
    images: &[Image],
    in_use: &HashSet<String>,
    now: SystemTime,
) {
    let current: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
    records.retain(|id, _| current.contains(id.as_str()));
    for image in images {
        let record = records.entry(image.id.clone()).or_insert(ImageRecord {
            first_detected: now,
            last_used: None,
        });
        if in_use.contains(&image.id) {
            record.last_used = Some(now);
        }
    }
}

/// kubelet's `imagesInEvictionOrder`: images neither in use nor pinned, least recently
/// used first (never used first of all), ties broken by first detection.
pub fn eviction_order(
    records: &HashMap<String, ImageRecord>,
    images: &[Image],
    in_use: &HashSet<String>,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = images
        .iter()
        .filter(|i| !i.pinned && !in_use.contains(&i.id))
        .filter_map(|i| {
            records.get(&i.id).map(|r| Candidate {
                id: i.id.clone(),
                size: i.size,
                record: *r,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        (a.record.last_used, a.record.first_detected, &a.id).cmp(&(
            b.record.last_used,
            b.record.first_detected,
            &b.id,
        ))
    });
    out
}

/// When, after a start at `now`, images may first be removed for space and for their
/// maximum age. Without saved state (kubelet): every image is newly detected, which the
/// minimum age protects, and the maximum age waits one full age. With saved state the
/// recorded times are real, but the containers of pods about to be started again (after a
/// reboot) do not exist yet: both wait the minimum age, the time kubelet's newly detected
/// images are protected.
pub fn start_grace(
    saved: bool,
    policy: &ImageGcPolicy,
    now: SystemTime,
) -> (SystemTime, SystemTime) {
    if saved {
        (now + policy.min_age, now + policy.min_age)
    } else {
        (now, now + policy.max_age)
    }
}

/// Whether `c` is older than the maximum age at `now` (unused since its last use, or since
/// its first detection when never used).
pub fn too_old(c: &Candidate, max_age: Duration, now: SystemTime) -> bool {
    let since = c.record.last_used.unwrap_or(c.record.first_detected);
    !max_age.is_zero() && now.duration_since(since).is_ok_and(|age| age > max_age)
}

/// Whether `c` may be removed for space at `now` (kubelet's `freeSpace` checks: not used
/// at or after `now`, first detected at least `min_age` ago).
pub fn may_free(c: &Candidate, min_age: Duration, now: SystemTime) -> bool {
    let used_now = c.record.last_used.is_some_and(|t| t >= now);
    let old_enough = now
        .duration_since(c.record.first_detected)
        .is_ok_and(|age| age >= min_age);
    !used_now && old_enough
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error("statvfs {path}")]
    Statvfs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    #[error("listing images or containers: {0}")]
    List(String),
    /// kubelet's message, word for word.
    #[error("Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free.")]
    NotEnough { wanted: u64, freed: u64 },
    #[error("wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {errors}")]
    Remove {
        wanted: u64,
        freed: u64,
        errors: String,
    },
}

/// The saved records: `<root-dir>/image-gc-state.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedState {
    records: HashMap<String, ImageRecord>,
}

/// Mutable state of the manager, one run at a time.
#[derive(Debug)]
struct State {
    records: HashMap<String, ImageRecord>,
    /// When images may first be removed for space (see [`start_grace`]).
    space_from: SystemTime,
    /// When the maximum age may first apply (see [`start_grace`]).
    max_age_from: SystemTime,
    previous_failed: bool,
}

/// kubelet's image GC manager.
pub struct ImageGc {
    runtime: Arc<dyn Runtime>,
    images: Arc<dyn ImageService>,
    policy: ImageGcPolicy,
    /// Where the image file system is measured (the image store).
    imagefs: PathBuf,
    state_path: PathBuf,
    events: Arc<dyn EventRecorder>,
    state: tokio::sync::Mutex<State>,
    /// The images as last listed, largest first (node status).
    cache: Mutex<Vec<Image>>,
}

impl std::fmt::Debug for ImageGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageGc")
            .field("policy", &self.policy)
            .field("imagefs", &self.imagefs)
            .finish_non_exhaustive()
    }
}

impl ImageGc {
    /// A manager over `images` and `runtime`; `imagefs` is the image store's directory and
    /// `state_path` where first-detected and last-used times are kept.
    pub fn new(
        runtime: Arc<dyn Runtime>,
        images: Arc<dyn ImageService>,
        policy: ImageGcPolicy,
        imagefs: PathBuf,
        state_path: PathBuf,
        events: Arc<dyn EventRecorder>,
    ) -> Self {
        let now = SystemTime::now();
        let saved = std::fs::read(&state_path)
            .ok()
            .and_then(|bytes| match serde_json::from_slice::<SavedState>(&bytes) {
                Ok(s) => Some(s),
                Err(err) => {
                    tracing::warn!(path = %state_path.display(), %err, "image GC state unreadable; images count as newly detected");
                    None
                }
            });
        let (space_from, max_age_from) = start_grace(saved.is_some(), &policy, now);
        Self {
            runtime,
            images,
            policy,
            imagefs,
            state_path,
            events,
            state: tokio::sync::Mutex::new(State {
                records: saved.map(|s| s.records).unwrap_or_default(),
                space_from,
                max_age_from,
                previous_failed: false,
            }),
            cache: Mutex::new(Vec::new()),
        }
    }

    pub fn policy(&self) -> &ImageGcPolicy {
        &self.policy
    }

    /// Runs at start and every `period` until the task is dropped; refreshes the node's
    /// image list every [`IMAGE_CACHE_PERIOD`] and when `refresh` is notified.
    pub async fn run(self: Arc<Self>, period: Duration, refresh: Arc<tokio::sync::Notify>) {
        let mut gc = tokio::time::interval(period);
        gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cache = tokio::time::interval(IMAGE_CACHE_PERIOD);
        cache.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = gc.tick() => {
                    if !self.policy.disabled() {
                        self.garbage_collect_logged().await;
                    }
                }
                _ = cache.tick() => self.refresh_cache().await,
                () = refresh.notified() => self.refresh_cache().await,
            }
        }
    }

    /// The images for `status.images`: at most `max_images` (negative: all), largest first,
    /// each with up to five names (repo digests, then repo tags), as kubelet reports them.
    pub fn node_images(&self, max_images: i32) -> Vec<k8s_openapi::api::core::v1::ContainerImage> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let take = usize::try_from(max_images).unwrap_or(usize::MAX);
        cache
            .iter()
            .take(take)
            .map(|image| {
                let names: Vec<String> = image
                    .repo_digests
                    .iter()
                    .chain(&image.repo_tags)
                    .take(MAX_NAMES_PER_IMAGE_IN_NODE_STATUS)
                    .cloned()
                    .collect();
                k8s_openapi::api::core::v1::ContainerImage {
                    names: Some(names),
                    size_bytes: i64::try_from(image.size).ok(),
                }
            })
            .collect()
    }

    async fn refresh_cache(&self) {
        match self.images.list_images().await {
            Ok(images) => self.set_cache(images),
            Err(err) => tracing::warn!(%err, "listing images for the node status failed"),
        }
    }

    fn set_cache(&self, mut images: Vec<Image>) {
        // kubelet's `ByImageSize`: larger first, then by id descending.
        images.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| b.id.cmp(&a.id)));
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = images;
    }

    /// One periodic run, with kubelet's logging and events (`ImageGCFailed` only when the
    /// previous run failed too).
    async fn garbage_collect_logged(&self) {
        let result = self.garbage_collect().await;
        let mut state = self.state.lock().await;
        match result {
            Ok(()) => state.previous_failed = false,
            Err(err) => {
                if state.previous_failed {
                    tracing::error!(%err, "Image garbage collection failed multiple times in a row");
                    self.events.node_event(
                        super::events::EventType::Warning,
                        super::events::reason::IMAGE_GC_FAILED,
                        err.to_string(),
                    );
                } else {
                    tracing::error!(%err, "Image garbage collection failed once. Stats initialization may not have completed yet");
                }
                state.previous_failed = true;
            }
        }
    }

    /// kubelet's `GarbageCollect`: the maximum age, then the thresholds.
    pub async fn garbage_collect(&self) -> Result<(), ImageGcError> {
        let fs = FsUsage::of(&self.imagefs)?;
        if fs.capacity == 0 {
            let err = ImageGcError::InvalidCapacity;
            self.events.node_event(
                super::events::EventType::Warning,
                super::events::reason::INVALID_DISK_CAPACITY,
                err.to_string(),
            );
            return Err(err);
        }
        let mut state = self.state.lock().await;
        let now = SystemTime::now();
        let mut candidates = self.candidates(&mut state, now).await?;
        if !self.policy.max_age.is_zero() && now > state.max_age_from {
            let mut kept = Vec::with_capacity(candidates.len());
            for c in candidates {
                if too_old(&c, self.policy.max_age, now) {
                    tracing::info!(image = %c.id, max_age = ?self.policy.max_age, "removing an image unused for longer than the maximum age");
                    if self.remove(&c).await.is_ok() {
                        state.records.remove(&c.id);
                        continue;
                    }
                }
                kept.push(c);
            }
            candidates = kept;
        }
        let result = match self.policy.bytes_to_free(fs) {
            None => Ok(()),
            Some(wanted) => {
                tracing::info!(
                    usage = 100 - fs.available.min(fs.capacity) * 100 / fs.capacity,
                    high_threshold = self.policy.high_threshold_percent,
                    amount_to_free = wanted,
                    low_threshold = self.policy.low_threshold_percent,
                    "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
                );
                match self.free(&mut state, &candidates, wanted, now).await {
                    Ok(freed) if freed < wanted => {
                        let err = ImageGcError::NotEnough { wanted, freed };
                        self.events.node_event(
                            super::events::EventType::Warning,
                            super::events::reason::FREE_DISK_SPACE_FAILED,
                            err.to_string(),
                        );
                        Err(err)
                    }
                    Ok(_) => Ok(()),
                    Err(err) => Err(err),
                }
            }
        };
        self.save(&state);
        drop(state);
        self.refresh_cache().await;
        result
    }

    /// Removes unused images, in eviction order, until `bytes` (image sizes) are freed;
    /// returns the bytes freed (less than asked when too few images may go). For the
    /// node-pressure eviction (kubelet's eviction manager calls `DeleteUnusedImages`, this
    /// with `u64::MAX`). The minimum age applies; pinned and used images are never removed.
    pub async fn free_space(&self, bytes: u64) -> Result<u64, ImageGcError> {
        let mut state = self.state.lock().await;
        let now = SystemTime::now();
        let candidates = self.candidates(&mut state, now).await?;
        let freed = self.free(&mut state, &candidates, bytes, now).await;
        self.save(&state);
        drop(state);
        self.refresh_cache().await;
        freed
    }

    /// kubelet's `DeleteUnusedImages`: every unused image old enough.
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        self.free_space(u64::MAX).await
    }

    /// Detects images and returns the candidates in eviction order.
    async fn candidates(
        &self,
        state: &mut State,
        now: SystemTime,
    ) -> Result<Vec<Candidate>, ImageGcError> {
        let (images, containers) = tokio::try_join!(
            async {
                self.images
                    .list_images()
                    .await
                    .map_err(|e| ImageGcError::List(e.to_string()))
            },
            async {
                self.runtime
                    .list_containers(&ContainerFilter::default())
                    .await
                    .map_err(|e| ImageGcError::List(e.to_string()))
            },
        )?;
        let mut in_use: HashSet<String> = HashSet::new();
        for c in &containers {
            if !c.image_id.is_empty() {
                in_use.insert(c.image_id.clone());
            } else if let Ok(Some(image)) = self.images.get_image(&c.image).await {
                in_use.insert(image.id);
            }
        }
        detect(&mut state.records, &images, &in_use, now);
        Ok(eviction_order(&state.records, &images, &in_use))
    }

    /// kubelet's `freeSpace`.
    async fn free(
        &self,
        state: &mut State,
        candidates: &[Candidate],
        wanted: u64,
        now: SystemTime,
    ) -> Result<u64, ImageGcError> {
        let mut freed = 0u64;
        let mut errors = Vec::new();
        if now < state.space_from {
            tracing::info!("images are kept for the minimum age after the start");
            return Ok(0);
        }
        for c in candidates {
            if freed >= wanted {
                break;
            }
            if !may_free(c, self.policy.min_age, now) {
                tracing::debug!(image = %c.id, "image too young or used too recently for garbage collection");
                continue;
            }
            match self.remove(c).await {
                Ok(()) => {
                    state.records.remove(&c.id);
                    freed = freed.saturating_add(c.size);
                }
                Err(err) => errors.push(err),
            }
        }
        if errors.is_empty() {
            Ok(freed)
        } else {
            Err(ImageGcError::Remove {
                wanted,
                freed,
                errors: errors.join("; "),
            })
        }
    }

    /// kubelet's `freeImage`.
    async fn remove(&self, c: &Candidate) -> Result<(), String> {
        tracing::info!(image = %c.id, size = c.size, "Removing image to free bytes");
        self.images.remove_image(&c.id).await.map_err(|err| {
            tracing::warn!(image = %c.id, %err, "removing an image failed");
            format!("{}: {err}", c.id)
        })
    }

    fn save(&self, state: &State) {
        let saved = SavedState {
            records: state.records.clone(),
        };
        let result = serde_json::to_vec(&saved)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_atomic(&self.state_path, &bytes));
        if let Err(err) = result {
            tracing::warn!(path = %self.state_path.display(), %err, "saving the image GC state failed");
        }
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    fn image(id: &str, size: u64, pinned: bool) -> Image {
        Image {
            id: id.into(),
            repo_tags: vec![format!("{id}:1")],
            repo_digests: vec![],
            size,
            config: Default::default(),
            pinned,
        }
    }

    fn ids(c: &[Candidate]) -> Vec<&str> {
        c.iter().map(|c| c.id.as_str()).collect()
    }

    #[test]
    fn thresholds_are_validated_as_kubelet_does() {
        let p = |high, low| ImageGcPolicy {
            high_threshold_percent: high,
            low_threshold_percent: low,
            ..ImageGcPolicy::default()
        };
        assert!(ImageGcPolicy::default().validate().is_ok());
        assert!(p(1, 0).validate().is_ok());
        let err = p(80, 80).validate().unwrap_err();
        assert!(err.contains("must be less than"), "{err}");
        assert!(p(101, 0).validate().is_err());
        assert!(p(100, 0).disabled());
        assert!(!ImageGcPolicy {
            max_age: Duration::from_secs(60),
            ..p(100, 0)
        }
        .disabled());
    }

    #[test]
    fn bytes_to_free_start_at_the_high_threshold_and_reach_the_low_one() {
        let policy = ImageGcPolicy::default();
        let fs = |available| FsUsage {
            capacity: 1000,
            available,
        };
        // 84 % used: nothing; 85 %: down to 80 % used = 200 available.
        assert_eq!(policy.bytes_to_free(fs(160)), None);
        assert_eq!(policy.bytes_to_free(fs(150)), Some(50));
        assert_eq!(policy.bytes_to_free(fs(0)), Some(200));
        assert_eq!(
            policy.bytes_to_free(FsUsage {
                capacity: 0,
                available: 0
            }),
            None
        );
        let everything = ImageGcPolicy {
            high_threshold_percent: 1,
            low_threshold_percent: 0,
            ..policy
        };
        assert_eq!(everything.bytes_to_free(fs(550)), Some(450));
    }

    #[test]
    fn detection_records_first_sight_and_use_and_forgets_vanished_images() {
        let mut records = HashMap::new();
        let images = [image("a", 1, false), image("b", 1, false)];
        let used: HashSet<String> = ["a".to_owned()].into();
        detect(&mut records, &images, &used, t(0));
        detect(&mut records, &images, &HashSet::new(), t(10));
        assert_eq!(records["a"].first_detected, t(0));
        assert_eq!(records["a"].last_used, Some(t(0)));
        assert_eq!(records["b"].last_used, None);
        detect(&mut records, &images[1..], &HashSet::new(), t(20));
        assert!(!records.contains_key("a"));
    }

    #[test]
    fn eviction_order_is_least_recently_used_first_without_used_or_pinned_images() {
        let mut records = HashMap::new();
        let images = [
            image("old-use", 10, false),
            image("new-use", 10, false),
            image("never-late", 10, false),
            image("never-early", 10, false),
            image("pinned", 10, true),
            image("running", 10, false),
        ];
        for (id, first, used) in [
            ("old-use", 0, Some(5)),
            ("new-use", 0, Some(50)),
            ("never-late", 30, None),
            ("never-early", 20, None),
            ("pinned", 0, None),
            ("running", 0, Some(60)),
        ] {
            records.insert(
                id.to_owned(),
                ImageRecord {
                    first_detected: t(first),
                    last_used: used.map(t),
                },
            );
        }
        let in_use: HashSet<String> = ["running".to_owned()].into();
        let order = eviction_order(&records, &images, &in_use);
        assert_eq!(
            ids(&order),
            ["never-early", "never-late", "old-use", "new-use"]
        );
    }

    #[test]
    fn minimum_and_maximum_ages() {
        let c = |first, used: Option<u64>| Candidate {
            id: "x".into(),
            size: 1,
            record: ImageRecord {
                first_detected: t(first),
                last_used: used.map(t),
            },
        };
        let min = Duration::from_secs(120);
        assert!(!may_free(&c(0, None), min, t(119)));
        assert!(may_free(&c(0, None), min, t(120)));
        assert!(!may_free(&c(0, Some(200)), min, t(200)), "used now");
        let max = Duration::from_secs(100);
        assert!(!too_old(&c(0, None), Duration::ZERO, t(10_000)), "off");
        assert!(!too_old(&c(0, None), max, t(100)));
        assert!(too_old(&c(0, None), max, t(101)));
        assert!(
            !too_old(&c(0, Some(50)), max, t(101)),
            "counts from last use"
        );
        assert!(too_old(&c(0, Some(50)), max, t(151)));
    }

    #[test]
    fn node_images_are_largest_first_cut_to_the_limit_with_five_names_at_most() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let store = ironlet_runtime::image::ImageStore::open(tmp.path()).expect("store opens");
        let gc = ImageGc {
            runtime: Arc::new(crate::testing::StaticRuntime),
            images: Arc::new(ironlet_runtime::image::LocalImageService::new(Arc::new(
                store,
            ))),
            policy: ImageGcPolicy::default(),
            imagefs: PathBuf::from("/"),
            state_path: PathBuf::from("/nonexistent"),
            events: Arc::new(super::super::events::TracingRecorder),
            state: tokio::sync::Mutex::new(State {
                records: HashMap::new(),
                space_from: t(0),
                max_age_from: t(0),
                previous_failed: false,
            }),
            cache: Mutex::new(Vec::new()),
        };
        let mut many = image("many", 5, false);
        many.repo_digests = (0..4).map(|i| format!("r@sha256:{i}")).collect();
        many.repo_tags = (0..4).map(|i| format!("r:{i}")).collect();
        gc.set_cache(vec![image("small", 1, false), many, image("big", 9, false)]);
        let all = gc.node_images(-1);
        let sizes: Vec<_> = all.iter().map(|i| i.size_bytes).collect();
        assert_eq!(sizes, [Some(9), Some(5), Some(1)]);
        let names = all[1].names.clone().unwrap_or_default();
        assert_eq!(
            names,
            [
                "r@sha256:0",
                "r@sha256:1",
                "r@sha256:2",
                "r@sha256:3",
                "r:0"
            ],
            "digests first, five at most"
        );
        assert_eq!(gc.node_images(2).len(), 2);
        assert!(gc.node_images(0).is_empty());
    }

    #[test]
    fn after_a_start_nothing_goes_before_the_minimum_age_nor_by_age_before_kubelet_would() {
        let policy = ImageGcPolicy {
            max_age: Duration::from_secs(3600),
            ..ImageGcPolicy::default()
        };
        assert_eq!(start_grace(false, &policy, t(0)), (t(0), t(3600)));
        assert_eq!(start_grace(true, &policy, t(0)), (t(120), t(120)));
    }

    #[test]
    fn saved_state_round_trips() {
        let mut records = HashMap::new();
        records.insert(
            "a".to_owned(),
            ImageRecord {
                first_detected: t(1),
                last_used: Some(t(2)),
            },
        );
        let bytes = serde_json::to_vec(&SavedState {
            records: records.clone(),
        })
        .unwrap();
        let back: SavedState = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back.records, records);
    }
}
