//! Faults built in on purpose, for the chaos tool's self-test only (`--features
//! fault-injection`; never in the product build, and a release build with it does not compile).
//!
//! The self-test proves that checker 1 ("every acknowledged write survives") can fail against
//! real agents: a fault-injection build answers a write of an object annotated
//! [`DROP_ANNOTATION`] as written (201, with a uid) and stores it nowhere — not here, not on any
//! peer. The product build treats the annotation as any other.

#[cfg(all(feature = "fault-injection", not(debug_assertions)))]
compile_error!("the fault-injection feature is for test builds only");

/// The annotation whose writes a fault-injection build acknowledges and drops.
pub const DROP_ANNOTATION: &str = "fault-injection.shoal.io/drop-acknowledged-write";

/// The answer to give instead of writing `object`, if this build drops it.
#[cfg(feature = "fault-injection")]
pub fn dropped(object: &shoal_state::ValidObject) -> Option<serde_json::Value> {
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
