//! `spec.schedule` and `spec.timeZone` of a batch/v1 CronJob: parsed (standard 5-field cron, no
//! seconds, no years, no `TZ=` prefix), with errors that name the field, and the times they name.

use std::str::FromStr;

use chrono::{TimeZone, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde_json::Value;

use crate::FieldError;

/// A parsed `spec.schedule` in its time zone.
#[derive(Debug)]
pub struct Schedule {
    cron: Cron,
    zone: chrono_tz::Tz,
}

/// Parses `spec.schedule` and `spec.timeZone`; the error names the field.
pub fn schedule(cron_job: &Value) -> Result<Schedule, FieldError> {
    let spec = &cron_job["spec"];
    let Some(text) = spec["schedule"].as_str() else {
        return Err(FieldError::new("spec.schedule", "Required value"));
    };
    if text.trim_start().starts_with("TZ=") || text.trim_start().starts_with("CRON_TZ=") {
        return Err(FieldError::new(
            "spec.schedule",
            format!("Invalid value: {text:?}: TZ and CRON_TZ are not supported, use spec.timeZone"),
        ));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(text)
        .map_err(|e| FieldError::new("spec.schedule", format!("Invalid value: {text:?}: {e}")))?;
    let zone = match spec["timeZone"].as_str() {
        None => chrono_tz::Tz::UTC,
        Some(name) => chrono_tz::Tz::from_str(name).map_err(|_| {
            FieldError::new(
                "spec.timeZone",
                format!("Invalid value: {name:?}: unknown time zone"),
            )
        })?,
    };
    Ok(Schedule { cron, zone })
}

impl Schedule {
    /// The latest scheduled time in `(after_ms, now_ms]`, ms since the epoch.
    pub fn latest(&self, after_ms: u64, now_ms: u64) -> Option<u64> {
        let now = self
            .zone
            .timestamp_millis_opt(i64::try_from(now_ms).ok()?)
            .single()?;
        let previous = self.cron.find_previous_occurrence(&now, true).ok()?;
        let at = u64::try_from(previous.with_timezone(&Utc).timestamp_millis()).ok()?;
        (at > after_ms).then_some(at)
    }

    /// The next scheduled time after `after_ms`.
    pub fn next(&self, after_ms: u64) -> Option<u64> {
        let after = self
            .zone
            .timestamp_millis_opt(i64::try_from(after_ms).ok()?)
            .single()?;
        let next = self.cron.find_next_occurrence(&after, false).ok()?;
        u64::try_from(next.with_timezone(&Utc).timestamp_millis()).ok()
    }
}
