//! Kubernetes label syntax: `[prefix/]name=value`, validated like the apiserver does, with
//! errors that name the offending label.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("label {label:?}: expected key=value")]
    NotKeyValue { label: String },
    #[error("label key {key:?}: {reason}")]
    BadKey { key: String, reason: String },
    #[error("label {key}={value:?}: value {reason}")]
    BadValue {
        key: String,
        value: String,
        reason: String,
    },
    #[error("label key {key:?} is given twice")]
    Duplicate { key: String },
}

/// Why a name, key, path or value breaks its syntax rule; the caller names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SyntaxError {
    #[error("must be no more than {max} characters (is {len})")]
    TooLong { max: usize, len: usize },
    /// The rule broken, as the apiserver words it.
    #[error("{0}")]
    Rule(&'static str),
}

/// `name` part of a key, and every value: at most 63 characters, alphanumerics with `-`, `_`,
/// `.` inside.
fn check_name(s: &str) -> Result<(), SyntaxError> {
    if s.len() > 63 {
        return Err(SyntaxError::TooLong {
            max: 63,
            len: s.len(),
        });
    }
    let ok_inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let bytes: Vec<char> = s.chars().collect();
    if !bytes.iter().all(|c| ok_inner(*c))
        || !bytes.first().is_none_or(|c| c.is_ascii_alphanumeric())
        || !bytes.last().is_none_or(|c| c.is_ascii_alphanumeric())
    {
        return Err(SyntaxError::Rule(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        ));
    }
    Ok(())
}

/// A name that is one URL path segment (the apiserver's `ValidatePathSegmentName`, which RBAC
/// objects' names follow: `system:discovery`): 1 to 253 bytes, not `.` or `..`, no `/`, `%` or
/// control character.
pub fn check_path_segment_name(s: &str) -> Result<(), SyntaxError> {
    if s.is_empty() || s.len() > 253 {
        return Err(SyntaxError::Rule("must be 1 to 253 characters"));
    }
    if s == "." || s == ".." {
        return Err(SyntaxError::Rule("may not be '.' or '..'"));
    }
    if s.chars().any(|c| c == '/' || c == '%' || c.is_control()) {
        return Err(SyntaxError::Rule(
            "may not contain '/', '%' or a control character",
        ));
    }
    Ok(())
}

/// The rule a stored object's name follows: a path segment for the RBAC kinds, a DNS-1123
/// subdomain for every other.
pub fn check_object_name(group: &str, name: &str) -> Result<(), SyntaxError> {
    if group == "rbac.authorization.k8s.io" {
        check_path_segment_name(name)
    } else {
        check_dns_subdomain(name)
    }
}

/// A DNS-1123 subdomain: lowercase alphanumerics, `-` and `.`, at most 253 characters.
pub fn check_dns_subdomain(s: &str) -> Result<(), SyntaxError> {
    if s.is_empty() || s.len() > 253 {
        return Err(SyntaxError::Rule("must be 1 to 253 characters"));
    }
    for part in s.split('.') {
        let ok = !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !part.starts_with('-')
            && !part.ends_with('-');
        if !ok {
            return Err(SyntaxError::Rule(
                "must be lowercase alphanumerics, '-' or '.', each part starting and ending with an alphanumeric (RFC 1123)",
            ));
        }
    }
    Ok(())
}

/// A DNS-1123 label (container, volume and port names; namespaces): lowercase alphanumerics
/// and `-`, starting and ending with an alphanumeric, at most 63 characters. Such a name
/// contains no `/` and is never `.` or `..`, so it is safe as one path component.
pub fn check_dns_label(s: &str) -> Result<(), SyntaxError> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(SyntaxError::Rule(
            "must be at most 63 lowercase alphanumerics or '-', starting and ending with an alphanumeric (RFC 1123 label)",
        ))
    }
}

/// A relative path that stays beneath the directory it is joined to, as the apiserver checks
/// `subPath` and `items[].path` (`validateLocalDescendingPath`): not absolute, no `..`
/// element. With `no_dot_dot_prefix` (item paths) it may not start with `..` either.
pub fn check_descending_path(s: &str, no_dot_dot_prefix: bool) -> Result<(), SyntaxError> {
    if s.starts_with('/') {
        return Err(SyntaxError::Rule("must be a relative path"));
    }
    if s.split('/').any(|part| part == "..") {
        return Err(SyntaxError::Rule("must not contain '..'"));
    }
    if no_dot_dot_prefix && s.starts_with("..") {
        return Err(SyntaxError::Rule("must not start with '..'"));
    }
    if s.contains('\0') {
        return Err(SyntaxError::Rule("must not contain NUL"));
    }
    Ok(())
}

