//! Registry credentials and authentication challenges (issue #38): what a docker config file
//! or an `imagePullSecret` holds, which of its entries serve an image (as the kubelet's
//! credential keyring matches them), and the `WWW-Authenticate` challenges of the
//! distribution API (`Basic realm=…`, `Bearer realm=…,service=…,scope=…`).
//!
//! Everything here reads untrusted text (a Secret's bytes, a registry's header): bounded, and
//! an error names the entry concerned.

use base64::Engine as _;

use super::reference::{DOCKER_HUB, Reference};

/// The most entries read from one docker config (a Secret holds at most 1 MiB anyway).
const MAX_ENTRIES: usize = 256;
/// The longest user name or password accepted.
const MAX_SECRET: usize = 16 << 10;

/// A user name and password (or token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password: credentials end up in error chains and logs.
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The value of an `Authorization: Basic …` header.
    pub fn basic(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// One entry of a docker config: the key as clients write it (`https://index.docker.io/v1/`,
/// `registry:5000`, `*.example.com/team`) and its credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub credentials: Credentials,
}

/// Why a docker config was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("not a docker config: {0}")]
    Json(String),
    #[error("more than {MAX_ENTRIES} registries")]
    TooMany,
    #[error("entry {key:?}: {what}")]
    Entry { key: String, what: &'static str },
}

/// Which format a docker config is in: `.dockerconfigjson` (`{"auths": {key: …}}`, the Secret
/// type `kubernetes.io/dockerconfigjson`, `~/.docker/config.json`) or the older `.dockercfg`
/// (`{key: …}`, `kubernetes.io/dockercfg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigFormat {
    Json,
    Cfg,
}

/// The entries of a docker config. An entry has `auth` (base64 of `user:password`) or
/// `username` and `password`; entries with neither (a credential helper's) are skipped.
pub fn parse_docker_config(bytes: &[u8], format: ConfigFormat) -> Result<Vec<Entry>, ConfigError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
    let auths = match format {
        ConfigFormat::Json => value.get("auths").unwrap_or(&serde_json::Value::Null),
        ConfigFormat::Cfg => &value,
    };
    let Some(auths) = auths.as_object() else {
        return match format {
            ConfigFormat::Json if value.is_object() && value.get("auths").is_none() => Ok(vec![]),
            _ => Err(ConfigError::Json("the registries are not an object".into())),
        };
    };
    if auths.len() > MAX_ENTRIES {
        return Err(ConfigError::TooMany);
    }
    let mut entries = Vec::new();
    for (key, entry) in auths {
        let bad = |what| ConfigError::Entry {
            key: key.chars().take(256).collect(),
            what,
        };
        let text = |field: &str| entry.get(field).and_then(|v| v.as_str()).unwrap_or("");
        let (username, password) = if !text("auth").is_empty() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(text("auth").trim())
                .map_err(|_| bad("auth is not base64"))?;
            let pair = String::from_utf8(decoded).map_err(|_| bad("auth is not UTF-8"))?;
            let (user, password) = pair
                .split_once(':')
                .ok_or_else(|| bad("auth is not user:password"))?;
            (user.to_owned(), password.to_owned())
        } else if !text("username").is_empty() {
            (text("username").to_owned(), text("password").to_owned())
        } else {
            continue;
        };
        if username.len() > MAX_SECRET || password.len() > MAX_SECRET || key.len() > 1024 {
            return Err(bad("longer than allowed"));
        }
        if username
            .chars()
            .chain(password.chars())
            .any(char::is_control)
        {
            return Err(bad("a control character in the credentials"));
        }
        entries.push(Entry {
            key: key.clone(),
            credentials: Credentials { username, password },
        });
    }
    Ok(entries)
}

