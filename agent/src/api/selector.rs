//! Label selectors (`app=web,tier!=db,env in (a,b),!legacy`) and the field selectors the API
//! supports (`metadata.name`, `metadata.namespace`).

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn check_key(key: &str, whole: &str) -> Result<String, String> {
    shoal_state::labels::validate_key(key)
        .map(|()| key.to_owned())
        .map_err(|e| format!("unable to parse requirement {whole:?}: {e}"))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s)
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let set = |rest: &str| -> Result<Vec<String>, String> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| {
                        format!("unable to parse requirement {part:?}: expected (values)")
                    })?;
                Ok(inner
                    .split(',')
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
                    .collect())
            };
            let req = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(check_key(k.trim(), part)?, v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                let v = v.trim();
                shoal_state::labels::validate_value(k.trim(), v)
                    .map_err(|e| format!("unable to parse requirement {part:?}: {e}"))?;
                Requirement::Equals(check_key(k.trim(), part)?, v.to_owned())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Requirement::NotIn(check_key(k.trim(), part)?, set(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Requirement::In(check_key(k.trim(), part)?, set(rest)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::DoesNotExist(check_key(k.trim(), part)?)
            } else {
                Requirement::Exists(check_key(part, part)?)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, labels: &Value) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// A field selector over `metadata.name` / `metadata.namespace`.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid selector: {part:?}; expected field=value"));
            };
            if !matches!(field.trim(), "metadata.name" | "metadata.namespace") {
                return Err(format!("field label not supported: {}", field.trim()));
            }
            reqs.push((field.trim().to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = match field.as_str() {
                "metadata.name" => object["metadata"]["name"].as_str(),
                _ => object["metadata"]["namespace"].as_str(),
            }
            .unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selectors() {
        let labels = json!({"app": "web", "tier": "front"});
        let ok = |s: &str| LabelSelector::parse(s).unwrap().matches(&labels);
        assert!(ok(""));
        assert!(ok("app=web"));
        assert!(ok("app==web,tier!=db"));
        assert!(ok("tier in (front, back)"));
        assert!(!ok("tier notin (front)"));
        assert!(ok("app,!legacy"));
        assert!(!ok("legacy"));
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(LabelSelector::parse("x in a,b").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}});
        assert!(FieldSelector::parse("metadata.name=a").unwrap().matches(&o));
        assert!(
            !FieldSelector::parse("metadata.namespace!=ns")
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("spec.nodeName=x")
                .unwrap_err()
                .contains("not supported")
        );
    }
}
