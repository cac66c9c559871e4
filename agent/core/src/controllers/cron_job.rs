//! The CronJob controller (pure): at each time `spec.schedule` names (standard 5-field cron,
//! in `spec.timeZone` or UTC), create one Job from `spec.jobTemplate`, honouring
//! `concurrencyPolicy` (Allow, Forbid, Replace), `startingDeadlineSeconds`, `suspend` and the
//! successful/failed history limits.
//!
//! **Exactly one Job per scheduled time**: the Job's name is derived from the time
//! (`<cronjob>-<minutes since the epoch>`, as Kubernetes names it), and a Job of that name is
//! created only if none exists. Two owners that acted on the two sides of a partition wrote the
//! same key: after the heal the store keeps one incarnation of it (`crdt-state`: the later create
//! wins whole). The last scheduled time is recorded on the CronJob
//! (`batch.shoal.io/last-schedule`) when its Job is created, so a time whose Job the history limit
//! already deleted is never run again.

use serde_json::{Value, json};

use shoal_model::cron::schedule;

use super::job;
use super::workload::{Action, PodView, controller_of, controller_ref, created_ms};

/// The annotation every Job of a CronJob carries: the time it was scheduled for.
pub const SCHEDULED_KEY: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// The CronJob's own record of the last time it created a Job for.
pub const LAST_SCHEDULE_KEY: &str = "batch.shoal.io/last-schedule";

use super::workload::rfc3339_seconds as rfc3339_ms;

fn parse_ms(text: Option<&str>) -> Option<u64> {
    let t = humantime::parse_rfc3339(text?).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// When a Job of a CronJob was scheduled for.
fn scheduled_ms(job: &Value) -> Option<u64> {
    parse_ms(job["metadata"]["annotations"][SCHEDULED_KEY].as_str())
}

/// The last time `cron_job` created a Job for: its own record, or its Jobs', whichever is later.
fn last_scheduled(cron_job: &Value, owned: &[&Value]) -> Option<u64> {
    let recorded = parse_ms(cron_job["metadata"]["annotations"][LAST_SCHEDULE_KEY].as_str());
    owned
        .iter()
        .filter_map(|j| scheduled_ms(j))
        .chain(recorded)
        .max()
}

fn finished(job_object: &Value, now_ms: u64) -> Option<job::Finished> {
    job::progress(job_object, &job::ledger(job_object), now_ms).finished
}

fn uid(object: &Value) -> &str {
    object["metadata"]["uid"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn namespace(object: &Value) -> &str {
    object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
}

/// Deletes a Job and the pods it controls (a controller's delete runs no garbage collector).
fn delete_job(job_object: &Value, pods: &[PodView], actions: &mut Vec<Action>) {
    for pod in pods
        .iter()
        .filter(|p| p.controller_uid.as_deref() == Some(uid(job_object)))
    {
        actions.push(Action::delete_pod(pod));
    }
    actions.push(Action::Delete {
        kind: "Job",
        namespace: namespace(job_object).to_owned(),
        name: name(job_object).to_owned(),
        uid: uid(job_object).to_owned(),
    });
}

/// What `cron_job` needs done at `now_ms`, given the Jobs and pods of its namespace.
pub fn reconcile(cron_job: &Value, jobs: &[Value], pods: &[PodView], now_ms: u64) -> Vec<Action> {
    let mut actions = Vec::new();
    if !cron_job["metadata"]["deletionTimestamp"].is_null() {
        return actions;
    }
    let spec = &cron_job["spec"];
    let owned: Vec<&Value> = jobs
        .iter()
        .filter(|j| controller_of(j).as_deref() == Some(uid(cron_job)))
        .collect();

    // History: the newest `limit` finished Jobs of each kind stay.
    let mut complete: Vec<&Value> = Vec::new();
    let mut failed: Vec<&Value> = Vec::new();
    let mut active: Vec<&Value> = Vec::new();
    for j in &owned {
        match finished(j, now_ms) {
            Some(job::Finished::Complete { .. }) => complete.push(j),
            Some(job::Finished::Failed { .. }) => failed.push(j),
            None => active.push(j),
        }
    }
    for (list, field, default) in [
        (&mut complete, "successfulJobsHistoryLimit", 3),
        (&mut failed, "failedJobsHistoryLimit", 1),
    ] {
        let limit = spec[field].as_u64().unwrap_or(default) as usize;
        list.sort_by_key(|j| std::cmp::Reverse((scheduled_ms(j), name(j).to_owned())));
        for j in list.iter().skip(limit) {
            delete_job(j, pods, &mut actions);
        }
    }
    if spec["suspend"] == true {
        return actions;
    }
    let Ok(schedule) = schedule(cron_job) else {
        return actions; // refused by the API; a stored one that does not parse runs nothing
    };
    let after = last_scheduled(cron_job, &owned).unwrap_or_else(|| created_ms(cron_job));
    let Some(at) = schedule.latest(after, now_ms) else {
        return actions;
    };
    if let Some(deadline) = spec["startingDeadlineSeconds"].as_u64()
        && now_ms.saturating_sub(at) > deadline.saturating_mul(1000)
    {
        return actions; // missed: too late to start
    }
    let job_name = format!("{}-{}", name(cron_job), at / 60_000);
    if jobs.iter().any(|j| name(j) == job_name) {
        return actions;
    }
    match spec["concurrencyPolicy"].as_str().unwrap_or("Allow") {
        "Forbid" if !active.is_empty() => return actions,
        "Replace" => {
            for j in &active {
                delete_job(j, pods, &mut actions);
            }
        }
        _ => {}
    }
    actions.push(Action::Create(new_job(cron_job, &job_name, at)));
    actions.push(Action::Annotate {
        kind: "CronJob",
        namespace: namespace(cron_job).to_owned(),
        name: name(cron_job).to_owned(),
        uid: uid(cron_job).to_owned(),
        annotations: [(LAST_SCHEDULE_KEY.to_owned(), rfc3339_ms(at))].into(),
    });
    actions
}

/// The Job of `cron_job` for the time `at`, from its `jobTemplate`, defaulted like any Job.
pub fn new_job(cron_job: &Value, job_name: &str, at: u64) -> Value {
    let template = &cron_job["spec"]["jobTemplate"];
    let mut annotations = template["metadata"]["annotations"].clone();
    if !annotations.is_object() {
        annotations = json!({});
    }
    annotations[SCHEDULED_KEY] = json!(rfc3339_ms(at));
    let mut job_object = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": namespace(cron_job),
            "labels": template["metadata"]["labels"],
            "annotations": annotations,
            "ownerReferences": [controller_ref(cron_job)],
        },
        "spec": template["spec"],
    });
    if let Some(meta) = job_object["metadata"].as_object_mut() {
        meta.retain(|_, v| !v.is_null());
    }
    shoal_model::validation::default("Job", &mut job_object);
    job_object
}