/// Whether the docker config key `key` serves `image`, as the kubelet's keyring matches:
/// scheme ignored; Docker Hub's keys (`index.docker.io`, `https://index.docker.io/v1/`,
/// `docker.io`, `registry-1.docker.io`) serve `docker.io` images; otherwise the host matches
/// label by label (`*` for one label), the port exactly, and a path in the key must be a
/// prefix of the repository path, component by component.
pub fn key_matches(key: &str, image: &Reference) -> bool {
    let key = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let (host, path) = key.split_once('/').unwrap_or((key, ""));
    let path = path.trim_matches('/');
    let hub = matches!(
        host,
        "index.docker.io" | "docker.io" | "registry-1.docker.io"
    );
    if hub {
        let path = path
            .strip_prefix("v1")
            .or_else(|| path.strip_prefix("v2"))
            .unwrap_or(path)
            .trim_matches('/');
        return image.domain == DOCKER_HUB && path_prefix(path, &image.path);
    }
    let (name, port) = split_port(host);
    let (image_name, image_port) = split_port(&image.domain);
    if port != image_port {
        return false;
    }
    let (labels, image_labels): (Vec<&str>, Vec<&str>) =
        (name.split('.').collect(), image_name.split('.').collect());
    labels.len() == image_labels.len()
        && labels
            .iter()
            .zip(&image_labels)
            .all(|(k, i)| *k == "*" || k.eq_ignore_ascii_case(i))
        && path_prefix(path, &image.path)
}

fn split_port(host: &str) -> (&str, Option<&str>) {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            (name, Some(port))
        }
        _ => (host, None),
    }
}

/// Whether `prefix` (maybe empty) is a leading run of `path`'s components.
fn path_prefix(prefix: &str, path: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The credentials among `entries` that serve `image`, the most specific key first (longest
/// path, then exact host before a wildcard), as the kubelet's keyring orders them.
pub fn lookup<'a>(entries: &'a [Entry], image: &Reference) -> Vec<&'a Credentials> {
    let mut found: Vec<&Entry> = entries
        .iter()
        .filter(|e| key_matches(&e.key, image))
        .collect();
    found.sort_by_key(|e| {
        let key = e
            .key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let path = key.split_once('/').map_or("", |(_, p)| p.trim_matches('/'));
        (std::cmp::Reverse(path.len()), key.contains('*'))
    });
    let mut out: Vec<&Credentials> = Vec::new();
    for e in found {
        if !out.contains(&&e.credentials) {
            out.push(&e.credentials);
        }
    }
    out
}

/// A registry's `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` value (RFC 7235: a scheme, then `name=value` or
/// `name="quoted, value"` parameters). `None` for a scheme other than Basic or Bearer, or a
/// Bearer challenge without a realm.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = std::collections::BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let name: String = chars
            .by_ref()
            .take_while(|c| *c != '=')
            .collect::<String>()
            .trim()
            .to_ascii_lowercase();
        if name.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ',') {
                value.push(c);
            }
            value = value.trim().to_owned();
        }
        params.insert(name, value);
        if params.len() > 16 {
            break;
        }
    }
    let realm = params.remove("realm").filter(|r| !r.is_empty())?;
    Some(Challenge::Bearer {
        realm,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}

/// The URL a bearer token is asked at: the realm with `service` and `scope` in its query.
pub fn token_url(realm: &str, service: Option<&str>, scope: Option<&str>) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(service) = service {
        query.append_pair("service", service);
    }
    if let Some(scope) = scope {
        query.append_pair("scope", scope);
    }
    let query = query.finish();
    match (query.is_empty(), realm.contains('?')) {
        (true, _) => realm.to_owned(),
        (false, true) => format!("{realm}&{query}"),
        (false, false) => format!("{realm}?{query}"),
    }
}

