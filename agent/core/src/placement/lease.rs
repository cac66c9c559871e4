//! Run leases: a `fenced` pod runs only while its node holds a lease on it from a majority of
//! the membership baseline.
//!
//! Bindings are CRDT registers (DESIGN.md §6): two auctioneers whose membership views differ
//! for a moment (a node joining, a node just killed) can both bind the same pod, each to a
//! different node, and each binding is acknowledged by a quorum of replicas. The merge later
//! picks one, deterministically, but until each node has seen both, each believes the pod is
//! its own. For an `available` pod that brief overlap is the documented price of having no
//! leader; a `fenced` pod must never run twice, so its node also needs a *lease*:
//!
//! - **Grantor** (every node): grants pod `P` to node `X` only if its own store binds `P` to `X`
//!   at the epoch `X` asks for, and it holds no unexpired grant of `P`'s *name* to another node
//!   (two incarnations of one name, created on both sides of a partition or again after a
//!   delete, are one pod to fence). A grant
//!   lasts `term` from when the grantor received the request. A grantor that has just started
//!   refuses everything for one `term`: grants it gave before a crash are forgotten, and must
//!   have expired before it gives others.
//! - **Holder** (the node a fenced pod is bound to): asks every live peer and itself, every few
//!   hundred milliseconds, for all its fenced pods at once. A grant counts from the moment the
//!   *request was sent* until `hold` later (`hold < term`: the margin covers stopping the
//!   container and clock-rate drift). The pod may run while the grants that have not lapsed
//!   are a majority of the baseline ([`super::partition::has_majority`]).
//!
//! **Why a pod cannot hold two leases at once.** Say `X` and `Y` both hold `P` at time `t`.
//! Their granting sets are majorities of the baseline, so some node `Z` granted both. `Z`
//! granted `X` at `r1 >= s1` (the send time of `X`'s request) and `X` counts it only while
//! `t < s1 + hold < r1 + term`; so `Z`'s grant to `X` had not expired at `t`, and `Z` gave `Y`
//! its grant before `t` — while the grant to `X` was unexpired, which `Z` refuses — or `Z`
//! granted `Y` first and the same argument applies the other way round. A restarted `Z` gives
//! no grant for `term`, by when every grant it forgot has expired. The argument assumes only
//! that monotonic clocks advance at nearly the same rate (the margin `term - hold` covers the
//! drift) and that a holder stops its pod within that margin after its lease lapses (the
//! kubelet polls every 100 ms; a frozen agent's containers are killed by their shims `hold`
//! after its last round, the agent's `runtime/lease.rs`).
//!
//! The baseline a holder counts against is the largest of its own and those its grantors
//! reported with replies whose grants still count (a report lapses with them). Baselines only
//! grow, except by the operator's `shoal baseline --set`, whose word is that the nodes beyond
//! the new count never come back; a node still reporting the old count keeps the old majority
//! for every holder it answers.
//!
//! Liveness: once the stores agree on the binding, every grantor grants its node as soon as
//! any other node's grant has expired, so a conflict costs the winner at most one `term`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::partition::has_majority;

/// One pod a holder asks about: its uid and the binding epoch it holds it at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    pub uid: String,
    pub epoch: u64,
}

/// A holder's request, sent to every live peer (the holder is the request's authenticated
/// sender, never a field of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    pub asks: Vec<Ask>,
}

/// A grantor's answer: the uids granted (the others were refused), and its membership baseline
/// (a holder counts a majority against the largest baseline it has heard of).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseReply {
    pub granted: Vec<String>,
    pub baseline: u32,
}

/// Most pods one request may ask about, and the longest uid accepted (a peer's request is
/// untrusted input).
pub const MAX_ASKS: usize = 10_000;
pub const MAX_UID_BYTES: usize = 128;

/// Why a peer's lease request was refused (naming the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("asks: {0} pods in one request (at most {MAX_ASKS})")]
    TooManyAsks(usize),
    #[error("asks[].uid: {0} bytes (1 to {MAX_UID_BYTES})")]
    BadUid(usize),
}