/// When `cron_job` is next due after `now_ms` (its next scheduled time), as an
/// [`Action::Requeue`]; none while suspended or if its schedule does not parse.
pub fn next_due(cron_job: &Value, now_ms: u64) -> Option<Action> {
    if cron_job["spec"]["suspend"] == true || !cron_job["metadata"]["deletionTimestamp"].is_null() {
        return None;
    }
    let at_ms = schedule(cron_job).ok()?.next(now_ms)?;
    Some(Action::Requeue { at_ms })
}

/// The observed status of `cron_job`: its running Jobs, when it last scheduled one and when
/// one last succeeded.
pub fn status(cron_job: &Value, jobs: &[Value], now_ms: u64) -> Value {
    let owned: Vec<&Value> = jobs
        .iter()
        .filter(|j| controller_of(j).as_deref() == Some(uid(cron_job)))
        .collect();
    let mut active = Vec::new();
    let mut last_success: Option<u64> = None;
    for j in &owned {
        match finished(j, now_ms) {
            None => active.push(json!({"apiVersion": "batch/v1", "kind": "Job",
                "name": name(j), "namespace": namespace(j), "uid": uid(j)})),
            Some(job::Finished::Complete { at_ms }) => {
                last_success = last_success.max(Some(at_ms));
            }
            Some(job::Finished::Failed { .. }) => {}
        }
    }
    let mut status = json!({});
    if !active.is_empty() {
        status["active"] = json!(active);
    }
    if let Some(at) = last_scheduled(cron_job, &owned) {
        status["lastScheduleTime"] = json!(rfc3339_ms(at));
    }
    if let Some(at) = last_success {
        status["lastSuccessfulTime"] = json!(rfc3339_ms(at));
    }
    status
}

