//! The invariants a chaos run is judged by, each a pure function of the recorded history and the
//! observed final state (DESIGN.md §11). They are tested below on hand-made histories, violating
//! ones included, so a checker that cannot fail would be caught.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::history::{Op, Outcome, Request};

/// A broken invariant, with the operations involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub checker: &'static str,
    pub message: String,
    pub ops: Vec<u64>,
}

/// A register object as it is at the end: its incarnation's uid and its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Final {
    pub uid: String,
    pub value: String,
}

pub const ACKNOWLEDGED_WRITES: &str = "acknowledged writes survive";
pub const CONVERGENCE: &str = "stores converge";
pub const TEARDOWN: &str = "nothing leaks, nothing panics";

/// Checker 1: every acknowledged operation is visible at the end, or superseded under the
/// documented merge rules (`crdt-state/src/crdt.rs`):
/// - within one incarnation (uid), the same field is last-writer-wins by (HLC, node): an
///   acknowledged write may be replaced by another write to the key that was not over before it
///   began (concurrent or later; with clocks in step, an earlier one cannot have a later stamp);
/// - a delete wins over every update of its incarnation, concurrent or not, and of two
///   incarnations of one name the one created later (by HLC) replaces the other whole: an
///   acknowledged write to incarnation U may be gone if a delete of U may have happened, or if
///   another incarnation was not created strictly before U (real-time order of the creates that
///   answered 201; an incarnation created by an operation of unknown outcome may be either);
/// - an acknowledged delete of U holds if U is gone; a different, newer incarnation may hold
///   the name (only a create brings it back);
/// - a final value no operation wrote is always a violation.
///
/// An operation of unknown outcome may take effect at any time after it began ([`Op::may_follow`]);
/// an incarnation no answer names may have been created by one.
///
/// `finals` maps each key to its final state (absent = no live object).
pub fn acknowledged_writes(ops: &[Op], finals: &BTreeMap<String, Final>) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_key.entry(op.request.key()).or_default().push(op);
    }
    let violation = |message: String, ops: Vec<u64>| Violation {
        checker: ACKNOWLEDGED_WRITES,
        message,
        ops,
    };
    for (key, final_state) in finals {
        let writer = by_key.get(key.as_str()).and_then(|ops| {
            ops.iter().find(|o| {
                matches!(&o.request, Request::Write { value, .. } if *value == final_state.value)
            })
        });
        match writer {
            None => violations.push(violation(
                format!(
                    "{key} ends as {:?}, which no operation wrote",
                    final_state.value
                ),
                Vec::new(),
            )),
            Some(w) if w.outcome == Outcome::Fail => violations.push(violation(
                format!(
                    "{key} ends as {:?}, written by op {} that failed (definitely not applied)",
                    final_state.value, w.id
                ),
                vec![w.id],
            )),
            Some(_) => {}
        }
    }
    for (key, key_ops) in &by_key {
        let final_state = finals.get(*key);
        let create_of = |uid: &str| {
            key_ops
                .iter()
                .find(|o| o.created && o.outcome == Outcome::Ok && o.uid.as_deref() == Some(uid))
        };
        // Whether incarnation `newer` may have replaced `older`: not created strictly before it.
        let may_replace = |older: &str, newer: &str| match (create_of(older), create_of(newer)) {
            (Some(a), Some(b)) => !b.precedes(a),
            _ => true,
        };
        // Incarnations seen in answers, and the final one (which a write of unknown outcome may
        // have created: no answer names it).
        let incarnations: std::collections::BTreeSet<&str> = key_ops
            .iter()
            .filter_map(|o| o.uid.as_deref())
            .chain(final_state.map(|f| f.uid.as_str()))
            .collect();
        // Whether an incarnation no answer names — created by a write of unknown outcome, not
        // strictly before `older` was — may have replaced `older` and then been deleted.
        let phantom_replaced_and_deleted = |older: &str| {
            key_ops.iter().any(|w| {
                matches!(w.request, Request::Write { .. })
                    && w.outcome == Outcome::Unknown
                    && create_of(older).is_none_or(|c| w.may_follow(c))
                    && key_ops.iter().any(|d| {
                        matches!(d.request, Request::Delete { .. })
                            && d.may_have_happened()
                            && d.may_follow(w)
                    })
            })
        };
        for acked in key_ops.iter().filter(|o| o.outcome == Outcome::Ok) {
            let uid = acked.uid.as_deref();
            // Whether incarnation `uid` may be gone: a delete that says it removed it (or whose
            // incarnation is unknown and that was not over before `acked` began), or another
            // incarnation that may have replaced it.
            let deleted_by = || {
                let deleted = key_ops.iter().any(|d| {
                    matches!(d.request, Request::Delete { .. })
                        && d.may_have_happened()
                        && match (&d.uid, uid) {
                            (Some(d_uid), Some(uid)) => d_uid == uid,
                            _ => d.may_follow(acked),
                        }
                });
                deleted
                    || uid.is_some_and(|u| {
                        incarnations
                            .iter()
                            .any(|other| *other != u && may_replace(u, other))
                            || (final_state.is_none() && phantom_replaced_and_deleted(u))
                    })
            };
            match (&acked.request, final_state) {
                (Request::Write { value, .. }, Some(f)) if *value == f.value => {}
                (Request::Write { value, .. }, Some(f)) => {
                    let same_incarnation = uid.is_none_or(|u| u == f.uid);
                    let superseded = if same_incarnation {
                        key_ops.iter().any(|s| {
                            matches!(&s.request, Request::Write { value: v, .. } if *v == f.value)
                                && s.may_have_happened()
                                && s.may_follow(acked)
                        })
                    } else {
                        deleted_by()
                    };
                    if !superseded {
                        violations.push(violation(
                            format!(
                                "acknowledged write {} of {value:?} to {key} is lost: {key} ends as {:?} (uid {}), written before op {} began{}",
                                acked.id,
                                f.value,
                                f.uid,
                                acked.id,
                                if same_incarnation { "" } else { ", and its incarnation was neither deleted nor replaced by a newer one" }
                            ),
                            vec![acked.id],
                        ));
                    }
                }
                (Request::Write { value, .. }, None) => {
                    if !deleted_by() {
                        violations.push(violation(
                            format!(
                                "acknowledged write {} of {value:?} to {key} is lost: {key} is gone and nothing deleted it",
                                acked.id
                            ),
                            vec![acked.id],
                        ));
                    }
                }
                (Request::Delete { .. }, Some(f)) if uid == Some(f.uid.as_str()) => {
                    violations.push(violation(
                        format!(
                            "acknowledged delete {} of {key} (uid {}) is lost: the same incarnation is live at the end with {:?}",
                            acked.id, f.uid, f.value
                        ),
                        vec![acked.id],
                    ));
                }
                (Request::Delete { .. }, _) => {}
            }
        }
    }
    violations
}