/// Checks a peer's request before it is answered.
pub fn validate(request: &LeaseRequest) -> Result<(), RequestError> {
    if request.asks.len() > MAX_ASKS {
        return Err(RequestError::TooManyAsks(request.asks.len()));
    }
    if let Some(ask) = request
        .asks
        .iter()
        .find(|a| a.uid.is_empty() || a.uid.len() > MAX_UID_BYTES)
    {
        return Err(RequestError::BadUid(ask.uid.len()));
    }
    Ok(())
}

/// How often a holder asks for its fenced pods' leases while it holds them all.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(500);

/// Whether a holder's next lease round is due at `now`: its first, then every
/// [`ROUND_INTERVAL`] while it holds every lease it asks for, and every `tick` while one is not
/// held (a pod waiting for its lease starts as soon as a majority grants it).
pub fn round_due(last: Option<Duration>, all_held: bool, now: Duration, tick: Duration) -> bool {
    match last {
        None => true,
        Some(last) if all_held => now >= last + ROUND_INTERVAL,
        Some(last) => now >= last + tick,
    }
}

/// What a grantor's store says of a pod a holder asks about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The pod's `namespace/name`: grants are per name, so two incarnations of one name (a
    /// pod deleted and created again, or created on both sides of a partition) are one pod
    /// to fence, as a StatefulSet's identity is.
    pub name: String,
    pub node: String,
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Grant {
    holder: String,
    until: Duration,
}

/// The grantor half, one per node. Time is any monotonic clock, the same on every call.
#[derive(Debug, Clone)]
pub struct Grantor {
    started: Duration,
    term: Duration,
    /// By pod name.
    grants: HashMap<String, Grant>,
}

impl Grantor {
    /// A grantor started at `now`: it grants nothing before `now + term`.
    pub fn new(now: Duration, term: Duration) -> Self {
        Self {
            started: now,
            term,
            grants: HashMap::new(),
        }
    }

    /// Answers `holder`'s asks. `bound_to(uid)` is this node's stored binding of the pod (none:
    /// this store has no such pod, for instance an incarnation it replaced). Returns the uids
    /// granted.
    pub fn answer(
        &mut self,
        now: Duration,
        holder: &str,
        asks: &[Ask],
        bound_to: impl Fn(&str) -> Option<Binding>,
    ) -> Vec<String> {
        if now < self.started + self.term {
            return Vec::new();
        }
        self.grants.retain(|_, g| g.until > now);
        let mut granted = Vec::new();
        for ask in asks {
            let Some(binding) = bound_to(&ask.uid) else {
                continue;
            };
            if binding.node != holder || binding.epoch != ask.epoch {
                continue;
            }
            if self
                .grants
                .get(&binding.name)
                .is_some_and(|g| g.holder != holder)
            {
                continue;
            }
            self.grants.insert(
                binding.name,
                Grant {
                    holder: holder.to_owned(),
                    until: now + self.term,
                },
            );
            granted.push(ask.uid.clone());
        }
        granted
    }

    /// Unexpired grants (for tests and metrics).
    pub fn granted(&self, now: Duration) -> usize {
        self.grants.values().filter(|g| g.until > now).count()
    }
}

/// The holder half, one per node: the grants it has received for the pods bound to it.
#[derive(Debug, Clone, Default)]
pub struct Holder {
    /// uid -> (epoch, grantor -> counted until).
    grants: HashMap<String, (u64, BTreeMap<String, Duration>)>,
    /// The baseline each grantor last reported, counted as long as a grant of that reply
    /// would be (a silent grantor's report lapses with its grants: a baseline lowered by the
    /// operator takes effect once the nodes that reported the old one stop answering).
    baselines: HashMap<String, (u32, Duration)>,
}