#[cfg(test)]
mod tests {
    use super::super::workload::testing::{created, deleted};
    use super::*;

    fn deleted_jobs(actions: &[Action]) -> Vec<&str> {
        deleted(actions, Some("Job"))
    }

    /// 2026-01-01T00:00:00Z.
    const T0: u64 = 1_767_225_600_000;
    const MIN: u64 = 60_000;

    fn cron_job(spec: Value) -> Value {
        let mut full = json!({
            "schedule": "*/5 * * * *",
            "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "i"}]}}}},
        });
        for (k, v) in spec.as_object().unwrap() {
            full[k] = v.clone();
        }
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "tick", "namespace": "default", "uid": "cj1",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": full})
    }

    /// A Job `reconcile` created, as the store would hold it (with a uid), ended or not.
    fn stored(job_object: &Value, uid: &str, outcome: Option<job::Outcome>) -> Value {
        let mut j = job_object.clone();
        j["metadata"]["uid"] = json!(uid);
        j["metadata"]["creationTimestamp"] = j["metadata"]["annotations"][SCHEDULED_KEY].clone();
        if let Some(result) = outcome {
            let ended = job::Ended {
                result,
                index: None,
                at_ms: scheduled_ms(&j).unwrap() + 1000,
                action: None,
                message: None,
            };
            j["metadata"]["annotations"][format!("{}pod", job::LEDGER_PREFIX)] =
                json!(serde_json::to_string(&ended).unwrap());
            if result == job::Outcome::Failed {
                j["spec"]["backoffLimit"] = json!(0);
            }
        }
        j
    }

    /// The loop is asked back at the next scheduled time, not at its next resync.
    #[test]
    fn a_cron_job_is_next_due_at_its_next_scheduled_time() {
        let cj = cron_job(json!({}));
        assert_eq!(
            next_due(&cj, T0 + 4 * MIN),
            Some(Action::Requeue {
                at_ms: T0 + 5 * MIN
            })
        );
        assert_eq!(
            next_due(&cj, T0 + 5 * MIN),
            Some(Action::Requeue {
                at_ms: T0 + 10 * MIN
            })
        );
        assert_eq!(next_due(&cron_job(json!({"suspend": true})), T0), None);
        assert_eq!(next_due(&cron_job(json!({"schedule": "nope"})), T0), None);
    }

    #[test]
    fn one_job_per_scheduled_time_named_after_it() {
        let cj = cron_job(json!({}));
        assert!(reconcile(&cj, &[], &[], T0 + 4 * MIN).is_empty(), "not yet");
        let a = reconcile(&cj, &[], &[], T0 + 5 * MIN + 30_000);
        let jobs = created(&a);
        assert_eq!(jobs.len(), 1);
        let j = jobs[0];
        assert_eq!(
            j["metadata"]["name"],
            format!("tick-{}", (T0 + 5 * MIN) / MIN)
        );
        assert_eq!(
            j["metadata"]["annotations"][SCHEDULED_KEY],
            "2026-01-01T00:05:00Z"
        );
        assert_eq!(j["metadata"]["ownerReferences"][0]["uid"], "cj1");
        assert_eq!(j["spec"]["backoffLimit"], 6, "defaulted like any Job");
        assert!(matches!(&a[1], Action::Annotate { annotations, .. }
            if annotations[LAST_SCHEDULE_KEY] == "2026-01-01T00:05:00Z"));
        // The Job exists (whoever made it, on whichever side): not again.
        let existing = [stored(j, "j1", None)];
        assert!(reconcile(&cj, &existing, &[], T0 + 6 * MIN).is_empty());
        // Also once the history limit deleted it: the CronJob's own record says it ran.
        let mut recorded = cj.clone();
        recorded["metadata"]["annotations"] = json!({LAST_SCHEDULE_KEY: "2026-01-01T00:05:00Z"});
        assert!(reconcile(&recorded, &[], &[], T0 + 9 * MIN).is_empty());
        // Missed schedules while down: only the latest runs.
        let a = reconcile(&recorded, &[], &[], T0 + 31 * MIN);
        assert_eq!(
            created(&a)[0]["metadata"]["annotations"][SCHEDULED_KEY],
            "2026-01-01T00:30:00Z"
        );
    }

