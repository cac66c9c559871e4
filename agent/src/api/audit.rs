//! The audit log (issue #40, `--audit-log-path`): one JSON line per API request, in the shape
//! of upstream's log backend (`audit.k8s.io/v1` `Event`s at level `Metadata`, stage
//! `ResponseComplete`): who asked (after impersonation), what (verb, URI, object reference),
//! from where, and the answer's code. Bodies and credentials are never written.
//!
//! Written by one thread of its own through a bounded queue, so a slow disk never holds a
//! request: an event that finds the queue full is dropped and counted
//! ([`Log::dropped`]), and the first drop is logged.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use serde_json::{Value, json};
use shoal_model::rbac::{Attributes, User};

/// Events waiting for the writer at most.
const QUEUE: usize = 8_192;

/// The audit log of this agent's API.
pub struct Log {
    queue: mpsc::SyncSender<Value>,
    dropped: AtomicU64,
    path: PathBuf,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").field("path", &self.path).finish()
    }
}

/// One request, as the audit log records it.
pub struct Request<'a> {
    pub method: &'a str,
    pub uri: &'a str,
    pub user: Option<&'a User>,
    /// Whom the request acted as, when it impersonated someone.
    pub impersonated: Option<&'a User>,
    pub source: Option<std::net::IpAddr>,
    pub user_agent: &'a str,
    pub attributes: &'a Attributes,
    pub code: u16,
    pub received: std::time::SystemTime,
    pub done: std::time::SystemTime,
}

fn micros(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// The `Event` upstream's log backend writes for `r` (pure; `id` is the audit id).
pub fn event(r: &Request<'_>, id: &str) -> Value {
    let user = |u: &User| json!({"username": u.name, "groups": u.groups});
    let a = r.attributes;
    let mut event = json!({
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": id,
        "stage": "ResponseComplete",
        "requestURI": r.uri,
        "verb": a.verb,
        "user": r.user.map_or_else(|| json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]}), user),
        "sourceIPs": r.source.map(|ip| vec![ip.to_string()]).unwrap_or_default(),
        "userAgent": r.user_agent,
        "responseStatus": {"metadata": {}, "code": r.code},
        "requestReceivedTimestamp": micros(r.received),
        "stageTimestamp": micros(r.done),
    });
    if let Some(as_user) = r.impersonated {
        event["impersonatedUser"] = user(as_user);
    }
    if a.resource_request {
        let mut object = json!({"resource": a.resource, "apiGroup": a.api_group});
        for (key, value) in [
            ("namespace", &a.namespace),
            ("name", &a.name),
            ("subresource", &a.subresource),
        ] {
            if !value.is_empty() {
                object[key] = json!(value);
            }
        }
        event["objectRef"] = object;
    }
    let _ = r.method;
    event
}

impl Log {
    /// Opens (appending, mode 0600) the log at `path` and starts its writer.
    pub fn open(path: &Path) -> std::io::Result<std::sync::Arc<Self>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        let (queue, events) = mpsc::sync_channel::<Value>(QUEUE);
        let log = std::sync::Arc::new(Self {
            queue,
            dropped: AtomicU64::new(0),
            path: path.to_owned(),
        });
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(file);
                let write = |out: &mut std::io::BufWriter<std::fs::File>, event: Value| {
                    let mut line = event.to_string();
                    line.push('\n');
                    out.write_all(line.as_bytes())
                };
                while let Ok(event) = events.recv() {
                    // What queued meanwhile goes in the same write; flushed once the queue is
                    // empty, so a line is on disk soon after its request.
                    let mut written = write(&mut out, event);
                    while written.is_ok() {
                        let Ok(next) = events.try_recv() else { break };
                        written = write(&mut out, next);
                    }
                    if let Err(error) = written.and_then(|()| out.flush()) {
                        tracing::warn!(path = %shown, %error, "audit log not written");
                    }
                }
                let _ = out.flush();
            })?;
        Ok(log)
    }

    /// Queues the event of request `r`.
    pub fn record(&self, r: &Request<'_>) {
        let mut id = [0u8; 16];
        rand::fill(&mut id);
        let event = event(r, &shoal_state::object::uuid_string(&id));
        if self.queue.try_send(event).is_err() && self.dropped.fetch_add(1, Ordering::Relaxed) == 0
        {
            tracing::warn!(path = %self.path.display(), "audit log queue full: events dropped");
        }
    }

    /// How many events found the queue full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_has_upstreams_shape_and_no_credentials() {
        let jane = User::new("jane", &["dev", "system:authenticated"]);
        let a = shoal_model::rbac::attributes("GET", "/api/v1/namespaces/team/pods/web", false);
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let r = Request {
            method: "GET",
            uri: "/api/v1/namespaces/team/pods/web?pretty=true",
            user: Some(&jane),
            impersonated: None,
            source: Some("10.0.0.7".parse().unwrap()),
            user_agent: "kubectl/v1.31",
            attributes: &a,
            code: 403,
            received: t,
            done: t,
        };
        let e = event(&r, "id-1");
        assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(e["verb"], "get");
        assert_eq!(e["user"]["username"], "jane");
        assert_eq!(
            e["objectRef"],
            json!({"resource": "pods", "apiGroup": "", "namespace": "team", "name": "web"})
        );
        assert_eq!(e["responseStatus"]["code"], 403);
        assert_eq!(e["sourceIPs"], json!(["10.0.0.7"]));
        assert_eq!(e["requestReceivedTimestamp"], "2027-01-15T08:00:00.000000Z");
        let anonymous = event(&Request { user: None, ..r }, "id-2");
        assert_eq!(anonymous["user"]["username"], "system:anonymous");
    }

    #[test]
    fn events_reach_the_file_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = Log::open(&path).unwrap();
        let a = shoal_model::rbac::attributes("GET", "/version", false);
        let now = std::time::SystemTime::now();
        for code in [200, 401] {
            log.record(&Request {
                method: "GET",
                uri: "/version",
                user: None,
                impersonated: None,
                source: None,
                user_agent: "",
                attributes: &a,
                code,
                received: now,
                done: now,
            });
        }
        let mut lines = Vec::new();
        for _ in 0..200 {
            lines = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect();
            if lines.len() == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(lines.len(), 2, "{lines:?}");
        let second: Value = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(second["responseStatus"]["code"], 401);
        assert!(second.get("objectRef").is_none());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(log.dropped(), 0);
    }
}
