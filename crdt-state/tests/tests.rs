//! Integration tests of the desired-state store: persistence across reopen, damaged files, and a
//! simulation of partitions healed by the anti-entropy protocol (no sockets: sessions are driven
//! by direct calls to the same `serve` / `SyncSession` code the agent runs over QUIC).

mod horizon;
mod persistence;
mod simulation;

use serde_json::{Value, json};
use shoal_state::sync::{self, Step, SyncSession};
use shoal_state::{Store, StoreConfig, ValidObject, validate};

pub const T0: u64 = 1_800_000_000_000;

pub fn open(dir: &std::path::Path, name: &str, node: u64) -> Store {
    Store::open(StoreConfig::new(dir.join(format!("{name}.redb")), node)).unwrap()
}

pub fn config_map(name: &str, data: &[(&str, &str)]) -> ValidObject {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    validate(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}),
        "default",
    )
    .unwrap()
}

/// Runs one anti-entropy session: `a` pulls from (and pushes to) `b`.
pub fn anti_entropy(a: &mut Store, b: &mut Store, now_ms: u64) {
    let (mut session, mut request) = SyncSession::start();
    loop {
        let (response, _) = sync::serve(b, request, now_ms);
        match session.on_response(a, response, now_ms).unwrap() {
            Step::Send(next) => request = next,
            Step::Done(_) => return,
        }
    }
}

/// Mutable references to two distinct stores of a slice.
pub fn pair(stores: &mut [Store], i: usize, j: usize) -> (&mut Store, &mut Store) {
    assert_ne!(i, j);
    if i < j {
        let (left, right) = stores.split_at_mut(j);
        (&mut left[i], &mut right[0])
    } else {
        let (left, right) = stores.split_at_mut(i);
        (&mut right[0], &mut left[j])
    }
}