    #[test]
    fn concurrency_policies() {
        let first = new_job(&cron_job(json!({})), "tick-x", T0 + 5 * MIN);
        let running = [stored(&first, "j1", None)];
        let at = T0 + 10 * MIN;
        assert_eq!(
            created(&reconcile(&cron_job(json!({})), &running, &[], at)).len(),
            1
        );
        let forbid = cron_job(json!({"concurrencyPolicy": "Forbid"}));
        assert!(reconcile(&forbid, &running, &[], at).is_empty());
        let replace = cron_job(json!({"concurrencyPolicy": "Replace"}));
        let a = reconcile(&replace, &running, &[], at);
        assert_eq!(deleted_jobs(&a), ["tick-x"]);
        assert_eq!(created(&a).len(), 1);
        // Finished jobs do not hold Forbid back.
        let done = [stored(&first, "j1", Some(job::Outcome::Succeeded))];
        assert_eq!(created(&reconcile(&forbid, &done, &[], at)).len(), 1);
    }

    #[test]
    fn suspend_deadline_and_history_limits() {
        let at = T0 + 5 * MIN;
        assert!(reconcile(&cron_job(json!({"suspend": true})), &[], &[], at).is_empty());
        let late = cron_job(json!({"startingDeadlineSeconds": 10}));
        assert!(reconcile(&late, &[], &[], at + 11_000).is_empty());
        assert_eq!(created(&reconcile(&late, &[], &[], at + 9_000)).len(), 1);

        let cj = cron_job(json!({"successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 0}));
        let jobs: Vec<Value> = [
            (1, Some(job::Outcome::Succeeded)),
            (2, Some(job::Outcome::Succeeded)),
            (3, Some(job::Outcome::Failed)),
        ]
        .iter()
        .map(|(i, outcome)| {
            stored(
                &new_job(&cj, &format!("tick-{i}"), T0 + i * 5 * MIN),
                &format!("j{i}"),
                *outcome,
            )
        })
        .collect();
        let a = reconcile(&cj, &jobs, &[], T0 + 16 * MIN);
        let mut gone = deleted_jobs(&a);
        gone.sort();
        assert_eq!(gone, ["tick-1", "tick-3"], "the newest success stays");
        let s = status(&cj, &jobs, T0 + 16 * MIN);
        assert_eq!(s["lastScheduleTime"], "2026-01-01T00:15:00Z");
        assert_eq!(s["lastSuccessfulTime"], "2026-01-01T00:10:01Z");
        assert!(s["active"].is_null());
    }

    #[test]
    fn schedules_follow_their_time_zone_across_daylight_saving() {
        // 02:30 every day in New York: on 2026-03-08 the clocks jump from 02:00 to 03:00, so
        // that day has no 02:30 — it runs once, at 03:00 EDT, the first time after the jump
        // (neither skipped nor doubled); the days around it run 5 h then 4 h after UTC midnight.
        let cj = cron_job(json!({"schedule": "30 2 * * *", "timeZone": "America/New_York"}));
        let s = schedule(&cj).unwrap();
        let day = 24 * 60 * MIN;
        let mar7 = 1_772_841_600_000; // 2026-03-07T00:00:00Z
        assert_eq!(s.next(mar7), Some(mar7 + 7 * 60 * MIN + 30 * MIN));
        let mar8 = mar7 + day;
        assert_eq!(s.next(mar7 + 8 * 60 * MIN), Some(mar8 + 7 * 60 * MIN));
        let mar9 = mar7 + 2 * day;
        assert_eq!(
            s.next(mar8 + 7 * 60 * MIN),
            Some(mar9 + 6 * 60 * MIN + 30 * MIN)
        );
        assert_eq!(s.next(mar9), Some(mar9 + 6 * 60 * MIN + 30 * MIN));
        assert!(matches!(
            schedule(&cron_job(json!({"timeZone": "Mars/Olympus"}))),
            Err(shoal_model::FieldError { field, .. }) if field == "spec.timeZone"
        ));
        assert!(matches!(
            schedule(&cron_job(json!({"schedule": "TZ=UTC * * * * *"}))),
            Err(shoal_model::FieldError { field, .. }) if field == "spec.schedule"
        ));
        assert!(matches!(
            schedule(&cron_job(json!({"schedule": "61 * * * *"}))),
            Err(shoal_model::FieldError { field, .. }) if field == "spec.schedule"
        ));
        assert!(schedule(&cron_job(json!({"schedule": "@hourly"}))).is_ok());
    }
}
