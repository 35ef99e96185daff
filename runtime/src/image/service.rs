//! [`LocalImageService`]: the async [`ImageService`] over an [`ImageStore`].
//!
//! Every call runs the blocking store work on tokio's blocking pool
//! (`spawn_blocking`), so the agent's reactor threads never wait on disk, locks or
//! decompression. `remove_image` untags and then runs [`ImageStore::gc`], so that the
//! space of an image whose last tag went is given back (as the kubelet's image GC expects);
//! removing an image that is not present succeeds (CRI `RemoveImage` is idempotent).
//! Images named in the node's pinned list (`--pinned-images`) are reported pinned, as those
//! `ironlet images pin` marked in the store are: image garbage collection never takes them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use super::error::ImageError;
use super::pull::{PullConfig, PullReport, PullRequest, Puller};
use super::store::ImageStore;
use crate::traits::ImageService;
use crate::types::{Image, ImageStats};

/// The image service of the in-process runtime.
#[derive(Debug, Clone)]
pub struct LocalImageService {
    store: Arc<ImageStore>,
    puller: Arc<Puller>,
    /// References reported pinned besides the store's own pins.
    pinned: Arc<Vec<String>>,
}

impl LocalImageService {
    pub fn new(store: Arc<ImageStore>) -> Self {
        Self::with_pull_config(store, PullConfig::default())
    }

    /// With registries, node credentials and pull concurrency set.
    pub fn with_pull_config(store: Arc<ImageStore>, config: PullConfig) -> Self {
        let puller = Arc::new(Puller::new(Arc::clone(&store), config));
        Self {
            store,
            puller,
            pinned: Arc::new(Vec::new()),
        }
    }

    /// Reports the images these references name as pinned (`--pinned-images`); each must
    /// be a valid reference (or image id), present or not.
    pub fn with_pinned_images(mut self, references: Vec<String>) -> Result<Self, ImageError> {
        Self::check_pinned_images(&references)?;
        self.pinned = Arc::new(references);
        Ok(self)
    }

    /// Every reference of a pinned list is an image reference or id.
    pub fn check_pinned_images(references: &[String]) -> Result<(), ImageError> {
        for r in references {
            if !r.starts_with(super::digest::Digest::PREFIX) {
                super::reference::Reference::parse(r)?;
            }
        }
        Ok(())
    }

    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ImageStore) -> Result<T, ImageError> + Send + 'static,
    ) -> Result<T, ImageError> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| ImageError::Task(e.to_string()))?
    }
}

#[async_trait]
impl ImageService for LocalImageService {
    async fn import(&self, path: &Path) -> Result<Vec<Image>, ImageError> {
        let path: PathBuf = path.to_path_buf();
        self.blocking(move |s| s.import(&path)).await
    }

    async fn get_image(&self, reference: &str) -> Result<Option<Image>, ImageError> {
        let reference = reference.to_owned();
        let pinned = Arc::clone(&self.pinned);
        self.blocking(move |s| {
            let mut found: Vec<Image> = s.get_image(&reference)?.into_iter().collect();
            mark_pinned(s, &pinned, &mut found)?;
            Ok(found.pop())
        })
        .await
    }

    async fn list_images(&self) -> Result<Vec<Image>, ImageError> {
        let pinned = Arc::clone(&self.pinned);
        self.blocking(move |s| {
            let mut images = s.list_images()?;
            mark_pinned(s, &pinned, &mut images)?;
            Ok(images)
        })
        .await
    }

    async fn remove_image(&self, reference: &str) -> Result<(), ImageError> {
        let reference = reference.to_owned();
        self.blocking(move |s| {
            if s.remove_image(&reference)? {
                s.gc()?;
            }
            Ok(())
        })
        .await
    }

    async fn image_stats(&self) -> Result<ImageStats, ImageError> {
        self.blocking(|s| s.image_stats()).await
    }

    async fn is_pulled(&self, reference: &str) -> Result<bool, ImageError> {
        let reference = reference.to_owned();
        self.blocking(move |s| s.is_pulled(&reference)).await
    }

    async fn pull_image(
        &self,
        reference: &str,
        request: PullRequest,
    ) -> Result<PullReport, ImageError> {
        self.puller.pull(reference, request).await
    }
}

/// Marks the images the pinned references name.
fn mark_pinned(
    store: &ImageStore,
    pinned: &[String],
    images: &mut [Image],
) -> Result<(), ImageError> {
    if pinned.is_empty() || images.is_empty() {
        return Ok(());
    }
    let mut ids = Vec::new();
    for r in pinned {
        if let Some(image) = store.get_image(r)? {
            ids.push(image.id);
        }
    }
    for image in images.iter_mut() {
        image.pinned |= ids.contains(&image.id);
    }
    Ok(())
}
