//! The CRDT of one object: a last-writer-wins map of field registers, per incarnation.
//!
//! An object is split into **field registers** at a fixed depth: every top-level field and its
//! direct children (`spec.replicas`, `spec.template`, `data.<key>`, `metadata.name`), and each
//! label and annotation (`metadata.labels.<key>`). A write stores only the registers whose value
//! changed, stamped with the writer's HLC time and node id, so concurrent writes to *different*
//! fields both survive and writes to the *same* field resolve last-writer-wins by (HLC, node id).
//!
//! Semantics of deletes, chosen to match what Kubernetes users expect:
//! - Each create starts a new **incarnation** (a new `uid`). Between two incarnations of the same
//!   key, the one created later (by stamp) wins whole: its fields never mix with the other's.
//! - A delete tombstones its incarnation. **Delete wins over any update of the same
//!   incarnation**, concurrent or not (updating a deleted object is a 404 in Kubernetes too); only a
//!   new create brings the name back.
//!
//! Merge is a join: commutative, associative and idempotent (property-tested below), so replicas
//! that exchanged the same writes in any order, any number of times, hold identical states.
//!
//! The parts are the `crdts` crate's CvRDTs, merged through its `CvRDT` trait: each register is
//! an `LWWReg` whose marker is the write's [`Stamp`], and `metadata.generation` is a grow-only
//! counter of spec writes per node (a `VClock`, so it never goes down).

use std::collections::BTreeMap;

use crdts::{CmRDT, CvRDT, Dot, LWWReg, VClock};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::hlc::Timestamp;

/// Compact id of the writing node (the agent's 64-bit node id).
pub type NodeId = u64;

/// Total order of writes: HLC time, then node id (unique, since each node's HLC is strictly
/// increasing).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Stamp {
    pub time: Timestamp,
    pub node: NodeId,
}

/// A field path below the object root, e.g. `["spec", "replicas"]`.
pub type FieldPath = Vec<String>;

/// One last-writer-wins register: the value (`None` records that the field was removed) and the
/// stamp of the write that set it as the marker.
pub type Register = LWWReg<Option<Value>, Stamp>;

fn register(marker: Stamp, val: Option<Value>) -> Register {
    LWWReg { val, marker }
}

/// Joins `theirs` into `mine` through `LWWReg`'s `CvRDT` merge (the later stamp wins). Two
/// values under one stamp (never written by a correct node: stamps are unique) would make the
/// merge order-dependent, which `validate_merge` reports; they resolve by comparing the values,
/// so every replica keeps the same one.
fn merge_register(mine: &mut Register, theirs: &Register) {
    match mine.validate_merge(theirs) {
        Ok(()) => mine.merge(theirs.clone()),
        Err(_) => {
            let text = |r: &Register| serde_json::to_string(&r.val).unwrap_or_default();
            if text(theirs) > text(mine) {
                *mine = theirs.clone();
            }
        }
    }
}

/// The replicated state of one object key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectState {
    /// The incarnation's uid (`metadata.uid`).
    pub uid: String,
    /// When (and by whom) this incarnation was created.
    pub created: Stamp,
    #[serde(with = "registers")]
    pub fields: BTreeMap<FieldPath, Register>,
    /// Set once the incarnation is deleted; never unset.
    pub deleted: Option<Stamp>,
    /// Writes that changed `spec`, counted per writing node; `metadata.generation` is their sum
    /// (see [`ObjectState::generation`]). Empty in states stored before it existed.
    #[serde(default)]
    pub spec_writes: VClock<NodeId>,
}

/// Registers are stored and sent as `(stamp, value)` pairs: the layout of the register type
/// before it was `crdts::LWWReg`, so stores written by earlier versions read unchanged.
mod registers {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::Value;

    use super::{FieldPath, Register, Stamp};