/// The token in a token server's answer (`token`, or OAuth's `access_token`).
pub fn token_from(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let token = value
        .get("token")
        .or_else(|| value.get("access_token"))?
        .as_str()?;
    (!token.is_empty() && token.len() <= 64 << 10 && token.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(name: &str) -> Reference {
        Reference::parse(name).unwrap()
    }

    #[test]
    fn docker_config_keys_match_as_the_kubelet_matches_them() {
        for (key, name, matches) in [
            ("https://index.docker.io/v1/", "nginx", true),
            ("index.docker.io", "team/app", true),
            ("docker.io", "docker.io/team/app:1", true),
            ("https://index.docker.io/v1/", "ghcr.io/team/app", false),
            ("reg:5000", "reg:5000/a/b", true),
            ("reg:5000", "reg/a/b", false),
            ("reg", "reg:5000/a/b", false),
            (
                "http://reg:5000",
                "reg:5000/a/b@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                true,
            ),
            ("*.example.com", "eu.example.com/app", true),
            ("*.example.com", "example.com/app", false),
            ("*.example.com", "a.b.example.com/app", false),
            ("Example.COM", "example.com/app", true),
            ("example.com/team", "example.com/team/app", true),
            ("example.com/team", "example.com/teams/app", false),
            ("example.com/team/", "example.com/team", true),
            ("https://index.docker.io/v1/team", "team/app", true),
            ("https://index.docker.io/v1/team", "other/app", false),
        ] {
            assert_eq!(key_matches(key, &image(name)), matches, "{key} for {name}");
        }
    }

    #[test]
    fn the_most_specific_key_comes_first() {
        let entry = |key: &str, user: &str| Entry {
            key: key.into(),
            credentials: Credentials {
                username: user.into(),
                password: "p".into(),
            },
        };
        let entries = [
            entry("*.example.com", "wild"),
            entry("eu.example.com", "host"),
            entry("eu.example.com/team", "team"),
            entry("other.com", "other"),
        ];
        let users: Vec<&str> = lookup(&entries, &image("eu.example.com/team/app"))
            .iter()
            .map(|c| c.username.as_str())
            .collect();
        assert_eq!(users, ["team", "host", "wild"]);
        assert!(lookup(&entries, &image("nginx")).is_empty());
    }

    #[test]
    fn docker_configs_in_both_formats() {
        let auth = base64::engine::general_purpose::STANDARD.encode("u:p:with:colons");
        let json = format!(
            r#"{{"auths": {{"reg:5000": {{"auth": "{auth}"}},
                "ghcr.io": {{"username": "u2", "password": "p2"}},
                "helper.io": {{}}}}}}"#
        );
        let entries = parse_docker_config(json.as_bytes(), ConfigFormat::Json).unwrap();
        assert_eq!(entries.len(), 2);
        let reg = entries.iter().find(|e| e.key == "reg:5000").unwrap();
        assert_eq!(reg.credentials.username, "u");
        assert_eq!(reg.credentials.password, "p:with:colons");
        let cfg = format!(r#"{{"reg:5000": {{"auth": "{auth}", "email": "x@y"}}}}"#);
        assert_eq!(
            parse_docker_config(cfg.as_bytes(), ConfigFormat::Cfg).unwrap()[0].credentials,
            reg.credentials
        );
        // A config.json with only credential helpers has no entries.
        assert!(
            parse_docker_config(br#"{"credsStore": "pass"}"#, ConfigFormat::Json)
                .unwrap()
                .is_empty()
        );
        for (bad, format, says) in [
            (&b"{"[..], ConfigFormat::Json, "not a docker config"),
            (br#"{"auths": []}"#, ConfigFormat::Json, "not an object"),
            (
                br#"{"auths": {"r": {"auth": "%%%"}}}"#,
                ConfigFormat::Json,
                "entry \"r\": auth is not base64",
            ),
            (
                br#"{"r": {"auth": "bm9jb2xvbg=="}}"#,
                ConfigFormat::Cfg,
                "auth is not user:password",
            ),
            (
                br#"{"r": {"username": "a\nb", "password": "p"}}"#,
                ConfigFormat::Cfg,
                "control character",
            ),
        ] {
            let error = parse_docker_config(bad, format).unwrap_err().to_string();
            assert!(error.contains(says), "{error}");
        }
        assert!(!format!("{:?}", reg.credentials).contains("colons"));
    }

    #[test]
    fn challenges_parse_as_registries_write_them() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/nginx:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/nginx:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge("bearer realm=http://127.0.0.1:1/t, service = reg"),
            Some(Challenge::Bearer {
                realm: "http://127.0.0.1:1/t".into(),
                service: Some("reg".into()),
                scope: None,
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None);
        // An unterminated quote ends the value (the header is bounded anyway).
        assert_eq!(
            parse_challenge("Bearer realm=\"unterminated"),
            Some(Challenge::Bearer {
                realm: "unterminated".into(),
                service: None,
                scope: None,
            })
        );
        assert_eq!(
            token_url("https://a/token", Some("reg"), Some("repository:x/y:pull")),
            "https://a/token?service=reg&scope=repository%3Ax%2Fy%3Apull"
        );
        assert_eq!(
            token_url("https://a/t?x=1", Some("s"), None),
            "https://a/t?x=1&service=s"
        );
        assert_eq!(token_from(br#"{"token": "abc"}"#).as_deref(), Some("abc"));
        assert_eq!(
            token_from(br#"{"access_token": "d.e.f"}"#).as_deref(),
            Some("d.e.f")
        );
        assert_eq!(token_from(br#"{"token": "a b"}"#), None);
        assert_eq!(token_from(b"nope"), None);
    }
}