/// A ConfigMap or Secret key (`IsConfigMapKey`): alphanumerics, `-`, `_` and `.`, at most 253
/// characters, not `.` or `..` and not starting with `..`.
pub fn check_config_key(s: &str) -> Result<(), SyntaxError> {
    if s.is_empty() || s.len() > 253 {
        return Err(SyntaxError::Rule("must be 1 to 253 characters"));
    }
    if !s
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Err(SyntaxError::Rule(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
        ));
    }
    if s == "." || s.starts_with("..") {
        return Err(SyntaxError::Rule(
            "must not be '.' or '..' or start with '..'",
        ));
    }
    Ok(())
}

pub fn validate_key(key: &str) -> Result<(), LabelError> {
    let bad = |reason: String| LabelError::BadKey {
        key: key.to_owned(),
        reason,
    };
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            check_dns_subdomain(prefix).map_err(|r| bad(format!("prefix {r}")))?;
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err(bad("name part must not be empty".into()));
    }
    check_name(name).map_err(|r| bad(format!("name part {r}")))
}

pub fn validate_value(key: &str, value: &str) -> Result<(), LabelError> {
    check_name(value).map_err(|reason| LabelError::BadValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason: reason.to_string(),
    })
}

pub fn validate(labels: &BTreeMap<String, String>) -> Result<(), LabelError> {
    for (k, v) in labels {
        validate_key(k)?;
        validate_value(k, v)?;
    }
    Ok(())
}

/// Parses `k=v,k2=v2` (the `--labels` flag). An empty string is no labels.
pub fn parse_list(list: &str) -> Result<BTreeMap<String, String>, LabelError> {
    let mut labels = BTreeMap::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| LabelError::NotKeyValue {
                label: item.to_owned(),
            })?;
        validate_key(k)?;
        validate_value(k, v)?;
        if labels.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(LabelError::Duplicate { key: k.to_owned() });
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_valid_lists() {
        let l = parse_list("zone=a, topology.kubernetes.io/region=eu-west-1,empty=").unwrap();
        assert_eq!(l["zone"], "a");
        assert_eq!(l["topology.kubernetes.io/region"], "eu-west-1");
        assert_eq!(l["empty"], "");
        assert!(parse_list("").unwrap().is_empty());
    }

    #[test]
    fn rejects_bad_labels_naming_them() {
        let cases = [
            ("zone", "expected key=value"),
            ("-zone=a", "label key \"-zone\""),
            ("Bad_Prefix.com/x=1", "prefix"),
            ("zone=a b", "label zone=\"a b\""),
            ("zone=a,zone=b", "given twice"),
            ("/x=1", "prefix"),
            ("p/=1", "name part must not be empty"),
        ];
        for (input, expected) in cases {
            let err = parse_list(input).unwrap_err().to_string();
            assert!(err.contains(expected), "{input}: {err}");
        }
        let long = format!("k={}", "v".repeat(64));
        assert!(parse_list(&long).unwrap_err().to_string().contains("63"));
    }

    #[test]
    fn dns_subdomains() {
        assert!(check_dns_subdomain("node-1.example").is_ok());
        assert!(check_path_segment_name("system:discovery").is_ok());
        for bad in ["", ".", "..", "a/b", "a%2F", "a\nb"] {
            assert!(check_path_segment_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_object_name("rbac.authorization.k8s.io", "system:basic-user").is_ok());
        assert!(check_object_name("apps", "system:basic-user").is_err());
        assert!(check_dns_subdomain("Node").is_err());
        assert!(check_dns_subdomain("a..b").is_err());
        assert!(check_dns_subdomain("").is_err());
    }

    #[test]
    fn names_and_paths_that_reach_the_filesystem() {
        for ok in ["a", "web-1", "x9"] {
            assert!(check_dns_label(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/",
            "..",
            ".",
            "a.b",
            "A",
            "-a",
            "a-",
            "a/b",
            &"a".repeat(64),
        ] {
            assert!(check_dns_label(bad).is_err(), "{bad:?}");
        }
        for ok in ["a", "a/b", "a..b", "./a", "a/"] {
            assert!(check_descending_path(ok, false).is_ok(), "{ok}");
        }
        for bad in ["/etc", "..", "../x", "a/../../b", "a/.."] {
            assert!(check_descending_path(bad, false).is_err(), "{bad:?}");
        }
        assert!(check_descending_path("..data", true).is_err());
        assert!(check_descending_path("..data", false).is_ok());
        for ok in ["config.yaml", "a_b-c", ".hidden"] {
            assert!(check_config_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "..x", "a/b", "a b", &"k".repeat(254)] {
            assert!(check_config_key(bad).is_err(), "{bad:?}");
        }
    }
}
