//! Every benchmark binary still runs: each at its `--smoke` size (toy sizes, a few seconds),
//! which must exit 0 and print its report. No figure is checked: benchmarks measure, tests
//! do not time (issue #41: a benchmark that no longer runs is found here, not when its
//! figures are next needed). Some benchmarks start agents, containers or network namespaces:
//! root, as the other tests of this crate.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A smoke run is seconds; this only keeps a hung benchmark from hanging CI.
const LIMIT: Duration = Duration::from_secs(300);

/// Runs `binary --smoke`, and checks it exits 0 and its report contains `marker`.
fn smoke(binary: &str, marker: &str) {
    let mut child = Command::new(binary)
        .arg("--smoke")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{binary}: {e}"));
    // Drain both pipes while waiting, so a chatty benchmark cannot block on a full pipe.
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().expect("reader"), err.join().expect("reader"));
    let status = status.unwrap_or_else(|| {
        panic!("{binary} --smoke still running after {LIMIT:?}\nstdout:\n{out}\nstderr:\n{err}")
    });
    assert!(
        status.success() && out.contains(marker),
        "{binary} --smoke: {status}, report without {marker:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
}

#[test]
fn pull_bench() {
    smoke(env!("CARGO_BIN_EXE_pull-bench"), "Peak RSS");
}

#[test]
fn scheduling_bench() {
    smoke(
        env!("CARGO_BIN_EXE_scheduling-bench"),
        "placements per CPU second",
    );
}

#[test]
fn reconcile_bench() {
    smoke(env!("CARGO_BIN_EXE_reconcile-bench"), "| ReplicaSets |");
}

#[test]
fn runtime_bench() {
    smoke(env!("CARGO_BIN_EXE_runtime-bench"), "apply → Running");
}

#[test]
fn stream_bench() {
    smoke(env!("CARGO_BIN_EXE_stream-bench"), "exec round trip");
}

#[test]
fn state_bench() {
    smoke(env!("CARGO_BIN_EXE_state-bench"), "Write latency");
}

#[test]
fn api_flood_bench() {
    smoke(env!("CARGO_BIN_EXE_api-flood-bench"), "| phase |");
}

#[test]
fn membership_bench() {
    smoke(env!("CARGO_BIN_EXE_membership-bench"), "|");
}

#[test]
fn net_bench() {
    smoke(env!("CARGO_BIN_EXE_net-bench"), "DNS");
}

#[test]
fn chaos_bench() {
    smoke(env!("CARGO_BIN_EXE_chaos-bench"), "| scenario |");
}
