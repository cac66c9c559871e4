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
//! A pod's **binding** (`spec.nodeName` and the `shoal.io/binding-epoch` annotation) is one
//! register in effect (DESIGN.md §6): both fields are written together, ordered by the binding's
//! epoch first and the write's stamp second, so a binding of an older epoch never wins over a
//! newer one, however late it is written or merged; within one epoch the later stamp wins.
//!
//! The parts are the `crdts` crate's CvRDTs, merged through its `CvRDT` trait: each register is
//! an `LWWReg` whose marker is a [`Marker`] (the binding epoch, 0 for every other field, then the
//! write's [`Stamp`]), and `metadata.generation` is a grow-only counter of spec writes per node (a
//! `VClock`, so it never goes down).

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

/// The annotation that carries a pod binding's epoch (raised each time the pod is auctioned
/// again).
pub const BINDING_EPOCH_ANNOTATION: &str = "shoal.io/binding-epoch";

/// What orders the writes of one register: the binding epoch (always 0 outside a pod's binding
/// fields), then the write's stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Marker {
    pub epoch: u64,
    pub stamp: Stamp,
}

impl Marker {
    fn plain(stamp: Stamp) -> Self {
        Self { epoch: 0, stamp }
    }
}

/// One last-writer-wins register: the value (`None` records that the field was removed) and the
/// marker of the write that set it.
pub type Register = LWWReg<Option<Value>, Marker>;

fn register(marker: Marker, val: Option<Value>) -> Register {
    LWWReg { val, marker }
}

/// Whether `path` is one of a pod's binding fields.
fn is_binding(path: &[String]) -> bool {
    match path {
        [spec, node] => spec == "spec" && node == "nodeName",
        [meta, annotations, key] => {
            meta == "metadata" && annotations == "annotations" && key == BINDING_EPOCH_ANNOTATION
        }
        _ => false,
    }
}

fn binding_paths() -> [FieldPath; 2] {
    [
        vec!["spec".to_owned(), "nodeName".to_owned()],
        vec![
            "metadata".to_owned(),
            "annotations".to_owned(),
            BINDING_EPOCH_ANNOTATION.to_owned(),
        ],
    ]
}

/// The binding epoch a written body carries: its epoch annotation, for a pod (0 when absent or
/// not a number: such a write can only lose to a real binding).
pub fn binding_epoch(body: &Value) -> u64 {
    if body["kind"] != "Pod" {
        return 0;
    }
    body["metadata"]["annotations"][BINDING_EPOCH_ANNOTATION]
        .as_str()
        .and_then(|e| e.parse().ok())
        .unwrap_or(0)
}