impl Holder {
    /// Takes in `grantor`'s reply to a request sent at `sent` with `asks`.
    pub fn on_reply(
        &mut self,
        sent: Duration,
        hold: Duration,
        grantor: &str,
        asks: &[Ask],
        reply: &LeaseReply,
    ) {
        self.baselines
            .insert(grantor.to_owned(), (reply.baseline, sent + hold));
        for ask in asks {
            if !reply.granted.contains(&ask.uid) {
                // A refusal does not shorten a grant already counted: the grantor still
                // honours it until it expires.
                continue;
            }
            let entry = self
                .grants
                .entry(ask.uid.clone())
                .or_insert_with(|| (ask.epoch, BTreeMap::new()));
            if entry.0 != ask.epoch {
                *entry = (ask.epoch, BTreeMap::new());
            }
            let until = sent + hold;
            let slot = entry.1.entry(grantor.to_owned()).or_insert(until);
            *slot = (*slot).max(until);
        }
    }

    /// Whether pod `uid`, bound here at `epoch`, may run at `now`: the grants not yet lapsed
    /// are a majority of `baseline` (or of a larger baseline a grantor reported).
    pub fn holds(&self, uid: &str, epoch: u64, now: Duration, baseline: usize) -> bool {
        let Some((held_epoch, grants)) = self.grants.get(uid) else {
            return false;
        };
        if *held_epoch != epoch {
            return false;
        }
        let baseline = self.baseline_at(now, baseline);
        let live = grants.values().filter(|until| **until > now).count();
        has_majority(live, baseline)
    }

    /// Until when pod `uid`, bound here at `epoch`, may run if no further reply comes: the
    /// time the grants counted at `now` stop being a majority (`None`: it may not run at
    /// `now`). [`Holder::holds`] is true from `now` until then; it may turn true again later
    /// only through a new reply. The baseline counted is the one in force at `now` (a larger
    /// reported baseline that lapses sooner would only lengthen the hold). The shim of a fenced
    /// container kills it at this time whatever its kubelet does (`runtime::lease`).
    pub fn held_until(
        &self,
        uid: &str,
        epoch: u64,
        now: Duration,
        baseline: usize,
    ) -> Option<Duration> {
        if !self.holds(uid, epoch, now, baseline) {
            return None;
        }
        let (_, grants) = self.grants.get(uid)?;
        let baseline = self.baseline_at(now, baseline);
        let mut untils: Vec<Duration> = grants.values().copied().filter(|u| *u > now).collect();
        untils.sort_unstable_by(|a, b| b.cmp(a));
        // The fewest live grants that are a majority: the hold ends when the one that many
        // places from the latest expires.
        let needed = (1..=untils.len()).find(|n| has_majority(*n, baseline))?;
        Some(untils[needed - 1])
    }

    /// The baseline counted at `now`: `baseline`, or a larger one a grantor reported with a
    /// reply that still counts.
    fn baseline_at(&self, now: Duration, baseline: usize) -> usize {
        self.baselines
            .values()
            .filter(|(_, until)| *until > now)
            .map(|(b, _)| *b as usize)
            .max()
            .unwrap_or(0)
            .max(baseline)
    }

