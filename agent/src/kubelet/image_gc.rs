//! The image collector's shell (issue #38): measures the image store's filesystem, lists the
//! images and what the node's containers use, and removes what
//! [`shoal_core::image_gc::plan`] decides, every [`PERIOD`] and whenever a pod's sandbox is
//! removed (that is when images stop being used).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use shoal_core::image_gc::{self, Disk, ImageUse, Thresholds};
use tracing::{info, warn};

use super::Kubelet;

/// How often the collector looks when nothing wakes it (the kubelet's period).
pub const PERIOD: Duration = Duration::from_secs(300);

/// What the collector remembers between runs: when each image (by digest) was first seen and
/// last started a container.
#[derive(Debug, Default)]
pub struct ImageGc {
    pub thresholds: Thresholds,
    first_seen: Mutex<HashMap<String, u64>>,
    last_used: Mutex<HashMap<String, u64>>,
    wake: tokio::sync::Notify,
}

impl ImageGc {
    pub fn new(thresholds: Thresholds) -> Self {
        Self {
            thresholds,
            ..Self::default()
        }
    }

    /// A container started from image `digest` at `now_ms`.
    pub fn used(&self, digest: &str, now_ms: u64) {
        self.last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest.to_owned(), now_ms);
    }

    /// Asks for a run soon (a pod's sandbox went).
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

impl Kubelet {
    /// The collector's loop (supervised by the caller).
    pub(super) async fn collect_images(self: Arc<Self>) {
        loop {
            let _ = tokio::time::timeout(PERIOD, self.image_gc.wake.notified()).await;
            let kubelet = self.clone();
            match tokio::task::spawn_blocking(move || kubelet.collect_images_once()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => warn!(%error, "image garbage collection failed"),
                Err(error) => warn!(%error, "image garbage collection panicked"),
            }
        }
    }

    /// One run: removes the images the plan names; an error when usage stays over the high
    /// threshold for want of removable images, as the kubelet reports it.
    fn collect_images_once(&self) -> Result<(), String> {
        let thresholds = self.image_gc.thresholds;
        if thresholds.high_percent >= 100 {
            return Ok(());
        }
        let now = super::now_ms();
        let stat = nix::sys::statvfs::statvfs(self.images.root()).map_err(|e| e.to_string())?;
        let block = stat.fragment_size();
        let disk = Disk {
            capacity_bytes: stat.blocks().saturating_mul(block),
            available_bytes: stat.blocks_available().saturating_mul(block),
        };
        let in_use: BTreeSet<String> = self
            .runtime
            .list()
            .iter()
            .flat_map(|p| p.containers.iter().map(|c| c.meta.image_digest.clone()))
            .collect();
        let listed = self.images.list().map_err(|e| e.to_string())?;
        let mut by_digest: BTreeMap<String, ImageUse> = BTreeMap::new();
        {
            let mut first_seen = self
                .image_gc
                .first_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            first_seen.retain(|d, _| listed.iter().any(|i| i.digest == *d));
            let last_used = self
                .image_gc
                .last_used
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for image in listed {
                let seen = *first_seen.entry(image.digest.clone()).or_insert(now);
                let entry = by_digest
                    .entry(image.digest.clone())
                    .or_insert_with(|| ImageUse {
                        digest: image.digest.clone(),
                        references: Vec::new(),
                        size_bytes: image.size_bytes,
                        last_used_ms: last_used.get(&image.digest).copied().unwrap_or(0),
                        first_seen_ms: seen,
                        in_use: in_use.contains(&image.digest),
                    });
                entry.references.push(image.reference);
            }
        }
        let images: Vec<ImageUse> = by_digest.into_values().collect();
        // Blobs no image needs (fetched for peers, left by failed pulls) go after a while.
        if let Err(error) = self.images.sweep() {
            warn!(%error, "sweeping the image store");
        }
        let plan = image_gc::plan(&images, disk, thresholds, now);
        let mut freed = 0u64;
        for digest in &plan {
            let Some(image) = images.iter().find(|i| i.digest == *digest) else {
                continue;
            };
            for reference in &image.references {
                match self.images.remove(reference) {
                    Ok(_) => {
                        info!(image = %reference, %digest, "image removed by garbage collection")
                    }
                    // A container started from it since the listing: it stays.
                    Err(error) => warn!(image = %reference, %error, "image not removed"),
                }
            }
            freed += image.size_bytes;
        }
        let used = disk.capacity_bytes.saturating_sub(disk.available_bytes);
        let target = disk.capacity_bytes / 100 * u64::from(thresholds.low_percent);
        if !plan.is_empty() && freed < used.saturating_sub(target) {
            return Err(format!(
                "failed to garbage collect required amount of images: attempted to free {} bytes, but only found {freed} bytes eligible to free",
                used - target
            ));
        }
        Ok(())
    }
}
