//! Faults built in on purpose, for the chaos tool's self-test only: compiled into debug builds
//! (the builds tests run) and active only in an agent started with [`ENV`] set to
//! [`DROP_ACKNOWLEDGED_WRITES`]. A release build has none of it.
//!
//! The self-test proves that checker 1 ("every acknowledged write survives") can fail against
//! real agents: such an agent answers a write of an object annotated [`DROP_ANNOTATION`] as
//! written (201, with a uid) and stores it nowhere — not here, not on any peer. Any other
//! agent treats the annotation as any other.

/// The annotation whose writes a fault-injecting agent acknowledges and drops.
pub const DROP_ANNOTATION: &str = "fault-injection.shoal.io/drop-acknowledged-write";

/// The environment variable that turns fault injection on (debug builds only).
pub const ENV: &str = "SHOAL_FAULT_INJECTION";

/// [`ENV`]'s value for: acknowledge the writes annotated [`DROP_ANNOTATION`] and drop them.
pub const DROP_ACKNOWLEDGED_WRITES: &str = "drop-acknowledged-writes";

/// Whether this agent drops the writes annotated [`DROP_ANNOTATION`] (read once).
#[cfg(debug_assertions)]
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(ENV).is_ok_and(|v| v == DROP_ACKNOWLEDGED_WRITES))
}

/// The answer to give instead of writing `object`, if this agent drops it.
#[cfg(debug_assertions)]
pub fn dropped(object: &shoal_state::ValidObject) -> Option<serde_json::Value> {
    if !enabled() {
        return None;
    }
    object.body["metadata"]["annotations"].get(DROP_ANNOTATION)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut answer = object.body.clone();
    answer["metadata"]["uid"] = serde_json::json!(format!("dropped-{nanos:x}"));
    answer["metadata"]["resourceVersion"] = serde_json::json!("1");
    tracing::warn!(
        object = %object.key,
        "fault injection: acknowledging a write and storing it nowhere"
    );
    Some(answer)
}