    /// Forgets the pods not in `keep` (no longer bound here) and lapsed grants.
    pub fn retain(&mut self, now: Duration, keep: impl Fn(&str) -> bool) {
        self.grants.retain(|uid, (_, grants)| {
            grants.retain(|_, until| *until > now);
            keep(uid) && !grants.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const TERM: Duration = Duration::from_secs(6);
    const HOLD: Duration = Duration::from_secs(5);

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn ask(uid: &str, epoch: u64) -> Vec<Ask> {
        vec![Ask {
            uid: uid.to_owned(),
            epoch,
        }]
    }

    fn bound(node: &'static str, epoch: u64) -> impl Fn(&str) -> Option<Binding> {
        move |_| {
            Some(Binding {
                name: "default/p".into(),
                node: node.to_owned(),
                epoch,
            })
        }
    }

    #[test]
    fn a_grantor_grants_only_the_bound_node_and_one_node_at_a_time() {
        let mut g = Grantor::new(s(0), TERM);
        assert!(
            g.answer(s(1), "x", &ask("p", 1), bound("x", 1)).is_empty(),
            "a fresh grantor grants nothing for one term"
        );
        assert_eq!(g.answer(s(6), "x", &ask("p", 1), bound("x", 1)), ["p"]);
        // Bound elsewhere in this store, or at another epoch: refused.
        assert!(g.answer(s(7), "y", &ask("p", 1), bound("x", 1)).is_empty());
        assert!(g.answer(s(7), "x", &ask("p", 2), bound("x", 1)).is_empty());
        // The store now binds y, but x's grant runs until 12 s.
        assert!(g.answer(s(11), "y", &ask("p", 2), bound("y", 2)).is_empty());
        assert_eq!(g.answer(s(12), "y", &ask("p", 2), bound("y", 2)), ["p"]);
        assert_eq!(g.granted(s(12)), 1);
        assert_eq!(g.granted(s(18)), 0);
    }

    #[test]
    fn two_incarnations_of_one_name_are_one_pod_to_fence() {
        let mut g = Grantor::new(s(0), TERM);
        assert_eq!(g.answer(s(6), "x", &ask("old", 1), bound("x", 1)), ["old"]);
        // The store now holds a new incarnation of the name, bound to y: refused while x's
        // grant of the old one runs (until 12 s), granted after.
        assert!(
            g.answer(s(7), "y", &ask("new", 1), bound("y", 1))
                .is_empty()
        );
        assert_eq!(g.answer(s(12), "y", &ask("new", 1), bound("y", 1)), ["new"]);
        // An incarnation this store does not hold is refused.
        assert!(g.answer(s(20), "x", &ask("old", 1), |_| None).is_empty());
    }

    #[test]
    fn a_holder_needs_a_majority_of_unexpired_grants_at_its_epoch() {
        let mut h = Holder::default();
        let asks = ask("p", 3);
        let yes = LeaseReply {
            granted: vec!["p".into()],
            baseline: 5,
        };
        h.on_reply(s(10), HOLD, "a", &asks, &yes);
        h.on_reply(s(10), HOLD, "b", &asks, &yes);
        assert!(!h.holds("p", 3, s(11), 5), "two of five");
        h.on_reply(s(11), HOLD, "c", &asks, &yes);
        assert!(h.holds("p", 3, s(11), 5));
        assert!(!h.holds("p", 4, s(11), 5), "another epoch");
        // A grantor that knows more nodes raises the count needed.
        let larger = LeaseReply {
            granted: vec![],
            baseline: 7,
        };
        h.on_reply(s(11), HOLD, "d", &asks, &larger);
        assert!(!h.holds("p", 3, s(11), 5), "three of seven");
        h.on_reply(s(12), HOLD, "e", &asks, &yes);
        assert!(h.holds("p", 3, s(12), 5));
        // Grants count from when the request was sent: a and b lapse at 15 s.
        assert!(!h.holds("p", 3, s(15), 5));
        h.retain(s(15), |_| true);
        assert!(!h.holds("p", 3, s(16), 5));
        h.retain(s(16), |uid| uid != "p");
        assert!(!h.holds("p", 3, s(12), 5), "forgotten");
    }

    #[test]
    fn a_baseline_report_lapses_with_its_grantors_grants() {
        // Nodes d and e reported 5 and went for good; the operator lowered a, b and c to 3.
        let mut h = Holder::default();
        let asks = ask("p", 1);
        let old = LeaseReply {
            granted: vec!["p".into()],
            baseline: 5,
        };
        h.on_reply(s(10), HOLD, "d", &asks, &old);
        h.on_reply(s(10), HOLD, "e", &asks, &old);
        let lowered = LeaseReply {
            granted: vec!["p".into()],
            baseline: 3,
        };
        h.on_reply(s(20), HOLD, "a", &asks, &lowered);
        h.on_reply(s(20), HOLD, "b", &asks, &lowered);
        // d's and e's reports (and grants) lapsed at 15 s: two of three hold it.
        assert!(h.holds("p", 1, s(21), 3));
        // While a report of 5 is fresh, two grants are not enough.
        h.on_reply(
            s(21),
            HOLD,
            "c",
            &asks,
            &LeaseReply {
                granted: vec![],
                baseline: 5,
            },
        );
        assert!(!h.holds("p", 1, s(22), 3));
        assert!(!h.holds("p", 1, s(27), 3), "a's and b's grants lapsed too");
    }

    #[test]
    fn requests_from_peers_are_checked() {
        assert!(validate(&LeaseRequest { asks: ask("p", 1) }).is_ok());
        let long = LeaseRequest {
            asks: ask(&"u".repeat(MAX_UID_BYTES + 1), 1),
        };
        assert!(matches!(validate(&long), Err(RequestError::BadUid(_))));
        let many = LeaseRequest {
            asks: (0..=MAX_ASKS)
                .map(|i| Ask {
                    uid: i.to_string(),
                    epoch: 1,
                })
                .collect(),
        };
        assert!(matches!(validate(&many), Err(RequestError::TooManyAsks(_))));
    }

    /// A message in flight: (deliver at, holder, grantor, sent at).
    type Flight = (Duration, usize, usize, Duration);

    /// Two holders, `n` grantors whose stores bind the pod to one or the other until they all
    /// converge on holder 0; requests and replies delayed at random (and lost), grantors
    /// restarted at random. With `incarnations`, the two bindings are two incarnations of one
    /// name (holder 1 runs the old uid, holder 0 the new one; a store knows only one of them).
    /// Returns the instants (ms) both holders held the pod.
    fn overlap(
        n: usize,
        delays: &[u64],
        converge_ms: u64,
        first_binding: &[bool],
        restarts: &[(usize, u64)],
        broken: bool,
        incarnations: bool,
    ) -> (Vec<u64>, bool) {
        let uids = if incarnations {
            ["p-new", "p-old"]
        } else {
            ["p", "p"]
        };
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let holders = ["n0", "n1"];
        let mut grantors: Vec<Grantor> = (0..n).map(|_| Grantor::new(s(0), TERM)).collect();
        let mut holder_state = [Holder::default(), Holder::default()];
        let mut flights: Vec<Flight> = Vec::new();
        let mut delay = delays.iter().cycle();
        let mut both = Vec::new();
        for ms in (0..30_000u64).step_by(50) {
            let now = Duration::from_millis(ms);
            for (node, at) in restarts {
                if *at == ms {
                    grantors[node % n] = Grantor::new(now, TERM);
                }
            }
            if ms % 500 == 0 {
                for h in 0..2 {
                    for g in 0..n {
                        let d = *delay.next().unwrap();
                        if d < 3_000 {
                            flights.push((now + Duration::from_millis(d), h, g, now));
                        }
                    }
                }
            }
            let (due, later): (Vec<Flight>, Vec<Flight>) =
                flights.drain(..).partition(|f| f.0 <= now);
            flights = later;
            for (_, h, g, sent) in due {
                let store_says = |g: usize| {
                    let winner = if ms >= converge_ms || first_binding[g % first_binding.len()] {
                        0
                    } else {
                        1
                    };
                    move |uid: &str| {
                        (uid == uids[winner]).then(|| Binding {
                            name: "default/p".into(),
                            node: holders[winner].to_owned(),
                            epoch: 1,
                        })
                    }
                };
                let asks = ask(uids[h], 1);
                let mut granted = grantors[g].answer(now, holders[h], &asks, store_says(g));
                if broken {
                    // A grantor that forgets the one-holder rule.
                    grantors[g] = Grantor::new(Duration::ZERO, TERM);
                    if granted.is_empty()
                        && store_says(g)(uids[h]).is_some_and(|b| b.node == holders[h])
                    {
                        granted = vec![uids[h].into()];
                    }
                }
                let reply = LeaseReply {
                    granted,
                    baseline: n as u32,
                };
                holder_state[h].on_reply(sent, HOLD, &names[g], &asks, &reply);
            }
            if holder_state[0].holds(uids[0], 1, now, n)
                && holder_state[1].holds(uids[1], 1, now, n)
            {
                both.push(ms);
            }
        }
        let end = Duration::from_millis(30_000);
        (both, holder_state[0].holds(uids[0], 1, end, n))
    }

    #[test]
    fn the_checker_sees_two_holders_when_a_grantor_breaks_the_rule() {
        // Three stores bind n1 and two n0 for 10 s, then all bind n0 (the merge's winner): n1
        // holds the pod before, n0 after; a grantor that forgets its grants lets n0 in while
        // n1's grants still count.
        let split = [false, true, false, true, false];
        for incarnations in [false, true] {
            assert!(
                !overlap(5, &[10], 10_000, &split, &[], true, incarnations)
                    .0
                    .is_empty()
            );
            let (both, winner_holds) = overlap(5, &[10], 10_000, &split, &[], false, incarnations);
            assert!(both.is_empty());
            assert!(
                winner_holds,
                "once the stores agree, their node holds the pod"
            );
        }
    }

    #[test]
    fn a_hold_lasts_until_the_majority_s_earliest_grant_lapses() {
        let mut h = Holder::default();
        let asks = ask("p", 1);
        let yes = LeaseReply {
            granted: vec!["p".into()],
            baseline: 5,
        };
        assert_eq!(h.held_until("p", 1, s(10), 5), None);
        h.on_reply(s(10), HOLD, "a", &asks, &yes);
        h.on_reply(s(11), HOLD, "b", &asks, &yes);
        h.on_reply(s(12), HOLD, "c", &asks, &yes);
        h.on_reply(s(13), HOLD, "d", &asks, &yes);
        // Four grants lapsing at 15, 16, 17 and 18 s: three of five hold until 16 s.
        assert_eq!(h.held_until("p", 1, s(13), 5), Some(s(16)));
        assert!(h.holds("p", 1, s(16) - Duration::from_millis(1), 5));
        assert!(!h.holds("p", 1, s(16), 5));
        assert_eq!(h.held_until("p", 1, s(16), 5), None);
        assert_eq!(h.held_until("p", 2, s(13), 5), None, "another epoch");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The deadline a shim enforces is never later than the hold it stands for: the holder
        /// holds the pod from `now` until `held_until`, and (no larger baseline lapsing in
        /// between) not at that instant.
        #[test]
        fn held_until_is_where_holds_ends(
            replies in proptest::collection::vec((0usize..7, 0u64..200, any::<bool>(), 3u32..8), 0..24),
            baseline in 1usize..8,
            now in 0u64..200,
        ) {
            let mut h = Holder::default();
            let asks = ask("p", 1);
            for (grantor, sent, granted, reported) in &replies {
                let reply = LeaseReply {
                    granted: if *granted { vec!["p".into()] } else { vec![] },
                    baseline: *reported,
                };
                h.on_reply(Duration::from_millis(sent * 100), HOLD, &format!("g{grantor}"), &asks, &reply);
            }
            let now = Duration::from_millis(now * 100);
            let until = h.held_until("p", 1, now, baseline);
            prop_assert_eq!(until.is_some(), h.holds("p", 1, now, baseline));
            if let Some(until) = until {
                prop_assert!(until > now);
                let mut t = now;
                while t < until {
                    prop_assert!(h.holds("p", 1, t, baseline), "not held at {:?} < {:?}", t, until);
                    t += Duration::from_millis(50);
                }
                let larger_lapses = replies.iter().any(|(_, _, _, b)| *b as usize > baseline);
                if !larger_lapses {
                    prop_assert!(!h.holds("p", 1, until, baseline));
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the delays, losses, restarts and disagreement between the stores, the two
        /// nodes never hold the pod at once; and once the stores agree, the winner holds it.
        #[test]
        fn a_fenced_pod_is_never_held_twice(
            n in 3usize..8,
            delays in proptest::collection::vec(0u64..4_000, 1..64),
            converge_ms in 0u64..15_000,
            first_binding in proptest::collection::vec(any::<bool>(), 1..8),
            restarts in proptest::collection::vec((0usize..8, (0u64..300).prop_map(|t| t * 50)), 0..4),
            incarnations in any::<bool>(),
        ) {
            let (both, _) =
                overlap(n, &delays, converge_ms, &first_binding, &restarts, false, incarnations);
            prop_assert!(both.is_empty(), "both held the pod at {:?} ms", &both[..both.len().min(5)]);
        }
    }
}