    pub fn serialize<S: Serializer>(
        fields: &BTreeMap<FieldPath, Register>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(fields.iter().map(|(path, r)| (path, (&r.marker, &r.val))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<FieldPath, Register>, D::Error> {
        let pairs = BTreeMap::<FieldPath, (Stamp, Option<Value>)>::deserialize(deserializer)?;
        Ok(pairs
            .into_iter()
            .map(|(path, (marker, val))| (path, super::register(marker, val)))
            .collect())
    }
}

fn is_spec(path: &[String]) -> bool {
    path.first().is_some_and(|f| f == "spec")
}

/// Depth at which a path stops being split into children.
fn split_depth(path: &[String]) -> usize {
    match path {
        [m, field, ..] if m == "metadata" && (field == "labels" || field == "annotations") => 3,
        _ => 2,
    }
}

/// The registers a body consists of.
pub fn flatten(body: &Value) -> BTreeMap<FieldPath, Value> {
    fn go(value: &Value, path: &mut FieldPath, out: &mut BTreeMap<FieldPath, Value>) {
        match value {
            Value::Object(map)
                if path.len() < split_depth(path) && (path.is_empty() || !map.is_empty()) =>
            {
                for (k, child) in map {
                    path.push(k.clone());
                    go(child, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone(), value.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    go(body, &mut Vec::new(), &mut out);
    out
}

fn set_path(root: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        *root = value;
        return;
    };
    let mut node = root;
    for segment in parents {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        node = node
            .as_object_mut()
            .expect("just made an object")
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    node.as_object_mut()
        .expect("just made an object")
        .insert(last.clone(), value);
}

/// Removes `path`, then any parent container the removal left empty.
fn remove_path(root: &mut Value, path: &[String]) {
    fn go(node: &mut Value, path: &[String]) -> bool {
        let Some(map) = node.as_object_mut() else {
            return false;
        };
        match path {
            [] => false,
            [last] => map.remove(last).is_some(),
            [first, rest @ ..] => {
                let Some(child) = map.get_mut(first) else {
                    return false;
                };
                let removed = go(child, rest);
                if removed && child.as_object().is_some_and(Map::is_empty) {
                    map.remove(first);
                }
                removed
            }
        }
    }
    go(root, path);
}

/// Deterministic tie-break between two registers with equal stamps (only a buggy or hostile peer
/// produces those): the larger JSON text wins.
impl ObjectState {
    /// A new incarnation holding `body`.
    pub fn create(uid: String, stamp: Stamp, body: &Value) -> Self {
        let fields = flatten(body)
            .into_iter()
            .map(|(path, value)| (path, register(stamp, Some(value))))
            .collect();
        let mut spec_writes = VClock::new();
        spec_writes.apply(spec_writes.inc(stamp.node));
        Self {
            uid,
            created: stamp,
            fields,
            deleted: None,
            spec_writes,
        }
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.is_some()
    }

    /// Replaces the object's body with `body`, writing only the registers that change. Returns
    /// whether anything changed.
    pub fn update(&mut self, stamp: Stamp, body: &Value) -> bool {
        let current = flatten(&self.render());
        let new = flatten(body);
        let generation = self.generation();
        let mut changed: Vec<(FieldPath, Option<Value>)> = Vec::new();
        for (path, value) in &new {
            if current.get(path) != Some(value) {
                changed.push((path.clone(), Some(value.clone())));
            }
        }
        for path in current.keys().filter(|p| !new.contains_key(*p)) {
            changed.push((path.clone(), None));
        }
        if changed.iter().any(|(p, _)| is_spec(p)) {
            if self.spec_writes.is_empty() {
                // Stored before spec writes were counted: carry the old count over, credited to
                // the creator (every node computes the same from the same state).
                self.spec_writes
                    .apply(Dot::new(self.created.node, generation));
            }
            self.spec_writes.apply(self.spec_writes.inc(stamp.node));
        }
        let any = !changed.is_empty();
        for (path, value) in changed {
            self.fields.insert(path, register(stamp, value));
        }
        any
    }

    /// Tombstones this incarnation.
    pub fn delete(&mut self, stamp: Stamp) {
        self.deleted = Some(self.deleted.map_or(stamp, |d| d.max(stamp)));
    }

    /// Joins `other` into `self`.
    pub fn merge(&mut self, other: &ObjectState) {
        if self.uid != other.uid {
            let other_wins = (other.created, &other.uid) > (self.created, &self.uid);
            if other_wins {
                *self = other.clone();
            }
            return;
        }
        for (path, theirs) in &other.fields {
            match self.fields.get_mut(path) {
                Some(mine) => merge_register(mine, theirs),
                None => {
                    self.fields.insert(path.clone(), theirs.clone());
                }
            }
        }
        self.created = self.created.max(other.created);
        self.deleted = self.deleted.max(other.deleted);
        self.spec_writes.merge(other.spec_writes.clone());
    }

    /// The object body (without server-owned metadata): registers applied in stamp order, so
    /// conflicting shapes (a field set to a scalar on one side, its child set on the other)
    /// resolve the same way everywhere.
    pub fn render(&self) -> Value {
        let mut ordered: Vec<(&FieldPath, &Register)> = self.fields.iter().collect();
        ordered.sort_by(|a, b| a.1.marker.cmp(&b.1.marker).then_with(|| a.0.cmp(b.0)));
        let mut root = Value::Object(Map::new());
        for (path, register) in ordered {
            match &register.val {
                Some(value) => set_path(&mut root, path, value.clone()),
                None => remove_path(&mut root, path),
            }
        }
        root
    }

    /// `metadata.generation`: the number of writes that changed `spec` (the create counts as
    /// one), summed over the writing nodes. It never goes down: merges take each node's larger
    /// count. Concurrent writes on both sides of a partition both count.
    pub fn generation(&self) -> u64 {
        if self.spec_writes.is_empty() {
            return self.legacy_generation();
        }
        self.spec_writes
            .iter()
            .fold(0u64, |sum, dot| sum.saturating_add(dot.counter))
            .max(1)
    }

    /// The count before spec writes were counted: distinct stamps among the spec registers
    /// (it could go down when one write overwrote the fields of several).
    fn legacy_generation(&self) -> u64 {
        let mut stamps: Vec<Stamp> = self
            .fields
            .iter()
            .filter(|(p, _)| is_spec(p))
            .map(|(_, r)| r.marker)
            .collect();
        stamps.sort();
        stamps.dedup();
        stamps.len().max(1) as u64
    }

    /// The latest stamp anywhere in this state.
    pub fn max_stamp(&self) -> Stamp {
        self.fields
            .values()
            .map(|r| r.marker)
            .chain([self.created])
            .chain(self.deleted)
            .max()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn stamp(t: u64, node: NodeId) -> Stamp {
        Stamp {
            time: Timestamp::new(t, 0),
            node,
        }
    }

    fn deployment(replicas: u64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
               "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    #[test]
    fn flatten_splits_at_the_documented_depth() {
        let flat = flatten(&deployment(2, "nginx"));
        let paths: Vec<String> = flat.keys().map(|p| p.join(".")).collect();
        assert_eq!(
            paths,
            [
                "apiVersion",
                "kind",
                "metadata.labels.app",
                "metadata.name",
                "metadata.namespace",
                "spec.replicas",
                "spec.template"
            ]
        );
    }

    #[test]
    fn render_round_trips_a_body() {
        let body = deployment(2, "nginx");
        assert_eq!(
            ObjectState::create("u".into(), stamp(1, 1), &body).render(),
            body
        );
    }

    #[test]
    fn concurrent_updates_of_different_fields_both_survive() {
        let base = ObjectState::create("u".into(), stamp(1, 1), &deployment(2, "nginx"));
        let mut a = base.clone();
        let mut b = base.clone();
        assert!(a.update(stamp(2, 1), &deployment(5, "nginx")));
        let mut relabelled = deployment(2, "nginx");
        relabelled["metadata"]["labels"]["tier"] = json!("front");
        assert!(b.update(stamp(2, 2), &relabelled));
        a.merge(&b);
        let merged = a.render();
        assert_eq!(merged["spec"]["replicas"], 5);
        assert_eq!(merged["metadata"]["labels"]["tier"], "front");
        assert_eq!(merged["metadata"]["labels"]["app"], "web");
    }

    #[test]
    fn same_field_is_last_writer_wins_by_hlc_then_node() {
        let base = ObjectState::create("u".into(), stamp(1, 1), &deployment(2, "nginx"));
        let (mut a, mut b) = (base.clone(), base.clone());
        a.update(stamp(5, 9), &deployment(3, "nginx"));
        b.update(stamp(5, 10), &deployment(4, "nginx"));
        let mut ab = a.clone();
        ab.merge(&b);
        let mut ba = b.clone();
        ba.merge(&a);
        assert_eq!(ab, ba);
        assert_eq!(
            ab.render()["spec"]["replicas"],
            4,
            "same time: higher node id wins"
        );
    }

    #[test]
    fn removed_labels_disappear_and_empty_maps_are_pruned() {
        let mut s = ObjectState::create("u".into(), stamp(1, 1), &deployment(2, "nginx"));
        let mut body = deployment(2, "nginx");
        body["metadata"].as_object_mut().unwrap().remove("labels");
        s.update(stamp(2, 1), &body);
        assert_eq!(s.render(), body);
    }

    #[test]
    fn delete_wins_over_concurrent_update_and_a_new_incarnation_wins_over_both() {
        let base = ObjectState::create("u1".into(), stamp(1, 1), &deployment(2, "nginx"));
        let (mut a, mut b) = (base.clone(), base.clone());
        a.delete(stamp(2, 1));
        b.update(stamp(3, 2), &deployment(9, "nginx"));
        a.merge(&b);
        assert!(
            a.is_deleted(),
            "an update never resurrects a deleted incarnation"
        );
        let recreated = ObjectState::create("u2".into(), stamp(4, 1), &deployment(1, "redis"));
        let mut c = a.clone();
        c.merge(&recreated);
        assert_eq!(c.uid, "u2");
        assert!(!c.is_deleted());
        let mut d = recreated.clone();
        d.merge(&a);
        assert_eq!(c, d);
    }

    #[test]
    fn conflicting_shapes_resolve_by_stamp_order() {
        let base = ObjectState::create("u".into(), stamp(1, 1), &json!({"spec": {"a": 1}}));
        let (mut x, mut y) = (base.clone(), base.clone());
        x.update(stamp(2, 1), &json!({"spec": 7}));
        y.update(stamp(3, 2), &json!({"spec": {"a": 1, "b": 2}}));
        let mut xy = x.clone();
        xy.merge(&y);
        let mut yx = y.clone();
        yx.merge(&x);
        assert_eq!(xy.render(), yx.render());
        assert_eq!(
            xy.render(),
            json!({"spec": {"b": 2}}),
            "the later write's child survives"
        );
    }

    #[test]
    fn generation_counts_spec_writes() {
        let mut s = ObjectState::create("u".into(), stamp(1, 1), &deployment(2, "nginx"));
        assert_eq!(s.generation(), 1);
        s.update(stamp(2, 1), &deployment(3, "nginx"));
        assert_eq!(s.generation(), 2);
        let mut relabelled = deployment(3, "nginx");
        relabelled["metadata"]["labels"]["x"] = json!("y");
        s.update(stamp(3, 1), &relabelled);
        assert_eq!(
            s.generation(),
            2,
            "metadata changes do not bump the generation"
        );
    }

    /// One write replacing the fields of several earlier ones used to lower the generation (it
    /// counted the distinct stamps that survive); kubectl rollout status then saw an
    /// observedGeneration "ahead" of the object.
    #[test]
    fn generation_never_goes_down_when_one_write_overwrites_several() {
        let mut s = ObjectState::create("u".into(), stamp(1, 1), &deployment(2, "nginx"));
        s.update(stamp(2, 1), &deployment(3, "nginx"));
        s.update(stamp(3, 2), &deployment(3, "redis"));
        assert_eq!(s.generation(), 3);
        s.update(stamp(4, 1), &deployment(4, "httpd"));
        assert_eq!(s.generation(), 4, "was 1: one stamp left on spec");
    }

    #[test]
    fn concurrent_spec_writes_on_both_sides_both_count() {
        let base = ObjectState::create("u".into(), stamp(1, 1), &deployment(2, "nginx"));
        let (mut a, mut b) = (base.clone(), base.clone());
        a.update(stamp(2, 1), &deployment(3, "nginx"));
        b.update(stamp(2, 2), &deployment(2, "redis"));
        a.merge(&b);
        assert_eq!(a.generation(), 3);
    }

    /// A state stored before spec writes were counted (no `spec_writes`) keeps its generation,
    /// and the next spec write counts on from it, the same on every node.
    #[test]
    fn a_state_stored_before_the_counter_keeps_counting_from_its_old_generation() {
        let mut s = ObjectState::create("u".into(), stamp(1, 1), &deployment(2, "nginx"));
        s.update(stamp(2, 1), &deployment(3, "nginx"));
        s.update(stamp(3, 1), &deployment(3, "redis"));
        s.spec_writes = VClock::new();
        assert_eq!(s.generation(), 2, "distinct stamps left on spec, as before");
        let (mut a, mut b) = (s.clone(), s.clone());
        a.update(stamp(4, 1), &deployment(4, "redis"));
        b.update(stamp(4, 2), &deployment(3, "httpd"));
        assert_eq!((a.generation(), b.generation()), (3, 3));
        a.merge(&b);
        assert_eq!(a.generation(), 4);
    }

    /// The stored layout of registers is the one before `LWWReg`: (stamp, value) pairs.
    #[test]
    fn registers_keep_their_stored_layout() {
        #[derive(Serialize)]
        struct OldRegister {
            stamp: Stamp,
            value: Option<Value>,
        }
        #[derive(Serialize)]
        struct OldState {
            uid: String,
            created: Stamp,
            fields: BTreeMap<FieldPath, OldRegister>,
            deleted: Option<Stamp>,
        }
        let old = OldState {
            uid: "u".into(),
            created: stamp(1, 1),
            fields: [(
                vec!["spec".to_owned(), "replicas".to_owned()],
                OldRegister {
                    stamp: stamp(1, 1),
                    value: Some(json!(3)),
                },
            )]
            .into(),
            deleted: None,
        };
        let bytes = rmp_serde::to_vec(&old).unwrap();
        let state: ObjectState = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(state.render(), json!({"spec": {"replicas": 3}}));
        assert_eq!(state.generation(), 1);
        assert!(state.spec_writes.is_empty());
        let again = rmp_serde::to_vec(&state).unwrap();
        assert_eq!(
            &again[1..bytes.len()],
            &bytes[1..],
            "same layout, one field more"
        );
    }

    // ------------------------------------------------------------ merge laws

    #[derive(Debug, Clone)]
    enum Op {
        Update { replicas: u8, label: Option<u8> },
        Delete,
        Recreate,
        MergeFrom(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..4, proptest::option::of(0u8..3)).prop_map(|(replicas, label)| Op::Update { replicas, label }),
            1 => Just(Op::Delete),
            1 => Just(Op::Recreate),
            4 => (0usize..4).prop_map(Op::MergeFrom),
        ]
    }

    fn body(replicas: u8, label: Option<u8>) -> Value {
        let mut b =
            json!({"metadata": {"name": "x", "labels": {}}, "spec": {"replicas": replicas}});
        if let Some(l) = label {
            b["metadata"]["labels"][format!("l{l}")] = json!("v");
        }
        b
    }

    /// Runs `ops` (replica index, op) on 4 replicas starting from one object; returns them.
    fn run(ops: &[(usize, Op)]) -> Vec<ObjectState> {
        let base = ObjectState::create("u0".into(), stamp(1, 0), &body(1, None));
        let mut replicas = vec![base; 4];
        for (t, (i, op)) in ops.iter().enumerate() {
            let s = stamp(10 + t as u64, *i as u64);
            match op {
                Op::Update { replicas: r, label } => {
                    if !replicas[*i].is_deleted() {
                        replicas[*i].update(s, &body(*r, *label));
                    }
                }
                Op::Delete => replicas[*i].delete(s),
                Op::Recreate => {
                    if replicas[*i].is_deleted() {
                        replicas[*i] = ObjectState::create(format!("u{t}"), s, &body(0, None));
                    }
                }
                Op::MergeFrom(j) => {
                    let other = replicas[*j].clone();
                    replicas[*i].merge(&other);
                }
            }
        }
        replicas
    }

    fn merged(a: &ObjectState, b: &ObjectState) -> ObjectState {
        let mut m = a.clone();
        m.merge(b);
        m
    }

    proptest! {
        #[test]
        fn merge_is_commutative_associative_idempotent(ops in proptest::collection::vec((0usize..4, op()), 0..40)) {
            let r = run(&ops);
            let (a, b, c) = (&r[0], &r[1], &r[2]);
            prop_assert_eq!(merged(a, b).render(), merged(b, a).render());
            prop_assert_eq!(merged(a, b), merged(b, a));
            prop_assert_eq!(merged(&merged(a, b), c), merged(a, &merged(b, c)));
            prop_assert_eq!(merged(a, a), a.clone());
            prop_assert_eq!(merged(&merged(a, b), b), merged(a, b));
        }

        /// Within one incarnation, no update or merge lowers the generation, and every update
        /// that changes the spec raises it.
        #[test]
        fn generation_is_monotonic_within_an_incarnation(ops in proptest::collection::vec((0usize..4, op()), 0..40)) {
            let base = ObjectState::create("u0".into(), stamp(1, 0), &body(1, None));
            let mut replicas = vec![base; 4];
            for (t, (i, op)) in ops.iter().enumerate() {
                let before = (replicas[*i].uid.clone(), replicas[*i].generation());
                let spec_before = replicas[*i].render()["spec"].clone();
                let s = stamp(10 + t as u64, *i as u64);
                match op {
                    Op::Update { replicas: r, label } => { replicas[*i].update(s, &body(*r, *label)); }
                    Op::Delete => replicas[*i].delete(s),
                    Op::Recreate => if replicas[*i].is_deleted() {
                        replicas[*i] = ObjectState::create(format!("u{t}"), s, &body(0, None));
                    },
                    Op::MergeFrom(j) => { let other = replicas[*j].clone(); replicas[*i].merge(&other); }
                }
                let after = replicas[*i].generation();
                if replicas[*i].uid == before.0 {
                    prop_assert!(after >= before.1, "{op:?}: {} -> {after}", before.1);
                    if matches!(op, Op::Update { .. }) && replicas[*i].render()["spec"] != spec_before {
                        prop_assert!(after > before.1, "{op:?}: spec changed, generation stayed {after}");
                    }
                }
            }
        }

        #[test]
        fn replicas_converge_whatever_the_exchange_order(
            ops in proptest::collection::vec((0usize..4, op()), 0..40),
            order in Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
        ) {
            let r = run(&ops);
            let mut forward = r[order[0]].clone();
            for i in &order[1..] { forward.merge(&r[*i]); }
            let mut backward = r[order[3]].clone();
            for i in order[..3].iter().rev() { backward.merge(&r[*i]); }
            prop_assert_eq!(forward.render(), backward.render());
            prop_assert_eq!(forward, backward);
        }
    }
}
