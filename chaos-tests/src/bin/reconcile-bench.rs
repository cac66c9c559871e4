//! Reconcile cost of one controller pass on one agent: N ReplicaSets of R replicas in one
//! namespace (N × R pods, all bound, running and ready — the steady state, where a pass decides
//! nothing), held in a real store (`shoal_state::Store`, loaded in one merge) and run through
//! the code the agent's loop runs: `Snapshot::list` under the store lock, `Snapshot::from_listed`
//! (pod views with their gossiped statuses, grouped by owner) and `controllers::decide` with
//! this node owning every object (the worst case). Then one garbage-collection round over
//! the same store (what the agent runs every 2 s): `GarbageRead::of` under the store lock, then
//! `controllers::garbage_plan` with the lock released. Reports CPU
//! time and heap allocations; the pass runs at most once per `debounce` (50 ms) and at least
//! once per `resync` (1 s).
//!
//! Usage: cargo run --release -p shoal-chaos --bin reconcile-bench -- --replica-sets 1000 --replicas 10

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use clap::Parser;
use serde_json::{Value, json};
use shoal_core::controllers::{GarbageRead, Snapshot, decide, garbage_plan};
use shoal_state::{ObjectState, Stamp, Store, StoreConfig, WireEntry, hlc::Timestamp};

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
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

/// When the objects were written (ms since the epoch), and "now" for the pass.
const NOW_MS: u64 = 1_800_000_000_000;

fn replica_set(i: usize, replicas: usize) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": format!("web{i}"), "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": format!("web{i}")}},
            "template": {"metadata": {"labels": {"app": format!("web{i}")}},
                "spec": {"containers": [{"name": "web", "image": "shoal.local/httpd:1"}]}}}})
}

fn pod(rs: usize, j: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web{rs}-{j:05}"), "namespace": "default",
            "labels": {"app": format!("web{rs}")},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("web{rs}"), "uid": format!("rs{rs}"), "controller": true,
                "blockOwnerDeletion": true}]},
        "spec": {"nodeName": format!("n{}", j % 3),
            "containers": [{"name": "web", "image": "shoal.local/httpd:1"}]}})
}

/// The store's entry of `object` under `uid`, as a peer would send it.
fn entry(object: Value, uid: String) -> WireEntry {
    let valid = shoal_state::validate(object, "default").expect("a valid object");
    let stamp = Stamp {
        time: Timestamp::new(NOW_MS, 0),
        node: 1,
    };
    WireEntry {
        key: valid.key,
        state: ObjectState::create(uid, stamp, &valid.body),
    }
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
    let mut args = Args::parse();
    if args.smoke {
        args.replica_sets = 20;
        args.replicas = 3;
        args.passes = 2;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(StoreConfig::new(dir.path().join("state"), 1)).expect("store");
    let entries: Vec<WireEntry> = (0..args.replica_sets)
        .flat_map(|i| {
            std::iter::once(entry(replica_set(i, args.replicas), format!("rs{i}")))
                .chain((0..args.replicas).map(move |j| entry(pod(i, j), format!("p{i}-{j}"))))
        })
        .collect();
    let objects = entries.len();
    let outcome = store.merge_remote_at(entries, NOW_MS).expect("loaded");
    assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
    let status = json!({"phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]});
    let live = [1u64];
    let mut random = || 0u64;
    let mut quarantine = shoal_core::controllers::quarantine::Quarantine::new();
    let (mut list_cpu, mut views_cpu, mut decide_cpu, mut allocations, mut bytes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.passes {
        let (a0, b0) = (
            ALLOCATIONS.load(Ordering::Relaxed),
            ALLOCATED.load(Ordering::Relaxed),
        );
        let t0 = thread_cpu();
        let listed = Snapshot::list(&store);
        let t1 = thread_cpu();
        let snapshot = Snapshot::from_listed(listed, |_| Some(status.clone()));
        let t2 = thread_cpu();
        let actions = decide(&snapshot, &|_| true, NOW_MS, &mut random, &mut quarantine);
        let t3 = thread_cpu();
        assert!(
            actions.is_empty(),
            "the steady state needs no action: {actions:?}"
        );
        list_cpu.push(t1 - t0);
        views_cpu.push(t2 - t1);
        decide_cpu.push(t3 - t2);
        allocations.push((ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64);
        bytes.push((ALLOCATED.load(Ordering::Relaxed) - b0) as f64);
        drop(snapshot);
    }
    let (list, views, decided) = (median(list_cpu), median(views_cpu), median(decide_cpu));
    println!(
        "| ReplicaSets | pods | list (store lock held) | views built and grouped | decide | pass total | allocations per pass | bytes allocated per pass |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.0} | {:.1} MB |",
        args.replica_sets,
        args.replica_sets * args.replicas,
        list * 1e3,
        views * 1e3,
        decided * 1e3,
        (list + views + decided) * 1e3,
        median(allocations),
        median(bytes) / 1e6,
    );

    // One garbage collector round over the same store, this node owning every object and
    // every node alive: nothing to do, every dependent judged.
    let (mut locked, mut cpu, mut allocations) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.passes {
        let a0 = ALLOCATIONS.load(Ordering::Relaxed);
        let t0 = thread_cpu();
        let read = GarbageRead::of(&store);
        let t1 = thread_cpu();
        let plan = garbage_plan(&read, 1, &live, &|_| true, NOW_MS);
        locked.push(t1 - t0);
        cpu.push(thread_cpu() - t1);
        allocations.push((ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64);
        assert!(
            plan.dependents.is_empty() && plan.finishing.is_empty(),
            "nothing to collect"
        );
    }
    println!();
    println!(
        "| objects | garbage round: read (store lock held) | plan (lock released) | allocations per round |"
    );
    println!("|---|---|---|---|");
    println!(
        "| {objects} | {:.1} ms | {:.1} ms | {:.0} |",
        median(locked) * 1e3,
        median(cpu) * 1e3,
        median(allocations)
    );
}
