//! `spec.podFailurePolicy` of a batch/v1 Job, parsed and checked as the apiserver checks it: the
//! rules the Job controller (`agent/core/src/controllers/job.rs`) judges failed pods by.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::FieldError;

/// What a `podFailurePolicy` rule does with a failed pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureAction {
    /// The Job fails at once (reason `PodFailurePolicy`).
    FailJob,
    /// The failure is not counted toward `backoffLimit`.
    Ignore,
    /// Counted, as without a policy.
    Count,
    /// Not a rule's: the containers of the Job's active pods restarted (`restartPolicy:
    /// OnFailure`) `backoffLimit` times in all, and the Job fails with BackoffLimitExceeded, as
    /// Kubernetes' `pastBackoffLimitOnFailure` decides. Recorded on the pod that tipped it.
    RestartLimit,
}

/// One rule of `spec.podFailurePolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRule {
    pub action: FailureAction,
    pub on_exit_codes: Option<ExitCodes>,
    /// (type, status) of pod conditions, any of which matches.
    pub on_conditions: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitCodes {
    pub container: Option<String>,
    pub not_in: bool,
    pub values: Vec<i64>,
}

/// The rules of `job`'s `spec.podFailurePolicy`, checked as the apiserver checks them (the
/// error names the field). FailIndex needs `backoffLimitPerIndex`, which is not served.
pub fn failure_policy(job: &Value) -> Result<Vec<FailureRule>, FieldError> {
    let policy = &job["spec"]["podFailurePolicy"];
    if policy.is_null() {
        return Ok(Vec::new());
    }
    let restart = &job["spec"]["template"]["spec"]["restartPolicy"];
    if !restart.is_null() && restart != "Never" {
        return Err(FieldError::new(
            "spec.template.spec.restartPolicy",
            format!(
                "Invalid value: {restart}: only \"Never\" is supported when podFailurePolicy is specified"
            ),
        ));
    }
    let containers: Vec<&str> = ["containers", "initContainers"]
        .iter()
        .flat_map(|f| {
            job["spec"]["template"]["spec"][f]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(|c| c["name"].as_str())
        .collect();
    let mut rules = Vec::new();
    for (i, r) in policy["rules"].as_array().into_iter().flatten().enumerate() {
        let at = format!("spec.podFailurePolicy.rules[{i}]");
        let action = match r["action"].as_str() {
            Some("FailJob") => FailureAction::FailJob,
            Some("Ignore") => FailureAction::Ignore,
            Some("Count") => FailureAction::Count,
            Some("FailIndex") => {
                return Err(FieldError::new(
                    format!("{at}.action"),
                    "Invalid value: \"FailIndex\": requires backoffLimitPerIndex, which Shoal does not serve",
                ));
            }
            other => {
                return Err(FieldError::new(
                    format!("{at}.action"),
                    format!(
                        "Unsupported value: {other:?}: supported values: \"Count\", \"FailIndex\", \"FailJob\", \"Ignore\""
                    ),
                ));
            }
        };
        let codes = &r["onExitCodes"];
        let conditions = &r["onPodConditions"];
        if codes.is_null() == conditions.is_null() {
            return Err(FieldError::new(
                at,
                "Invalid value: specifying one of onExitCodes and onPodConditions is required",
            ));
        }
        let on_exit_codes = if codes.is_null() {
            None
        } else {
            let not_in = match codes["operator"].as_str() {
                Some("In") => false,
                Some("NotIn") => true,
                other => {
                    return Err(FieldError::new(
                        format!("{at}.onExitCodes.operator"),
                        format!(
                            "Unsupported value: {other:?}: supported values: \"In\", \"NotIn\""
                        ),
                    ));
                }
            };
            let values: Vec<i64> = codes["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_i64)
                .collect();
            if values.is_empty() || values.len() > 255 {
                return Err(FieldError::new(
                    format!("{at}.onExitCodes.values"),
                    "Invalid value: must have between 1 and 255 exit codes",
                ));
            }
            if !not_in && values.contains(&0) {
                return Err(FieldError::new(
                    format!("{at}.onExitCodes.values"),
                    "Invalid value: 0: must not be 0 for the In operator",
                ));
            }
            let container = codes["containerName"].as_str().map(str::to_owned);
            if let Some(c) = &container
                && !containers.contains(&c.as_str())
            {
                return Err(FieldError::new(
                    format!("{at}.onExitCodes.containerName"),
                    format!(
                        "Invalid value: {c:?}: must be one of the container or initContainer names in the pod template"
                    ),
                ));
            }
            Some(ExitCodes {
                container,
                not_in,
                values,
            })
        };
        let on_conditions = conditions
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["type"].as_str().unwrap_or("").to_owned(),
                    c["status"].as_str().unwrap_or("True").to_owned(),
                )
            })
            .collect();
        rules.push(FailureRule {
            action,
            on_exit_codes,
            on_conditions,
        });
    }
    Ok(rules)
}