/// What the stores of the live agents looked like at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DigestSample {
    pub at_ms: u64,
    /// The root digest of each live agent that answered.
    pub digests: Vec<String>,
    /// Live agents that did not answer.
    pub unanswered: usize,
}

impl DigestSample {
    pub fn agree(&self) -> bool {
        self.unanswered == 0
            && !self.digests.is_empty()
            && self.digests.iter().all(|d| *d == self.digests[0])
    }
}

/// Checker 2: after the last fault is healed (`healed_ms`), every live agent's store digest is
/// identical within `bound_ms`. Returns the convergence time (from the heal to the first sample
/// where all agree), or the violation.
pub fn convergence(
    samples: &[DigestSample],
    healed_ms: u64,
    bound_ms: u64,
) -> Result<u64, Violation> {
    let after: Vec<&DigestSample> = samples.iter().filter(|s| s.at_ms >= healed_ms).collect();
    match after.iter().find(|s| s.agree()) {
        Some(s) if s.at_ms - healed_ms <= bound_ms => Ok(s.at_ms - healed_ms),
        found => {
            let last = after.last();
            Err(Violation {
                checker: CONVERGENCE,
                message: match (found, last) {
                    (Some(s), _) => format!(
                        "stores agreed only {} ms after the heal; the bound is {bound_ms} ms",
                        s.at_ms - healed_ms
                    ),
                    (None, Some(l)) => format!(
                        "stores never agreed within {} ms of the heal (last sample: {} distinct digests, {} agents not answering)",
                        l.at_ms - healed_ms,
                        distinct(&l.digests),
                        l.unanswered
                    ),
                    (None, None) => "no digest sample after the heal".into(),
                },
                ops: Vec::new(),
            })
        }
    }
}

fn distinct(digests: &[String]) -> usize {
    let mut d: Vec<&String> = digests.iter().collect();
    d.sort();
    d.dedup();
    d.len()
}

/// What was left on the machine after a lab's teardown, and the agents' logs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Leftovers {
    /// Processes still running from the lab's directory.
    pub processes: Vec<String>,
    /// Network namespaces with the lab's prefix.
    pub namespaces: Vec<String>,
    /// Mounts below the lab's directory.
    pub mounts: Vec<String>,
}

