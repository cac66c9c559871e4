//! The spec of an autoscaling/v2 HorizontalPodAutoscaler: parsed and checked as the apiserver
//! checks it (errors name the field), and defaulted as the apiserver defaults it. The autoscaler
//! itself (`agent/core/src/controllers/hpa.rs`) decides from the parsed [`Spec`].

use serde_json::{Value, json};

use crate::FieldError;
use crate::quantity;

/// Kubernetes' default target when `spec.metrics` is empty: 80% of the CPU request.
pub const DEFAULT_CPU_UTILIZATION: u64 = 80;

/// Replica counts are Kubernetes' int32.
pub const MAX_REPLICAS: i64 = i32::MAX as i64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Cpu,
    Memory,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        }
    }

    /// A request or a value in this resource's unit (millicores, bytes).
    pub fn parse(self, q: &str) -> Result<u64, quantity::QuantityError> {
        match self {
            Resource::Cpu => quantity::cpu_millis(q),
            Resource::Memory => quantity::bytes(q),
        }
    }

    pub fn format(self, v: u64) -> String {
        match self {
            Resource::Cpu => format!("{v}m"),
            Resource::Memory => v.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Percent of the pods' requests (`averageUtilization`).
    Utilization(u64),
    /// Per pod, in the resource's unit (`averageValue`).
    AverageValue(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub resource: Resource,
    pub target: Target,
}

impl Metric {
    /// How Kubernetes names the metric in messages.
    pub fn describe(&self) -> String {
        match self.target {
            Target::Utilization(_) => {
                format!(
                    "{} resource utilization (percentage of request)",
                    self.resource.name()
                )
            }
            Target::AverageValue(_) => format!("{} resource", self.resource.name()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Pods,
    Percent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub kind: PolicyKind,
    pub value: i64,
    pub period_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    Max,
    Min,
    Disabled,
}

/// One direction of `spec.behavior`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub window_ms: u64,
    pub select: Select,
    pub policies: Vec<Policy>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behavior {
    pub up: Rules,
    pub down: Rules,
}

/// The parts of an HPA's spec the algorithm reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub target_kind: String,
    pub target_name: String,
    pub min: i64,
    pub max: i64,
    pub metrics: Vec<Metric>,
    pub behavior: Option<Behavior>,
}

fn field_err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError::new(field, message)
}

/// Kubernetes' defaults for `behavior.scaleUp` (each field independently).
fn up_defaults() -> Rules {
    Rules {
        window_ms: 0,
        select: Select::Max,
        policies: vec![
            Policy {
                kind: PolicyKind::Pods,
                value: 4,
                period_ms: 15_000,
            },
            Policy {
                kind: PolicyKind::Percent,
                value: 100,
                period_ms: 15_000,
            },
        ],
    }
}

/// Kubernetes' defaults for `behavior.scaleDown`.
fn down_defaults() -> Rules {
    Rules {
        window_ms: 300_000,
        select: Select::Max,
        policies: vec![Policy {
            kind: PolicyKind::Percent,
            value: 100,
            period_ms: 15_000,
        }],
    }
}

fn int_field(v: &Value, field: &str, min: i64, max: i64) -> Result<Option<i64>, FieldError> {
    if v.is_null() {
        return Ok(None);
    }
    let n = v
        .as_i64()
        .ok_or_else(|| field_err(field, format!("Invalid value: {v}: must be an integer")))?;
    if n < min {
        return Err(field_err(
            field,
            format!("Invalid value: {n}: must be greater than or equal to {min}"),
        ));
    }
    if n > max {
        return Err(field_err(
            field,
            format!("Invalid value: {n}: must be less than or equal to {max}"),
        ));
    }
    Ok(Some(n))
}

fn parse_rules(v: &Value, path: &str, defaults: Rules) -> Result<Rules, FieldError> {
    if v.is_null() {
        return Ok(defaults);
    }
    let window_ms = match int_field(
        &v["stabilizationWindowSeconds"],
        &format!("{path}.stabilizationWindowSeconds"),
        0,
        3600,
    )? {
        Some(s) => s as u64 * 1000,
        None => defaults.window_ms,
    };
    let select = match v["selectPolicy"].as_str() {
        None => defaults.select,
        Some("Max") => Select::Max,
        Some("Min") => Select::Min,
        Some("Disabled") => Select::Disabled,
        Some(other) => {
            return Err(field_err(
                format!("{path}.selectPolicy"),
                format!(
                    "Unsupported value: {other:?}: supported values: \"Disabled\", \"Max\", \"Min\""
                ),
            ));
        }
    };
    let policies = match v["policies"].as_array() {
        None => defaults.policies,
        Some(list) => {
            let mut policies = Vec::new();
            for (i, p) in list.iter().enumerate() {
                let at = format!("{path}.policies[{i}]");
                let kind = match p["type"].as_str() {
                    Some("Pods") => PolicyKind::Pods,
                    Some("Percent") => PolicyKind::Percent,
                    other => {
                        return Err(field_err(
                            format!("{at}.type"),
                            format!(
                                "Unsupported value: {other:?}: supported values: \"Percent\", \"Pods\""
                            ),
                        ));
                    }
                };
                let value = int_field(&p["value"], &format!("{at}.value"), 1, MAX_REPLICAS)?
                    .ok_or_else(|| field_err(format!("{at}.value"), "Required value"))?;
                let period =
                    int_field(&p["periodSeconds"], &format!("{at}.periodSeconds"), 1, 1800)?
                        .ok_or_else(|| {
                            field_err(format!("{at}.periodSeconds"), "Required value")
                        })?;
                policies.push(Policy {
                    kind,
                    value,
                    period_ms: period as u64 * 1000,
                });
            }
            if policies.is_empty() && select != Select::Disabled {
                return Err(field_err(
                    format!("{path}.policies"),
                    "Required value: must specify at least one Policy",
                ));
            }
            policies
        }
    };
    Ok(Rules {
        window_ms,
        select,
        policies,
    })
}

fn parse_metric(m: &Value, at: &str) -> Result<Metric, FieldError> {
    match m["type"].as_str() {
        Some("Resource") => {}
        Some(other @ ("Pods" | "Object" | "External" | "ContainerResource")) => {
            return Err(field_err(
                format!("{at}.type"),
                format!(
                    "Unsupported value: {other:?}: Shoal serves Resource metrics (cpu and memory) only"
                ),
            ));
        }
        other => {
            return Err(field_err(
                format!("{at}.type"),
                format!(
                    "Unsupported value: {other:?}: supported values: \"ContainerResource\", \"External\", \"Object\", \"Pods\", \"Resource\""
                ),
            ));
        }
    }
    let resource = &m["resource"];
    let resource_name = match resource["name"].as_str() {
        Some("cpu") => Resource::Cpu,
        Some("memory") => Resource::Memory,
        Some(other) => {
            return Err(field_err(
                format!("{at}.resource.name"),
                format!("Unsupported value: {other:?}: supported values: \"cpu\", \"memory\""),
            ));
        }
        None => return Err(field_err(format!("{at}.resource.name"), "Required value")),
    };
    let target = &resource["target"];
    let target = match target["type"].as_str() {
        Some("Utilization") => Target::Utilization(
            int_field(
                &target["averageUtilization"],
                &format!("{at}.resource.target.averageUtilization"),
                1,
                MAX_REPLICAS,
            )?
            .ok_or_else(|| {
                field_err(
                    format!("{at}.resource.target.averageUtilization"),
                    "Required value: must set averageUtilization when type is Utilization",
                )
            })? as u64,
        ),
        Some("AverageValue") => {
            let field = format!("{at}.resource.target.averageValue");
            let text = match &target["averageValue"] {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(field_err(field, "Required value")),
            };
            let value = resource_name
                .parse(&text)
                .map_err(|e| field_err(&field, format!("Invalid value: {text:?}: {e}")))?;
            if value == 0 {
                return Err(field_err(field, "Invalid value: must be positive"));
            }
            Target::AverageValue(value)
        }
        Some("Value") => {
            return Err(field_err(
                format!("{at}.resource.target.type"),
                "Unsupported value: \"Value\": a Resource metric takes Utilization or AverageValue",
            ));
        }
        other => {
            return Err(field_err(
                format!("{at}.resource.target.type"),
                format!(
                    "Unsupported value: {other:?}: supported values: \"AverageValue\", \"Utilization\""
                ),
            ));
        }
    };
    Ok(Metric {
        resource: resource_name,
        target,
    })
}

impl Spec {
    /// Reads and checks an HPA (the API refuses what this refuses, naming the field).
    pub fn parse(hpa: &Value) -> Result<Self, FieldError> {
        let spec = &hpa["spec"];
        let target = &spec["scaleTargetRef"];
        let target_kind = target["kind"]
            .as_str()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| field_err("spec.scaleTargetRef.kind", "Required value"))?;
        let target_name = target["name"]
            .as_str()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| field_err("spec.scaleTargetRef.name", "Required value"))?;
        let max = int_field(&spec["maxReplicas"], "spec.maxReplicas", 1, MAX_REPLICAS)?
            .ok_or_else(|| field_err("spec.maxReplicas", "Required value"))?;
        let min =
            int_field(&spec["minReplicas"], "spec.minReplicas", 1, MAX_REPLICAS)?.unwrap_or(1);
        if min > max {
            return Err(field_err(
                "spec.minReplicas",
                format!("Invalid value: {min}: must be less than or equal to maxReplicas"),
            ));
        }
        let mut metrics = Vec::new();
        for (i, m) in spec["metrics"].as_array().into_iter().flatten().enumerate() {
            metrics.push(parse_metric(m, &format!("spec.metrics[{i}]"))?);
        }
        if metrics.is_empty() {
            metrics.push(Metric {
                resource: Resource::Cpu,
                target: Target::Utilization(DEFAULT_CPU_UTILIZATION),
            });
        }
        let behavior = &spec["behavior"];
        let behavior = if behavior.is_null() {
            None
        } else {
            Some(Behavior {
                up: parse_rules(&behavior["scaleUp"], "spec.behavior.scaleUp", up_defaults())?,
                down: parse_rules(
                    &behavior["scaleDown"],
                    "spec.behavior.scaleDown",
                    down_defaults(),
                )?,
            })
        };
        Ok(Self {
            target_kind: target_kind.to_owned(),
            target_name: target_name.to_owned(),
            min,
            max,
            metrics,
            behavior,
        })
    }
}

/// The apiserver's defaults for an autoscaling/v2 HPA: `minReplicas` 1, 80% CPU when no
/// metric is given, and every unset field of a given `behavior` direction.
pub fn default(hpa: &mut Value) {
    let spec = &mut hpa["spec"];
    if !spec.is_object() {
        return;
    }
    if spec["minReplicas"].is_null() {
        spec["minReplicas"] = json!(1);
    }
    if spec["metrics"].as_array().is_none_or(Vec::is_empty) {
        spec["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]);
    }
    if !spec["behavior"].is_object() {
        return;
    }
    for (direction, defaults) in [("scaleUp", up_defaults()), ("scaleDown", down_defaults())] {
        let rules = &mut spec["behavior"][direction];
        if !rules.is_object() {
            *rules = json!({});
        }
        if rules["stabilizationWindowSeconds"].is_null() {
            rules["stabilizationWindowSeconds"] = json!(defaults.window_ms / 1000);
        }
        if rules["selectPolicy"].is_null() {
            rules["selectPolicy"] = json!("Max");
        }
        if rules["policies"].is_null() {
            rules["policies"] = defaults
                .policies
                .iter()
                .map(|p| {
                    json!({"type": match p.kind { PolicyKind::Pods => "Pods", PolicyKind::Percent => "Percent" },
                        "value": p.value, "periodSeconds": p.period_ms / 1000})
                })
                .collect();
        }
    }
}