/// The marker a write stamped `stamp` of `body` (binding epoch `epoch`) gives `path`.
fn marker_for(path: &[String], epoch: u64, stamp: Stamp) -> Marker {
    if is_binding(path) {
        Marker { epoch, stamp }
    } else {
        Marker::plain(stamp)
    }
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

/// Registers are stored and sent as `(stamp, value)` pairs, the layout of the register type
/// before it was `crdts::LWWReg`, so stores written by earlier versions read unchanged; a
/// binding field with an epoch above 0 is a `(stamp, value, epoch)` triple.
mod registers {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::de::{self, SeqAccess, Visitor};
    use serde::ser::SerializeTuple;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    use super::{FieldPath, Marker, Register, Stamp};

    struct Entry<'a>(&'a Register);

    impl Serialize for Entry<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let r = self.0;
            let len = if r.marker.epoch == 0 { 2 } else { 3 };
            let mut tuple = serializer.serialize_tuple(len)?;
            tuple.serialize_element(&r.marker.stamp)?;
            tuple.serialize_element(&r.val)?;
            if r.marker.epoch != 0 {
                tuple.serialize_element(&r.marker.epoch)?;
            }
            tuple.end()
        }
    }

    struct Stored(Register);

    impl<'de> Deserialize<'de> for Stored {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct EntryVisitor;
            impl<'de> Visitor<'de> for EntryVisitor {
                type Value = Stored;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a register: (stamp, value) or (stamp, value, epoch)")
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Stored, A::Error> {
                    let stamp: Stamp = seq
                        .next_element()?
                        .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                    let val: Option<Value> = seq
                        .next_element()?
                        .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                    let epoch: u64 = seq.next_element()?.unwrap_or(0);
                    Ok(Stored(super::register(Marker { epoch, stamp }, val)))
                }
            }
            deserializer.deserialize_seq(EntryVisitor)
        }
    }

    pub fn serialize<S: Serializer>(
        fields: &BTreeMap<FieldPath, Register>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(fields.iter().map(|(path, r)| (path, Entry(r))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<FieldPath, Register>, D::Error> {
        let entries = BTreeMap::<FieldPath, Stored>::deserialize(deserializer)?;
        Ok(entries
            .into_iter()
            .map(|(path, Stored(r))| (path, r))
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
        let epoch = binding_epoch(body);
        let fields = flatten(body)
            .into_iter()
            .map(|(path, value)| {
                let marker = marker_for(&path, epoch, stamp);
                (path, register(marker, Some(value)))
            })
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

    /// Replaces the object's body with `body`, writing only the registers that change. A
    /// change that loses to the stored register (a binding field written with an older epoch
    /// than the stored binding's) is not made, exactly as a merge would undo it. Returns whether
    /// anything changed.
    pub fn update(&mut self, stamp: Stamp, body: &Value) -> bool {
        let current = flatten(&self.render());
        let new = flatten(body);
        let generation = self.generation();
        let epoch = binding_epoch(body);
        let mut changed: Vec<(FieldPath, Option<Value>)> = Vec::new();
        for (path, value) in &new {
            if current.get(path) != Some(value) {
                changed.push((path.clone(), Some(value.clone())));
            }
        }
        for path in current.keys().filter(|p| !new.contains_key(*p)) {
            changed.push((path.clone(), None));
        }
        if body["kind"] == "Pod" && changed.iter().any(|(p, _)| is_binding(p)) {
            // The binding's fields are written together, so they always hold one write's pair.
            for path in binding_paths() {
                if !changed.iter().any(|(p, _)| *p == path) {
                    let value = new.get(&path).cloned();
                    changed.push((path, value));
                }
            }
            let marker = Marker { epoch, stamp };
            let stored = binding_paths()
                .iter()
                .filter_map(|p| self.fields.get(p).map(|r| r.marker))
                .max();
            if stored.is_some_and(|m| m >= marker) {
                changed.retain(|(p, _)| !is_binding(p));
            }
        }
        changed.retain(|(path, _)| {
            let marker = marker_for(path, epoch, stamp);
            self.fields.get(path).is_none_or(|r| marker > r.marker)
        });
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
            let marker = marker_for(&path, epoch, stamp);
            self.fields.insert(path, register(marker, value));
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
            .map(|(_, r)| r.marker.stamp)
            .collect();
        stamps.sort();
        stamps.dedup();
        stamps.len().max(1) as u64
    }

    /// The latest stamp anywhere in this state.
    pub fn max_stamp(&self) -> Stamp {
        self.fields
            .values()
            .map(|r| r.marker.stamp)
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

    fn bound_pod(node: Option<&str>, epoch: u64) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "default",
                            "annotations": {BINDING_EPOCH_ANNOTATION: epoch.to_string()}},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        if let Some(node) = node {
            pod["spec"]["nodeName"] = json!(node);
        }
        pod
    }

    fn binding_of(state: &ObjectState) -> (Option<String>, String) {
        let body = state.render();
        (
            body["spec"]["nodeName"].as_str().map(str::to_owned),
            body["metadata"]["annotations"][BINDING_EPOCH_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    }

    /// The hole of two registers: a rebind at epoch 1 written after an unbind at epoch 2 took
    /// `spec.nodeName` by its later stamp while the epoch annotation kept 2 (node b, epoch 2: a
    /// binding nobody wrote). As one register ordered by epoch first, the epoch-2 write wins
    /// both fields in every merge order.
    #[test]
    fn a_binding_of_an_older_epoch_never_wins_however_late_it_is_written() {
        let base = ObjectState::create("u".into(), stamp(1, 1), &bound_pod(Some("a"), 1));
        let (mut unbound, mut rebound) = (base.clone(), base.clone());
        assert!(unbound.update(stamp(5, 2), &bound_pod(None, 2)));
        assert!(rebound.update(stamp(9, 3), &bound_pod(Some("b"), 1)));
        let mut ab = unbound.clone();
        ab.merge(&rebound);
        let mut ba = rebound.clone();
        ba.merge(&unbound);
        assert_eq!(ab, ba);
        assert_eq!(binding_of(&ab), (None, "2".to_owned()));
        // Within one epoch the later write wins, both fields together.
        let mut same = base.clone();
        assert!(same.update(stamp(3, 2), &bound_pod(Some("c"), 1)));
        let mut merged = rebound.clone();
        merged.merge(&same);
        assert_eq!(binding_of(&merged), (Some("b".to_owned()), "1".to_owned()));
    }

    /// A local write of an older epoch is not made (a merge would undo it on every replica), and
    /// a body without the binding (a user's PUT of what they read before the pod was bound) does
    /// not unbind it; every other field of such a write is.
    #[test]
    fn a_write_of_an_older_binding_leaves_the_binding_alone() {
        let mut state = ObjectState::create("u".into(), stamp(1, 1), &bound_pod(Some("a"), 3));
        assert!(!state.update(stamp(2, 1), &bound_pod(Some("b"), 2)));
        assert_eq!(binding_of(&state), (Some("a".to_owned()), "3".to_owned()));
        let mut unbound_read = bound_pod(None, 0);
        unbound_read["metadata"]["annotations"] = json!({"team": "x"});
        assert!(state.update(stamp(3, 1), &unbound_read));
        assert_eq!(binding_of(&state), (Some("a".to_owned()), "3".to_owned()));
        assert_eq!(state.render()["metadata"]["annotations"]["team"], "x");
        // Not a pod: the annotation is an ordinary field.
        let mut cm = json!({"kind": "ConfigMap", "metadata": {"annotations": {BINDING_EPOCH_ANNOTATION: "7"}}});
        let mut other = ObjectState::create("v".into(), stamp(1, 1), &cm);
        cm["metadata"]["annotations"][BINDING_EPOCH_ANNOTATION] = json!("1");
        assert!(other.update(stamp(2, 1), &cm));
    }

    #[test]
    fn a_binding_register_keeps_its_epoch_on_disk() {
        let state = ObjectState::create("u".into(), stamp(1, 1), &bound_pod(Some("a"), 4));
        let bytes = rmp_serde::to_vec(&state).unwrap();
        let back: ObjectState = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, state);
        let node = &back.fields[&vec!["spec".to_owned(), "nodeName".to_owned()]];
        assert_eq!(node.marker.epoch, 4);
        let image = &back.fields[&vec!["spec".to_owned(), "containers".to_owned()]];
        assert_eq!(image.marker.epoch, 0);
    }

    // ------------------------------------------------------------ merge laws

    #[derive(Debug, Clone)]
    enum Op {
        Update { replicas: u8, label: Option<u8> },
        Bind { node: u8, epoch: u8 },
        Delete,
        Recreate,
        MergeFrom(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..4, proptest::option::of(0u8..3)).prop_map(|(replicas, label)| Op::Update { replicas, label }),
            3 => (0u8..3, 0u8..4).prop_map(|(node, epoch)| Op::Bind { node, epoch }),
            1 => Just(Op::Delete),
            1 => Just(Op::Recreate),
            4 => (0usize..4).prop_map(Op::MergeFrom),
        ]
    }

    fn body(replicas: u8, label: Option<u8>) -> Value {
        let mut b = json!({"kind": "Pod", "metadata": {"name": "x", "labels": {}}, "spec": {"replicas": replicas}});
        if let Some(l) = label {
            b["metadata"]["labels"][format!("l{l}")] = json!("v");
        }
        b
    }

    /// What a replica holding `state` writes to bind the pod to `node` at `epoch`.
    fn bind_body(state: &ObjectState, node: u8, epoch: u8) -> Value {
        let mut b = state.render();
        b["spec"]["nodeName"] = json!(format!("n{node}"));
        b["metadata"]["annotations"][BINDING_EPOCH_ANNOTATION] = json!(epoch.to_string());
        b
    }

    fn apply(replicas: &mut [ObjectState], t: usize, i: usize, op: &Op) {
        let s = stamp(10 + t as u64, i as u64);
        match op {
            Op::Update { replicas: r, label } => {
                if !replicas[i].is_deleted() {
                    replicas[i].update(s, &body(*r, *label));
                }
            }
            Op::Bind { node, epoch } => {
                if !replicas[i].is_deleted() {
                    let b = bind_body(&replicas[i], *node, *epoch);
                    replicas[i].update(s, &b);
                }
            }
            Op::Delete => replicas[i].delete(s),
            Op::Recreate => {
                if replicas[i].is_deleted() {
                    replicas[i] = ObjectState::create(format!("u{t}"), s, &body(0, None));
                }
            }
            Op::MergeFrom(j) => {
                let other = replicas[*j].clone();
                replicas[i].merge(&other);
            }
        }
    }

    /// Runs `ops` (replica index, op) on 4 replicas starting from one object; returns them.
    fn run(ops: &[(usize, Op)]) -> Vec<ObjectState> {
        let base = ObjectState::create("u0".into(), stamp(1, 0), &body(1, None));
        let mut replicas = vec![base; 4];
        for (t, (i, op)) in ops.iter().enumerate() {
            apply(&mut replicas, t, *i, op);
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
                apply(&mut replicas, t, *i, op);
                let after = replicas[*i].generation();
                if replicas[*i].uid == before.0 {
                    prop_assert!(after >= before.1, "{op:?}: {} -> {after}", before.1);
                    if matches!(op, Op::Update { .. } | Op::Bind { .. }) && replicas[*i].render()["spec"] != spec_before {
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

        /// Once every replica has merged every other, the binding is the one written bind with
        /// the highest (epoch, stamp), whoever wrote what when (one incarnation; binds at epoch
        /// 1+, which plain updates cannot undo; a bind that changed nothing wrote nothing).
        #[test]
        fn the_converged_binding_is_the_highest_epoch_then_the_latest(
            ops in proptest::collection::vec((0usize..4, op()), 0..40),
        ) {
            let base = ObjectState::create("u0".into(), stamp(1, 0), &body(1, None));
            let mut replicas = vec![base; 4];
            let mut best = None;
            for (t, (i, op)) in ops.iter().enumerate() {
                match op {
                    Op::Delete | Op::Recreate => {}
                    Op::Bind { node, epoch } => {
                        let b = bind_body(&replicas[*i], *node, epoch + 1);
                        if replicas[*i].update(stamp(10 + t as u64, *i as u64), &b) {
                            best = best.max(Some(((epoch + 1, t), *node)));
                        }
                    }
                    op => apply(&mut replicas, t, *i, op),
                }
            }
            let mut all = replicas[0].clone();
            for other in &replicas[1..] { all.merge(other); }
            let (node, epoch) = binding_of(&all);
            match best {
                Some(((e, _), n)) => {
                    prop_assert_eq!(node, Some(format!("n{n}")));
                    prop_assert_eq!(epoch, e.to_string());
                }
                None => prop_assert_eq!(node, None),
            }
        }
    }
}