/// Checker 7: nothing of the lab survives its teardown and no agent log holds a panic.
/// `logs` are (agent name, log text).
pub fn teardown(leftovers: &Leftovers, logs: &[(String, String)]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (what, items) in [
        ("processes", &leftovers.processes),
        ("network namespaces", &leftovers.namespaces),
        ("mounts", &leftovers.mounts),
    ] {
        if !items.is_empty() {
            violations.push(Violation {
                checker: TEARDOWN,
                message: format!(
                    "{} {what} left after teardown: {}",
                    items.len(),
                    items.join(", ")
                ),
                ops: Vec::new(),
            });
        }
    }
    for (agent, log) in logs {
        if let Some(line) = log.lines().find(|l| l.contains("panicked at")) {
            violations.push(Violation {
                checker: TEARDOWN,
                message: format!("agent {agent} panicked: {}", line.trim()),
                ops: Vec::new(),
            });
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: u64, request: Request, at: (u64, u64), outcome: Outcome, uid: Option<&str>) -> Op {
        Op {
            id,
            node: 0,
            request,
            invoked_ms: at.0,
            completed_ms: at.1,
            outcome,
            uid: uid.map(str::to_owned),
            created: false,
            detail: String::new(),
        }
    }

    fn created(mut op: Op) -> Op {
        op.created = true;
        op
    }

    fn write(id: u64, value: &str, at: (u64, u64), outcome: Outcome, uid: Option<&str>) -> Op {
        let request = Request::Write {
            key: "k".into(),
            value: value.into(),
        };
        op(id, request, at, outcome, uid)
    }

    fn delete(id: u64, at: (u64, u64), outcome: Outcome, uid: Option<&str>) -> Op {
        op(id, Request::Delete { key: "k".into() }, at, outcome, uid)
    }

    fn ends(uid: &str, value: &str) -> BTreeMap<String, Final> {
        [(
            "k".to_owned(),
            Final {
                uid: uid.into(),
                value: value.into(),
            },
        )]
        .into()
    }

    fn gone() -> BTreeMap<String, Final> {
        BTreeMap::new()
    }

    use Outcome::{Fail, Ok as Acked, Unknown};

    #[test]
    fn the_last_acknowledged_write_at_the_end_is_fine() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            write(2, "b", (20, 30), Acked, Some("u1")),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "b")), []);
    }

    #[test]
    fn an_acknowledged_write_replaced_by_an_earlier_one_is_lost() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            write(2, "b", (20, 30), Acked, Some("u1")),
        ];
        let v = acknowledged_writes(&ops, &ends("u1", "a"));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].ops, [2]);
        assert!(v[0].message.contains("is lost"), "{v:?}");
    }

    #[test]
    fn concurrent_writes_may_end_either_way() {
        let ops = [
            write(1, "a", (0, 30), Acked, Some("u1")),
            write(2, "b", (10, 20), Acked, Some("u1")),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "a")), []);
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "b")), []);
    }

    #[test]
    fn an_unknown_write_may_win_but_a_failed_one_never_shows() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            write(2, "b", (20, 30), Unknown, None),
            write(3, "c", (20, 30), Fail, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "b")), []);
        let v = acknowledged_writes(&ops, &ends("u1", "c"));
        assert!(v.iter().any(|v| v.message.contains("failed")), "{v:?}");
    }

    #[test]
    fn a_value_nobody_wrote_is_a_violation() {
        let ops = [write(1, "a", (0, 10), Acked, Some("u1"))];
        let v = acknowledged_writes(&ops, &ends("u1", "zzz"));
        assert!(
            v.iter().any(|v| v.message.contains("no operation wrote")),
            "{v:?}"
        );
    }

    #[test]
    fn a_vanished_write_needs_a_delete_of_its_incarnation() {
        let acked = write(1, "a", (0, 10), Acked, Some("u1"));
        let v = acknowledged_writes(std::slice::from_ref(&acked), &gone());
        assert_eq!(v.len(), 1, "{v:?}");
        // Delete wins over any update of its incarnation, even one acknowledged later.
        let ops = [delete(0, (0, 5), Acked, Some("u1")), acked.clone()];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
        // A delete of an older incarnation, over before the write began, does not explain it.
        let ops = [
            created(write(0, "z", (0, 1), Acked, Some("u0"))),
            delete(1, (2, 5), Acked, Some("u0")),
            created(write(2, "a", (6, 10), Acked, Some("u1"))),
        ];
        assert_eq!(acknowledged_writes(&ops, &gone()).len(), 1);
        // An unknown delete concurrent with it may.
        let ops = [acked, delete(2, (5, 50), Unknown, None)];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
    }

    /// Two incarnations of one name (created on both sides of a partition): the one created
    /// later replaces the other whole, so writes to the older one may go; an older one winning
    /// over a newer one is a violation.
    #[test]
    fn an_older_incarnation_yields_to_a_newer_one_never_the_reverse() {
        let ops = [
            created(write(1, "a", (0, 10), Acked, Some("u1"))),
            write(2, "b", (20, 30), Acked, Some("u1")),
            created(write(3, "c", (40, 50), Acked, Some("u2"))),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u2", "c")), []);
        let v = acknowledged_writes(&ops, &ends("u1", "b"));
        assert!(v.iter().any(|v| v.ops == [3]), "{v:?}");
        // Created concurrently: either may win.
        let ops = [
            created(write(1, "a", (0, 30), Acked, Some("u1"))),
            created(write(3, "c", (10, 20), Acked, Some("u2"))),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "a")), []);
        assert_eq!(acknowledged_writes(&ops, &ends("u2", "c")), []);
    }

    /// Found by the partition scenario: an isolated node's write of unknown outcome (503) created
    /// an incarnation that, created later, replaced the one the majority kept acknowledging
    /// writes to. That is the documented rule for concurrent creates; with a write of unknown
    /// outcome behind it, it is no violation.
    #[test]
    fn an_incarnation_only_a_write_of_unknown_outcome_can_have_made_may_win() {
        let ops = [
            created(write(1, "a", (10, 20), Acked, Some("u1"))),
            write(2, "b", (30, 40), Acked, Some("u1")),
            write(3, "p", (15, 25), Unknown, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u9", "p")), []);
        // Even one that began before: like Jepsen's `info`, an operation of unknown outcome
        // may take effect at any time after it began (a frozen agent applies it when thawed).
        let ops = [
            created(write(1, "a", (10, 20), Acked, Some("u1"))),
            write(3, "p", (0, 5), Unknown, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u9", "p")), []);
        // Made by an unknown write, then deleted by an unknown delete: the name may end empty.
        let ops = [
            created(write(1, "a", (10, 20), Acked, Some("u1"))),
            write(2, "b", (30, 40), Acked, Some("u1")),
            write(3, "p", (15, 25), Unknown, None),
            delete(4, (26, 28), Unknown, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
    }

    #[test]
    fn an_acknowledged_delete_must_not_come_back_in_the_same_incarnation() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            delete(2, (20, 30), Acked, Some("u1")),
        ];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
        let v = acknowledged_writes(&ops, &ends("u1", "a"));
        assert!(v.iter().any(|v| v.ops == [2]), "{v:?}");
        // A new incarnation may hold the name.
        let mut ops = ops.to_vec();
        ops.push(write(3, "b", (40, 50), Acked, Some("u2")));
        assert_eq!(acknowledged_writes(&ops, &ends("u2", "b")), []);
    }

    #[test]
    fn convergence_is_timed_from_the_heal_and_bounded() {
        let sample = |at_ms, digests: &[&str], unanswered| DigestSample {
            at_ms,
            digests: digests.iter().map(|d| d.to_string()).collect(),
            unanswered,
        };
        let samples = [
            sample(500, &["a", "a"], 0),
            sample(1_000, &["a", "b"], 0),
            sample(1_500, &["b", "b"], 1),
            sample(2_000, &["b", "b"], 0),
        ];
        assert_eq!(convergence(&samples, 900, 5_000), Ok(1_100));
        let late = convergence(&samples, 900, 1_000).unwrap_err();
        assert!(late.message.contains("only 1100 ms"), "{late:?}");
        let never = convergence(&samples[..3], 900, 5_000).unwrap_err();
        assert!(never.message.contains("never agreed"), "{never:?}");
    }

    #[test]
    fn leftovers_and_panics_are_violations() {
        assert_eq!(
            teardown(&Leftovers::default(), &[("n0".into(), "fine\n".into())]),
            []
        );
        let left = Leftovers {
            namespaces: vec!["shc1-h0".into()],
            ..Leftovers::default()
        };
        let logs = [(
            "n1".into(),
            "x\nthread 'main' panicked at src/a.rs:1:1:\n".into(),
        )];
        let v = teardown(&left, &logs);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[1].message.contains("n1 panicked"), "{v:?}");
    }
}
