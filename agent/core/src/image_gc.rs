//! Image garbage collection as the kubelet does it (issue #38): when the image filesystem's
//! usage reaches the high threshold, the images no container uses are removed, least recently
//! used first, until usage is back under the low threshold. Pure: the shell measures the
//! disk, lists the images and what uses them, and removes what this decides.

/// One image (a manifest digest, with every tag that names it) as the collector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUse {
    pub digest: String,
    /// Every tag of it: removing the image removes them all.
    pub references: Vec<String>,
    pub size_bytes: u64,
    /// When a container last started from it (0: never since the agent started).
    pub last_used_ms: u64,
    /// When the collector first saw it (an image younger than the minimum age stays).
    pub first_seen_ms: u64,
    /// A container (running or not yet removed) uses it: never removed.
    pub in_use: bool,
}

/// The filesystem the images live on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disk {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
}

/// `--image-gc-high-threshold`, `--image-gc-low-threshold` (percent of the disk used) and
/// `--image-minimum-gc-age`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub high_percent: u8,
    pub low_percent: u8,
    pub min_age_ms: u64,
}

impl Default for Thresholds {
    /// The kubelet's defaults: 85 %, 80 %, two minutes.
    fn default() -> Self {
        Self {
            high_percent: 85,
            low_percent: 80,
            min_age_ms: 120_000,
        }
    }
}

impl Thresholds {
    /// Refuses what the kubelet refuses: percentages above 100, low not below high (a high
    /// threshold of 100 turns the collector off).
    pub fn check(&self) -> Result<(), String> {
        if self.high_percent > 100 || self.low_percent > 100 {
            return Err(format!(
                "image GC thresholds are percentages (high {}, low {})",
                self.high_percent, self.low_percent
            ));
        }
        if self.high_percent < 100 && self.low_percent >= self.high_percent {
            return Err(format!(
                "the image GC low threshold ({}) must be below the high threshold ({})",
                self.low_percent, self.high_percent
            ));
        }
        Ok(())
    }
}

/// The images to remove, in order (their digests), or none when usage is under the high
/// threshold: the unused ones older than the minimum age, least recently used first (then
/// the first seen), until the bytes they hold bring usage to the low threshold. The images
/// that may go may not be enough; the kubelet then reports a failure, the caller too.
pub fn plan(images: &[ImageUse], disk: Disk, thresholds: Thresholds, now_ms: u64) -> Vec<String> {
    if thresholds.high_percent >= 100 || disk.capacity_bytes == 0 {
        return Vec::new();
    }
    let used = disk.capacity_bytes.saturating_sub(disk.available_bytes);
    let percent = u128::from(used) * 100 / u128::from(disk.capacity_bytes);
    if percent < u128::from(thresholds.high_percent) {
        return Vec::new();
    }
    let target =
        (u128::from(disk.capacity_bytes) * u128::from(thresholds.low_percent) / 100) as u64;
    let to_free = used.saturating_sub(target);
    let mut candidates: Vec<&ImageUse> = images
        .iter()
        .filter(|i| !i.in_use && now_ms.saturating_sub(i.first_seen_ms) >= thresholds.min_age_ms)
        .collect();
    candidates.sort_by(|a, b| {
        (a.last_used_ms, a.first_seen_ms, &a.digest).cmp(&(
            b.last_used_ms,
            b.first_seen_ms,
            &b.digest,
        ))
    });
    let mut freed = 0u64;
    let mut out = Vec::new();
    for image in candidates {
        if freed >= to_free {
            break;
        }
        freed = freed.saturating_add(image.size_bytes);
        out.push(image.digest.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(digest: &str, size: u64, last_used: u64, in_use: bool) -> ImageUse {
        ImageUse {
            digest: digest.into(),
            references: vec![format!("shoal.local/{digest}:1")],
            size_bytes: size,
            last_used_ms: last_used,
            first_seen_ms: 0,
            in_use,
        }
    }

    const NOW: u64 = 1_000_000;

    #[test]
    fn least_recently_used_unused_images_go_until_usage_is_under_the_low_threshold() {
        let images = [
            image("recent", 100, 900_000, false),
            image("old", 100, 10, false),
            image("used", 500, 0, true),
            image("never", 100, 0, false),
            image("older", 100, 20, false),
        ];
        let t = Thresholds {
            min_age_ms: 0,
            ..Thresholds::default()
        };
        let disk = |used: u64| Disk {
            capacity_bytes: 1000,
            available_bytes: 1000 - used,
        };
        // Under the high threshold: nothing.
        assert!(plan(&images, disk(849), t, NOW).is_empty());
        // 900 used, 800 the target: 100 bytes, the least recently used.
        assert_eq!(plan(&images, disk(900), t, NOW), ["never"]);
        // 1000 used: 200 bytes.
        assert_eq!(plan(&images, disk(1000), t, NOW), ["never", "old"]);
        // More than the unused images hold: all of them, never the one in use.
        let t = Thresholds {
            low_percent: 0,
            ..t
        };
        assert_eq!(
            plan(&images, disk(1000), t, NOW),
            ["never", "old", "older", "recent"]
        );
    }

    #[test]
    fn young_images_stay_and_a_high_threshold_of_100_turns_it_off() {
        let mut young = image("young", 100, 0, false);
        young.first_seen_ms = NOW - 1000;
        let full = Disk {
            capacity_bytes: 1000,
            available_bytes: 0,
        };
        assert!(plan(&[young.clone()], full, Thresholds::default(), NOW).is_empty());
        young.first_seen_ms = NOW - 120_000;
        assert_eq!(
            plan(&[young.clone()], full, Thresholds::default(), NOW),
            ["young"]
        );
        let off = Thresholds {
            high_percent: 100,
            ..Thresholds::default()
        };
        assert!(plan(&[young], full, off, NOW).is_empty());
        assert!(off.check().is_ok());
    }

    #[test]
    fn thresholds_are_checked_as_the_kubelet_checks_them() {
        for (high, low, ok) in [
            (85, 80, true),
            (80, 80, false),
            (50, 60, false),
            (101, 0, false),
            (1, 0, true),
        ] {
            let t = Thresholds {
                high_percent: high,
                low_percent: low,
                min_age_ms: 0,
            };
            assert_eq!(t.check().is_ok(), ok, "{high} {low}");
        }
    }
}
