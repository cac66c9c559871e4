//! Reconcile cost of one controller pass on one agent: N ReplicaSets of R replicas in one
//! namespace (N × R pods, all bound, running and ready — the steady state, where a pass decides
//! nothing) run through the same pure `replica_set::reconcile` the agent's loop calls, on the
//! same candidates (`Snapshot::replica_set_candidates`: its own pods and the orphans), after
//! building the pods' views from their JSON objects and gossiped statuses and grouping them as
//! `Snapshot::read` does. Reports CPU time and heap allocations per pass; the pass runs at most once per
//! `debounce` (50 ms) and at least once per `resync` (1 s).
//!
//! Usage: cargo run --release -p shoal-chaos --bin reconcile-bench -- --replica-sets 1000 --replicas 10

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use clap::Parser;
use serde_json::{Value, json};
use shoal_agent::controllers::workload::PodView;
use shoal_agent::controllers::{Snapshot, garbage, replica_set};

/// The system allocator, counting allocations.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed on as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    replica_sets: usize,
    #[arg(long, default_value_t = 10)]
    replicas: usize,
    /// Passes measured (medians reported).
    #[arg(long, default_value_t = 20)]
    passes: usize,
}

fn replica_set(i: usize, replicas: usize) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": format!("web{i}"), "namespace": "default", "uid": format!("rs{i}"),
            "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": format!("web{i}")}},
            "template": {"metadata": {"labels": {"app": format!("web{i}")}},
                "spec": {"containers": [{"name": "web", "image": "shoal.local/httpd:1"}]}}}})
}

fn pod(rs: usize, j: usize) -> (Value, Value) {
    let object = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web{rs}-{j:05}"), "namespace": "default",
            "uid": format!("p{rs}-{j}"), "labels": {"app": format!("web{rs}")},
            "creationTimestamp": "2026-01-01T00:00:01Z",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("web{rs}"), "uid": format!("rs{rs}"), "controller": true}]},
        "spec": {"nodeName": format!("n{}", j % 3),
            "containers": [{"name": "web", "image": "shoal.local/httpd:1"}]}});
    let status = json!({"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]});
    (object, status)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// CPU time of this thread, in seconds.
fn thread_cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "the thread CPU clock exists on Linux");
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn main() {
    let args = Args::parse();
    let sets: Vec<Value> = (0..args.replica_sets)
        .map(|i| replica_set(i, args.replicas))
        .collect();
    let pods: Vec<(Value, Value)> = (0..args.replica_sets)
        .flat_map(|i| (0..args.replicas).map(move |j| pod(i, j)))
        .collect();
    let mut random = || 0u64;
    let (mut views_cpu, mut reconcile_cpu, mut allocations, mut bytes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut decided = 0;
    for _ in 0..args.passes {
        // What the store's list hands over (its copy is the store's cost, not the pass's).
        let (listed, listed_sets): (Vec<(Value, Value)>, Vec<Value>) = (pods.clone(), sets.clone());
        let (a0, b0) = (
            ALLOCATIONS.load(Ordering::Relaxed),
            ALLOCATED.load(Ordering::Relaxed),
        );
        let t0 = thread_cpu();
        let views: Vec<PodView> = listed
            .into_iter()
            .map(|(object, status)| PodView::from_object(object, Some(&status)))
            .collect();
        let snapshot = Snapshot {
            deployments: Vec::new(),
            replica_sets: listed_sets,
            jobs: Vec::new(),
            cron_jobs: Vec::new(),
            autoscalers: Vec::new(),
            pods: Snapshot::group(views),
        };
        let t1 = thread_cpu();
        let mut actions = 0;
        for rs in &snapshot.replica_sets {
            actions +=
                replica_set::reconcile(rs, snapshot.replica_set_candidates(rs), &mut random).len();
        }
        let t2 = thread_cpu();
        views_cpu.push(t1 - t0);
        reconcile_cpu.push(t2 - t1);
        allocations.push((ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64);
        bytes.push((ALLOCATED.load(Ordering::Relaxed) - b0) as f64);
        decided = actions;
        drop(snapshot);
    }
    assert_eq!(decided, 0, "the steady state needs no action");
    let (views, reconcile) = (median(views_cpu), median(reconcile_cpu));
    println!(
        "| ReplicaSets | pods | pod views built and grouped (CPU) | reconcile of every ReplicaSet (CPU) | pass total (CPU) | allocations per pass | bytes allocated per pass |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.0} | {:.1} MB |",
        args.replica_sets,
        pods.len(),
        views * 1e3,
        reconcile * 1e3,
        (views + reconcile) * 1e3,
        median(allocations),
        median(bytes) / 1e6,
    );
    garbage_round(&sets, &pods, args.passes);
}

/// One garbage collector round ([`garbage::plan`], what the agent runs every 2 s) over the same
/// objects, with this node owning every one (the worst case) and every owner alive: nothing to
/// do, every dependent judged. The store's listing and copying of the objects, done under its
/// lock before the round, is not included.
fn garbage_round(sets: &[Value], pods: &[(Value, Value)], passes: usize) {
    let rs_kind = shoal_state::kind::lookup("apps/v1", "ReplicaSet").expect("a stored kind");
    let pod_kind = shoal_state::kind::lookup("v1", "Pod").expect("a stored kind");
    let key = |kind, o: &Value| {
        shoal_state::ObjectKey::new(
            kind,
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or(""),
        )
    };
    let by_key: std::collections::HashMap<shoal_state::ObjectKey, Value> = sets
        .iter()
        .map(|rs| (key(rs_kind, rs), rs.clone()))
        .collect();
    let objects: Vec<(shoal_state::ObjectKey, Value)> = sets
        .iter()
        .map(|rs| (key(rs_kind, rs), rs.clone()))
        .chain(pods.iter().map(|(p, _)| {
            let mut p = p.clone();
            p["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(true);
            (key(pod_kind, &p), p)
        }))
        .collect();
    let stored = |k: &shoal_state::ObjectKey| (by_key.get(k).cloned(), None);
    let (mut cpu, mut allocations) = (Vec::new(), Vec::new());
    for _ in 0..passes {
        let a0 = ALLOCATIONS.load(Ordering::Relaxed);
        let t0 = thread_cpu();
        let plan = garbage::plan(
            &objects,
            &garbage::Round {
                stored: &stored,
                mine: &|_| true,
                alive: &|_| true,
                synced_ms: 0,
                now_ms: 1_800_000_000_000,
            },
        );
        cpu.push(thread_cpu() - t0);
        allocations.push((ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64);
        assert!(
            plan.dependents.is_empty() && plan.finishing.is_empty(),
            "nothing to collect"
        );
    }
    println!();
    println!("| objects | garbage round (CPU) | allocations per round |");
    println!("|---|---|---|");
    println!(
        "| {} | {:.1} ms | {:.0} |",
        objects.len(),
        median(cpu) * 1e3,
        median(allocations)
    );
}
