//! Image references as users write them, normalised the way Docker and containerd do.

/// Why an image reference or digest is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("empty image reference")]
    Empty,
    #[error("image reference {0:?} contains whitespace")]
    Whitespace(String),
    #[error("image reference {0:?} has an empty path component")]
    EmptyComponent(String),
    #[error("image reference {0:?}: repository names must be lowercase")]
    Uppercase(String),
    #[error("{0:?} is not a sha256 digest (sha256:<64 lowercase hex>)")]
    Digest(String),
}

/// The normalised form of an image reference: `busybox` → `docker.io/library/busybox:latest`,
/// `shoal.local/httpd:1` unchanged; a `name@sha256:…` reference keeps its digest.
pub fn normalize(reference: &str) -> Result<String, ReferenceError> {
    let reference = reference.trim();
    if reference.is_empty() {
        return Err(ReferenceError::Empty);
    }
    if reference
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ReferenceError::Whitespace(reference.to_owned()));
    }
    let (name, digest) = match reference.split_once('@') {
        Some((name, digest)) => {
            parse_digest(digest)?;
            (name, Some(digest))
        }
        None => (reference, None),
    };
    let (first, rest) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
            (first.to_owned(), rest.to_owned())
        }
        Some(_) => ("docker.io".to_owned(), name.to_owned()),
        None => ("docker.io".to_owned(), format!("library/{name}")),
    };
    // A tag is a `:` after the last `/` (a registry port comes before the first).
    let (path, tag) = match rest.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') => (path.to_owned(), Some(tag.to_owned())),
        _ => (rest.clone(), None),
    };
    if path.is_empty() || path.split('/').any(str::is_empty) {
        return Err(ReferenceError::EmptyComponent(reference.to_owned()));
    }
    if path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(ReferenceError::Uppercase(reference.to_owned()));
    }
    Ok(match (tag, digest) {
        (_, Some(digest)) => format!("{first}/{path}@{digest}"),
        (Some(tag), None) => format!("{first}/{path}:{tag}"),
        (None, None) => format!("{first}/{path}:latest"),
    })
}

/// The hex part of a `sha256:<64 hex>` digest.
pub fn parse_digest(digest: &str) -> Result<&str, ReferenceError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ => Err(ReferenceError::Digest(digest.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_like_docker() {
        let cases = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("me/app", "docker.io/me/app:latest"),
            ("shoal.local/httpd:1", "shoal.local/httpd:1"),
            ("localhost/x", "localhost/x:latest"),
            ("reg:5000/team/app", "reg:5000/team/app:latest"),
            ("reg:5000/team/app:v2", "reg:5000/team/app:v2"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input).unwrap(), want, "{input}");
        }
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            normalize(&format!("busybox@{digest}")).unwrap(),
            format!("docker.io/library/busybox@{digest}")
        );
    }

    #[test]
    fn rejects_bad_references() {
        for bad in [
            "",
            "a b",
            "UPPER/case",
            "x//y",
            "busybox@sha256:abc",
            "busybox@md5:00",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?} accepted");
        }
    }
}
