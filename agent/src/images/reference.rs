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
    #[error("image reference {reference:?}: {what}")]
    Invalid {
        reference: String,
        what: &'static str,
    },
}

/// An image reference split as containerd's resolver reads it (`distribution/reference`'s
/// `ParseDockerRef`): the registry's domain, the repository path, and a tag or a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `docker.io` for Docker Hub (whatever alias was written), else the registry as written
    /// (`reg:5000`, `localhost`, `ghcr.io`).
    pub domain: String,
    /// `library/busybox`, `team/app`.
    pub path: String,
    /// The tag (`latest` when neither a tag nor a digest was given); `None` with a digest.
    pub tag: Option<String>,
    /// `sha256:<hex>`; a reference with both keeps only the digest, as containerd does.
    pub digest: Option<String>,
}

/// The domain of images that exist only in the cluster (imported with `shoal image import`,
/// shared between nodes): never looked up in a registry, as Podman treats `localhost/`.
pub const LOCAL_DOMAIN: &str = "shoal.local";

/// Docker Hub's names: what users and docker config files write, and where its registry API
/// is served.
pub const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_ALIASES: [&str; 2] = ["index.docker.io", "registry-1.docker.io"];
const DOCKER_HUB_API: &str = "registry-1.docker.io";

impl Reference {
    /// Parses and normalises `reference`: `busybox` → `docker.io/library/busybox:latest`,
    /// `docker.io/nginx` and `index.docker.io/nginx` → `docker.io/library/nginx:latest`,
    /// `shoal.local/httpd:1` unchanged. The first path component is a registry when it has a
    /// `.` or a `:`, is `localhost`, or has an uppercase letter; repository paths must be
    /// lowercase.
    pub fn parse(reference: &str) -> Result<Self, ReferenceError> {
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
                (name, Some(digest.to_owned()))
            }
            None => (reference, None),
        };
        let (domain, rest) = match name.split_once('/') {
            Some((first, rest))
                if first.contains(['.', ':'])
                    || first == "localhost"
                    || first.chars().any(|c| c.is_ascii_uppercase()) =>
            {
                (first, rest)
            }
            _ => (DOCKER_HUB, name),
        };
        let domain = if DOCKER_HUB_ALIASES.contains(&domain) {
            DOCKER_HUB
        } else {
            domain
        };
        // A tag is a `:` after the last `/` (a registry port comes before the first).
        let (path, tag) = match rest.rsplit_once(':') {
            Some((path, tag)) if !tag.contains('/') => (path, Some(tag)),
            _ => (rest, None),
        };
        if path.is_empty() || path.split('/').any(str::is_empty) || tag == Some("") {
            return Err(ReferenceError::EmptyComponent(reference.to_owned()));
        }
        if path.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(ReferenceError::Uppercase(reference.to_owned()));
        }
        // distribution/reference's grammar, bounded as it is.
        let invalid = |what| {
            Err(ReferenceError::Invalid {
                reference: reference.to_owned(),
                what,
            })
        };
        if name.len() > 255 {
            return invalid("the name is longer than 255 characters");
        }
        if !path
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        {
            return invalid("a repository path has only a-z, 0-9, '.', '_', '-' and '/'");
        }
        if !domain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b))
        {
            return invalid("a registry is a host name or address, with an optional :port");
        }
        if let Some(tag) = tag
            && (tag.len() > 128
                || tag.starts_with(['.', '-'])
                || !tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)))
        {
            return invalid("a tag is 1-128 of A-Z, a-z, 0-9, '_', '.', '-', not first '.' or '-'");
        }
        // Docker Hub's official images live under `library/`.
        let path = if domain == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_owned()
        };
        Ok(Reference {
            domain: domain.to_owned(),
            path,
            tag: match digest {
                Some(_) => None,
                None => Some(tag.unwrap_or("latest").to_owned()),
            },
            digest,
        })
    }

    /// The host (and port) serving the registry API: Docker Hub's is `registry-1.docker.io`.
    pub fn api_host(&self) -> &str {
        if self.domain == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.domain
        }
    }

    /// What the registry's manifest endpoint takes: the digest, else the tag.
    pub fn tag_or_digest(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => write!(f, "{}/{}@{digest}", self.domain, self.path),
            (None, tag) => write!(
                f,
                "{}/{}:{}",
                self.domain,
                self.path,
                tag.as_deref().unwrap_or("latest")
            ),
        }
    }
}

/// The normalised form of an image reference ([`Reference::parse`]): `busybox` →
/// `docker.io/library/busybox:latest`, `shoal.local/httpd:1` unchanged; a `name@sha256:…`
/// reference keeps its digest.
pub fn normalize(reference: &str) -> Result<String, ReferenceError> {
    Reference::parse(reference).map(|r| r.to_string())
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
            // As containerd: Docker Hub's aliases, `library/` under docker.io, an uppercase
            // first component is a registry.
            ("docker.io/nginx", "docker.io/library/nginx:latest"),
            ("index.docker.io/nginx:1", "docker.io/library/nginx:1"),
            ("registry-1.docker.io/me/app", "docker.io/me/app:latest"),
            ("docker.io/library/nginx", "docker.io/library/nginx:latest"),
            ("Reg/app", "Reg/app:latest"),
            ("localhost:5000/a/b/c:t", "localhost:5000/a/b/c:t"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input).unwrap(), want, "{input}");
        }
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            normalize(&format!("busybox@{digest}")).unwrap(),
            format!("docker.io/library/busybox@{digest}")
        );
        // Tag and digest: the digest alone.
        assert_eq!(
            normalize(&format!("reg:5000/a:v1@{digest}")).unwrap(),
            format!("reg:5000/a@{digest}")
        );
        // Where the API is, and what the manifest endpoint takes.
        let hub = Reference::parse("nginx").unwrap();
        assert_eq!(
            (hub.api_host(), hub.tag_or_digest()),
            ("registry-1.docker.io", "latest")
        );
        let own = Reference::parse(&format!("127.0.0.1:5000/x@{digest}")).unwrap();
        assert_eq!(
            (own.api_host(), own.tag_or_digest()),
            ("127.0.0.1:5000", digest.as_str())
        );
        assert_eq!(own.path, "x");
    }

    #[test]
    fn rejects_bad_references() {
        for bad in [
            "",
            "a b",
            "team/UPPER",
            "docker.io/Nginx",
            "busybox:",
            "busybox:-x",
            "busybox:a+b",
            "reg_x:5000/a",
            "a/b$c",
            "x//y",
            "busybox@sha256:abc",
            "busybox@md5:00",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?} accepted");
        }
    }
}
