//! The scheduling fields of a pod spec, checked as the apiserver checks them: label selectors
//! of pod affinity terms and spread constraints, node selector terms, topology keys, weights,
//! `matchLabelKeys`/`mismatchLabelKeys`, and the topology spread constraints' values. A spec
//! that passes is one the auction can read ([`PodRequest::from_pod`] is run last, so anything
//! it refuses is refused here first, naming the field); one it cannot read would otherwise
//! stay Pending with no reason given.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{FieldError, err};
use crate::placement::{PodRequest, RequestError};

/// Every scheduling field of the pod spec at `path`.
pub(super) fn check(spec: &Value, path: &str) -> Result<(), FieldError> {
    let affinity = &spec["affinity"];
    let node_affinity = &affinity["nodeAffinity"];
    let at = format!("{path}.affinity.nodeAffinity");
    let required = &node_affinity["requiredDuringSchedulingIgnoredDuringExecution"];
    for (i, term) in items(&required["nodeSelectorTerms"]) {
        node_selector_term(
            term,
            &format!("{at}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"),
        )?;
    }
    for (i, p) in items(&node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]) {
        let at = format!("{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
        weight(&p["weight"], &format!("{at}.weight"))?;
        node_selector_term(&p["preference"], &format!("{at}.preference"))?;
    }
    for kind in ["podAffinity", "podAntiAffinity"] {
        let at = format!("{path}.affinity.{kind}");
        for (i, term) in items(&affinity[kind]["requiredDuringSchedulingIgnoredDuringExecution"]) {
            pod_affinity_term(
                term,
                &format!("{at}.requiredDuringSchedulingIgnoredDuringExecution[{i}]"),
            )?;
        }
        for (i, p) in items(&affinity[kind]["preferredDuringSchedulingIgnoredDuringExecution"]) {
            let at = format!("{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
            weight(&p["weight"], &format!("{at}.weight"))?;
            pod_affinity_term(&p["podAffinityTerm"], &format!("{at}.podAffinityTerm"))?;
        }
    }
    let mut pairs = BTreeSet::new();
    for (i, c) in items(&spec["topologySpreadConstraints"]) {
        spread(
            c,
            &format!("{path}.topologySpreadConstraints[{i}]"),
            &mut pairs,
        )?;
    }
    // What the auction reads, read once as it will be: whatever it cannot read is refused now.
    let pod = serde_json::json!({"metadata": {}, "spec": spec});
    PodRequest::from_pod(&pod).map_err(|e| match e {
        RequestError::At { field, source } => err(
            field.replacen("spec", path, 1),
            format!("Invalid value: {source}"),
        ),
        other => err(path, format!("Invalid value: {other}")),
    })?;
    Ok(())
}

/// The entries of a list field with their indices (none when absent or not a list: the
/// type checks of the caller name those).
fn items(v: &Value) -> impl Iterator<Item = (usize, &Value)> {
    v.as_array().into_iter().flatten().enumerate()
}

fn weight(v: &Value, at: &str) -> Result<(), FieldError> {
    if v.as_i64().is_some_and(|w| (1..=100).contains(&w)) {
        Ok(())
    } else {
        Err(err(
            at,
            format!("Invalid value: {v}: must be in the range 1-100"),
        ))
    }
}

fn label_key(key: &str, at: &str) -> Result<(), FieldError> {
    shoal_state::labels::validate_key(key)
        .map_err(|e| err(at, format!("Invalid value: {key:?}: {e}")))
}

fn topology_key(v: &Value, at: &str) -> Result<(), FieldError> {
    match v.as_str() {
        None | Some("") => Err(err(at, "Required value: can not be empty")),
        Some(key) => label_key(key, at),
    }
}

/// A label selector (`matchLabels`, `matchExpressions` with In, NotIn, Exists, DoesNotExist).
fn label_selector(v: &Value, at: &str) -> Result<(), FieldError> {
    if v.is_null() {
        return Ok(());
    }
    if !v.is_object() {
        return Err(err(at, "Invalid value: must be an object"));
    }
    if !v["matchLabels"].is_null() && !v["matchLabels"].is_object() {
        return Err(err(
            format!("{at}.matchLabels"),
            "Invalid value: must be an object",
        ));
    }
    for (k, value) in v["matchLabels"].as_object().into_iter().flatten() {
        let field = format!("{at}.matchLabels");
        label_key(k, &field)?;
        let Some(text) = value.as_str() else {
            return Err(err(
                format!("{field}.{k}"),
                "Invalid value: must be a string",
            ));
        };
        shoal_state::labels::validate_value(k, text)
            .map_err(|e| err(format!("{field}.{k}"), format!("Invalid value: {e}")))?;
    }
    for (j, e) in items(&v["matchExpressions"]) {
        expression(
            e,
            &format!("{at}.matchExpressions[{j}]"),
            &["DoesNotExist", "Exists", "In", "NotIn"],
        )?;
    }
    Ok(())
}

/// A node selector term: `matchExpressions` over labels (also Gt and Lt) and
/// `matchFields` (only `metadata.name`, as upstream).
fn node_selector_term(v: &Value, at: &str) -> Result<(), FieldError> {
    for (j, e) in items(&v["matchExpressions"]) {
        expression(
            e,
            &format!("{at}.matchExpressions[{j}]"),
            &["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"],
        )?;
    }
    for (j, e) in items(&v["matchFields"]) {
        let at = format!("{at}.matchFields[{j}]");
        if e["key"] != "metadata.name" {
            return Err(err(
                format!("{at}.key"),
                format!(
                    "Invalid value: {}: not a valid field selector key",
                    e["key"]
                ),
            ));
        }
        expression(e, &at, &["In", "NotIn"])?;
    }
    Ok(())
}

/// One requirement: a valid key, a supported operator, and the values it needs.
fn expression(e: &Value, at: &str, operators: &[&str]) -> Result<(), FieldError> {
    let key = e["key"].as_str().unwrap_or_default();
    if key.is_empty() {
        return Err(err(format!("{at}.key"), "Required value"));
    }
    if key != "metadata.name" {
        label_key(key, &format!("{at}.key"))?;
    }
    let operator = e["operator"].as_str().unwrap_or_default();
    if !operators.contains(&operator) {
        let supported: Vec<String> = operators.iter().map(|o| format!("{o:?}")).collect();
        return Err(err(
            format!("{at}.operator"),
            format!(
                "Unsupported value: {operator:?}: supported values: {}",
                supported.join(", ")
            ),
        ));
    }
    let values = e["values"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !e["values"].is_null() && !e["values"].is_array() {
        return Err(err(format!("{at}.values"), "Invalid value: must be a list"));
    }
    match operator {
        "In" | "NotIn" if values.is_empty() => Err(err(
            format!("{at}.values"),
            "Required value: must be specified when `operator` is 'In' or 'NotIn'",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(err(
            format!("{at}.values"),
            "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt"
            if values.len() != 1
                || values[0].as_str().is_none_or(|v| v.parse::<i64>().is_err()) =>
        {
            Err(err(
                format!("{at}.values"),
                "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
            ))
        }
        _ => Ok(()),
    }
}

/// A list of label keys (`matchLabelKeys`, `mismatchLabelKeys`), each valid.
fn label_keys<'a>(v: &'a Value, at: &str) -> Result<Vec<&'a str>, FieldError> {
    if !v.is_null() && !v.is_array() {
        return Err(err(at, "Invalid value: must be a list"));
    }
    let mut keys = Vec::new();
    for (i, k) in items(v) {
        let Some(key) = k.as_str() else {
            return Err(err(format!("{at}[{i}]"), "Invalid value: must be a string"));
        };
        label_key(key, &format!("{at}[{i}]"))?;
        keys.push(key);
    }
    Ok(keys)
}

/// A pod (anti-)affinity term: topology key, selectors, and upstream's rules for
/// `matchLabelKeys`/`mismatchLabelKeys`: only with a `labelSelector`, and no key in both.
fn pod_affinity_term(term: &Value, at: &str) -> Result<(), FieldError> {
    topology_key(&term["topologyKey"], &format!("{at}.topologyKey"))?;
    label_selector(&term["labelSelector"], &format!("{at}.labelSelector"))?;
    label_selector(
        &term["namespaceSelector"],
        &format!("{at}.namespaceSelector"),
    )?;
    for (i, ns) in items(&term["namespaces"]) {
        let name = ns.as_str().unwrap_or_default();
        shoal_state::labels::check_dns_label(name).map_err(|r| {
            err(
                format!("{at}.namespaces[{i}]"),
                format!("Invalid value: {ns}: {r}"),
            )
        })?;
    }
    let matching = label_keys(&term["matchLabelKeys"], &format!("{at}.matchLabelKeys"))?;
    let mismatching = label_keys(
        &term["mismatchLabelKeys"],
        &format!("{at}.mismatchLabelKeys"),
    )?;
    if term["labelSelector"].is_null() {
        for (field, keys) in [
            ("matchLabelKeys", &matching),
            ("mismatchLabelKeys", &mismatching),
        ] {
            if !keys.is_empty() {
                return Err(err(
                    format!("{at}.{field}"),
                    "Forbidden: must not be specified when labelSelector is not set",
                ));
            }
        }
    }
    if let Some((i, key)) = mismatching
        .iter()
        .enumerate()
        .find(|(_, k)| matching.contains(k))
    {
        return Err(err(
            format!("{at}.mismatchLabelKeys[{i}]"),
            format!("Invalid value: {key:?}: exists in both matchLabelKeys and mismatchLabelKeys"),
        ));
    }
    Ok(())
}

/// A topology spread constraint, and no two with the same (topologyKey, whenUnsatisfiable)
/// (`pairs` holds those seen).
fn spread(c: &Value, at: &str, pairs: &mut BTreeSet<(String, String)>) -> Result<(), FieldError> {
    let skew = &c["maxSkew"];
    if !skew
        .as_i64()
        .is_some_and(|s| s > 0 && s <= i64::from(i32::MAX))
    {
        return Err(err(
            format!("{at}.maxSkew"),
            format!("Invalid value: {skew}: must be greater than zero"),
        ));
    }
    topology_key(&c["topologyKey"], &format!("{at}.topologyKey"))?;
    let when = c["whenUnsatisfiable"].as_str().unwrap_or_default();
    match when {
        "" => {
            return Err(err(
                format!("{at}.whenUnsatisfiable"),
                "Required value: can not be empty",
            ));
        }
        "DoNotSchedule" | "ScheduleAnyway" => {}
        other => {
            return Err(err(
                format!("{at}.whenUnsatisfiable"),
                format!(
                    "Unsupported value: {other:?}: supported values: \"DoNotSchedule\", \"ScheduleAnyway\""
                ),
            ));
        }
    }
    let min_domains = &c["minDomains"];
    if !min_domains.is_null() {
        if !min_domains
            .as_i64()
            .is_some_and(|m| m > 0 && m <= i64::from(i32::MAX))
        {
            return Err(err(
                format!("{at}.minDomains"),
                format!("Invalid value: {min_domains}: must be greater than zero"),
            ));
        }
        if when != "DoNotSchedule" {
            return Err(err(
                format!("{at}.minDomains"),
                format!(
                    "Invalid value: {min_domains}: can only use minDomains if whenUnsatisfiable=DoNotSchedule, not {when}"
                ),
            ));
        }
    }
    for policy in ["nodeAffinityPolicy", "nodeTaintsPolicy"] {
        if let Some(value) = c[policy].as_str()
            && !matches!(value, "Honor" | "Ignore")
        {
            return Err(err(
                format!("{at}.{policy}"),
                format!("Unsupported value: {value:?}: supported values: \"Honor\", \"Ignore\""),
            ));
        }
    }
    label_selector(&c["labelSelector"], &format!("{at}.labelSelector"))?;
    let keys = label_keys(&c["matchLabelKeys"], &format!("{at}.matchLabelKeys"))?;
    if !keys.is_empty() {
        let selector = &c["labelSelector"];
        if selector.is_null() {
            return Err(err(
                format!("{at}.matchLabelKeys"),
                "Forbidden: must not be specified when labelSelector is not set",
            ));
        }
        let in_selector = |key: &str| {
            selector["matchLabels"].get(key).is_some()
                || items(&selector["matchExpressions"]).any(|(_, e)| e["key"] == key)
        };
        if let Some((i, key)) = keys.iter().enumerate().find(|(_, k)| in_selector(k)) {
            return Err(err(
                format!("{at}.matchLabelKeys[{i}]"),
                format!("Invalid value: {key:?}: exists in both matchLabelKeys and labelSelector"),
            ));
        }
    }
    let key = c["topologyKey"].as_str().unwrap_or_default();
    if !pairs.insert((key.to_owned(), when.to_owned())) {
        return Err(err(
            format!("{at}.{{topologyKey, whenUnsatisfiable}}"),
            format!("Duplicate value: \"{{{key}, {when}}}\""),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(spec: Value) -> String {
        let e = check(&spec, "spec").unwrap_err();
        format!("{}: {}", e.field, e.detail)
    }

    /// Each rule once, with the apiserver's field path and words; a spec using every field
    /// well passes.
    #[test]
    fn scheduling_fields_are_refused_naming_the_field() {
        let anti = |term: Value| json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}});
        let spread = |c: Value| json!({"topologySpreadConstraints": [c]});
        let ok_spread = json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                               "labelSelector": {"matchLabels": {"app": "web"}}});
        let with = |base: &Value, field: &str, v: Value| {
            let mut c = base.clone();
            c[field] = v;
            c
        };
        let a = "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]";
        let s = "spec.topologySpreadConstraints[0]";
        for (spec, expected) in [
            (anti(json!({"labelSelector": {"matchLabels": {"app": "web"}}})),
             format!("{a}.topologyKey: Required value: can not be empty")),
            (anti(json!({"topologyKey": "zone", "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}})),
             format!("{a}.labelSelector.matchExpressions[0].operator: Unsupported value: \"Gt\": supported values: \"DoesNotExist\", \"Exists\", \"In\", \"NotIn\"")),
            (anti(json!({"topologyKey": "zone", "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}})),
             format!("{a}.labelSelector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'")),
            (anti(json!({"topologyKey": "zone", "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}})),
             format!("{a}.labelSelector.matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")),
            (anti(json!({"topologyKey": "zone", "matchLabelKeys": ["pod-template-hash"]})),
             format!("{a}.matchLabelKeys: Forbidden: must not be specified when labelSelector is not set")),
            (anti(json!({"topologyKey": "zone", "labelSelector": {}, "matchLabelKeys": ["k"], "mismatchLabelKeys": ["k"]})),
             format!("{a}.mismatchLabelKeys[0]: Invalid value: \"k\": exists in both matchLabelKeys and mismatchLabelKeys")),
            (anti(json!({"topologyKey": "zone", "labelSelector": {}, "matchLabelKeys": ["bad key"]})),
             format!("{a}.matchLabelKeys[0]: Invalid value: \"bad key\": label key \"bad key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")),
            (json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "podAffinityTerm": {"topologyKey": "zone"}}]}}}),
             "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value: 0: must be in the range 1-100".to_owned()),
            (json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "cpu", "operator": "Gt", "values": ["many"]}]}]}}}}),
             "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'".to_owned()),
            (spread(with(&ok_spread, "maxSkew", json!(0))), format!("{s}.maxSkew: Invalid value: 0: must be greater than zero")),
            (spread(with(&ok_spread, "whenUnsatisfiable", json!("Sometimes"))),
             format!("{s}.whenUnsatisfiable: Unsupported value: \"Sometimes\": supported values: \"DoNotSchedule\", \"ScheduleAnyway\"")),
            (spread(with(&ok_spread, "minDomains", json!(0))), format!("{s}.minDomains: Invalid value: 0: must be greater than zero")),
            (spread(with(&with(&ok_spread, "minDomains", json!(2)), "whenUnsatisfiable", json!("ScheduleAnyway"))),
             format!("{s}.minDomains: Invalid value: 2: can only use minDomains if whenUnsatisfiable=DoNotSchedule, not ScheduleAnyway")),
            (spread(with(&ok_spread, "nodeTaintsPolicy", json!("Always"))),
             format!("{s}.nodeTaintsPolicy: Unsupported value: \"Always\": supported values: \"Honor\", \"Ignore\"")),
            (spread(with(&ok_spread, "matchLabelKeys", json!(["app"]))),
             format!("{s}.matchLabelKeys[0]: Invalid value: \"app\": exists in both matchLabelKeys and labelSelector")),
            (spread(with(&with(&ok_spread, "labelSelector", Value::Null), "matchLabelKeys", json!(["pod-template-hash"]))),
             format!("{s}.matchLabelKeys: Forbidden: must not be specified when labelSelector is not set")),
            (json!({"topologySpreadConstraints": [ok_spread.clone(), with(&ok_spread, "maxSkew", json!(2))]}),
             "spec.topologySpreadConstraints[1].{topologyKey, whenUnsatisfiable}: Duplicate value: \"{zone, DoNotSchedule}\"".to_owned()),
        ] {
            assert_eq!(refused(spec), expected);
        }
        let fine = json!({
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "cpu", "operator": "Gt", "values": ["4"]}],
                     "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}},
                     "matchLabelKeys": ["pod-template-hash"], "namespaces": ["default"], "namespaceSelector": {}}]}},
            "topologySpreadConstraints": [
                with(&with(&ok_spread, "minDomains", json!(3)), "matchLabelKeys", json!(["pod-template-hash"])),
                with(&ok_spread, "whenUnsatisfiable", json!("ScheduleAnyway"))]});
        assert_eq!(check(&fine, "spec").map_err(|e| e.to_string()), Ok(()));
    }
}
