//! Quarantine of objects whose reconcile failed (DESIGN.md §11, invariant 8). Every agent
//! runs every controller, and an object's owner is whichever live node hashes highest: an
//! object whose reconcile kills its owner would be picked up by the next owner, and the next,
//! until no agent is left. So each object's reconcile runs guarded: a panic is caught, the
//! object is skipped with a Warning event (`ReconcileFailed`, naming the panic) and retried
//! with a doubling back-off, and the pass goes on with every other object. Pure: time is an
//! input, the state is a map the shell keeps.
//!
//! A panic is a bug, never an answer to input: the bounds at the API (and again where stored
//! objects are read) are the first line. This is the second, so that a bug found by a user's
//! manifest costs that manifest, not the cluster.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use serde_json::Value;

use super::workload::Action;

/// The first retry after a failure, doubling per failure in a row.
pub const FIRST_RETRY_MS: u64 = 1_000;
/// The longest wait between two tries.
pub const MAX_RETRY_MS: u64 = 5 * 60 * 1_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    failures: u32,
    retry_at_ms: u64,
}

/// The objects (by uid) whose last reconcile failed, and when each is tried again.
#[derive(Debug, Default)]
pub struct Quarantine {
    entries: HashMap<String, Entry>,
}

/// The text of a panic's payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

impl Quarantine {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `uid` is quarantined now.
    pub fn holds(&self, uid: &str) -> bool {
        self.entries.contains_key(uid)
    }

    /// `reconcile`'s actions for `object`, run unless the object is quarantined until after
    /// `now_ms` (then only the requeue at its retry). A panic in it quarantines the object:
    /// [`Action::Failed`] with the panic's message, and a requeue at the retry.
    pub fn guard(
        &mut self,
        object: &Value,
        now_ms: u64,
        reconcile: impl FnOnce() -> Vec<Action>,
    ) -> Vec<Action> {
        let uid = object["metadata"]["uid"].as_str().unwrap_or_default();
        if let Some(entry) = self.entries.get(uid)
            && now_ms < entry.retry_at_ms
        {
            return vec![Action::Requeue {
                at_ms: entry.retry_at_ms,
            }];
        }
        match catch_unwind(AssertUnwindSafe(reconcile)) {
            Ok(actions) => {
                self.entries.remove(uid);
                actions
            }
            Err(payload) => {
                let failures = self.entries.get(uid).map_or(0, |e| e.failures) + 1;
                let delay = FIRST_RETRY_MS
                    .saturating_mul(1 << (failures - 1).min(20))
                    .min(MAX_RETRY_MS);
                let retry_at_ms = now_ms.saturating_add(delay);
                self.entries.insert(
                    uid.to_owned(),
                    Entry {
                        failures,
                        retry_at_ms,
                    },
                );
                vec![
                    Action::Failed {
                        object: shoal_model::event::ObjectRef::of(object),
                        message: format!(
                            "reconcile failed ({failures} in a row): {}; retried in {} s",
                            panic_message(payload.as_ref()),
                            delay / 1000
                        ),
                    },
                    Action::Requeue { at_ms: retry_at_ms },
                ]
            }
        }
    }

    /// Forgets the objects that are gone (or no longer this node's to reconcile).
    pub fn retain(&mut self, present: impl Fn(&str) -> bool) {
        self.entries.retain(|uid, _| present(uid));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(uid: &str) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "poison", "namespace": "default", "uid": uid}})
    }

    fn fine() -> Vec<Action> {
        vec![Action::Requeue { at_ms: 7 }]
    }

    /// A reconcile that panics quarantines its object with an event naming the panic, other
    /// objects go on, and the retry waits a doubling back-off; a success clears it.
    #[test]
    fn a_panicking_reconcile_is_quarantined_and_retried_with_back_off() {
        let mut q = Quarantine::new();
        let poison = object("p");
        let a = q.guard(&poison, 10_000, || {
            panic!("index out of bounds: the len is 0")
        });
        let Action::Failed {
            object: subject,
            message,
        } = &a[0]
        else {
            panic!("{a:?}")
        };
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("Job", "poison")
        );
        assert!(message.contains("index out of bounds"), "{message}");
        assert_eq!(a[1], Action::Requeue { at_ms: 11_000 });
        assert!(q.holds("p"));
        // Other objects are reconciled as usual in the same pass.
        assert_eq!(q.guard(&object("other"), 10_000, fine), fine());
        // Before the retry the reconcile does not run at all.
        let ran = std::cell::Cell::new(false);
        let a = q.guard(&poison, 10_500, || {
            ran.set(true);
            vec![]
        });
        assert!(!ran.get());
        assert_eq!(a, [Action::Requeue { at_ms: 11_000 }]);
        // It fails again: the wait doubles.
        let a = q.guard(&poison, 11_000, || panic!("again"));
        assert_eq!(a[1], Action::Requeue { at_ms: 13_000 });
        // Many failures wait at most the longest retry.
        for i in 0..30 {
            let now = 1_000_000_000 + i * MAX_RETRY_MS;
            let a = q.guard(&poison, now, || panic!("again"));
            let Action::Requeue { at_ms } = a[1] else {
                panic!()
            };
            assert!(at_ms - now <= MAX_RETRY_MS);
        }
        // Fixed (a new spec): it runs, and is out of quarantine.
        let now = 2_000_000_000;
        assert_eq!(q.guard(&poison, now, fine), fine());
        assert!(!q.holds("p"));
        q.guard(&poison, now, || panic!("once more"));
        q.retain(|uid| uid != "p");
        assert!(!q.holds("p"));
    }
}
