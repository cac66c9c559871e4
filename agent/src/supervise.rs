//! Supervision of the agent's long-lived tasks and threads (DESIGN.md §11, invariant 8): a
//! loop that panics is logged with its name and the panic, and started again after a back-off
//! (doubling from [`FIRST_RESTART`] to [`MAX_RESTART`], back to the first after a minute of
//! running), instead of leaving the node without its controllers, scheduler or kubelet while
//! the rest of the agent looks healthy. A loop that returns has finished (its source closed:
//! the agent is stopping) and is not restarted.
//!
//! Objects that make one reconcile fail are handled closer to the decision
//! ([`shoal_core::controllers::quarantine`]); this is the net under everything else.

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::error;

use shoal_core::controllers::quarantine::panic_message;

/// The first wait before a panicked loop starts again.
pub const FIRST_RESTART: Duration = Duration::from_millis(100);
/// The longest wait between two restarts.
pub const MAX_RESTART: Duration = Duration::from_secs(30);
/// A loop that ran this long before it panicked starts again after [`FIRST_RESTART`].
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// The wait before the next start, after a run of `ran` that panicked following `previous`.
fn next_wait(previous: Option<Duration>, ran: Duration) -> Duration {
    match previous {
        Some(wait) if ran < HEALTHY_RUN => (wait * 2).min(MAX_RESTART),
        _ => FIRST_RESTART,
    }
}

/// A task aborted when its handle is dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Spawns the task `start` makes, and again whenever it panics. Aborting the returned handle
/// aborts the task too.
pub fn spawn<F, Fut>(name: &'static str, start: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut wait = None;
        loop {
            let began = Instant::now();
            // Aborting the supervisor (a component stopping) aborts the run it watches too.
            let mut run = AbortOnDrop(tokio::spawn(start()));
            let result = (&mut run.0).await;
            match result {
                Ok(()) => return,
                Err(e) if e.is_panic() => {
                    let next = next_wait(wait, began.elapsed());
                    error!(
                        task = name,
                        panic = %panic_message(e.into_panic().as_ref()),
                        restart_in = ?next,
                        "task panicked: restarting it"
                    );
                    wait = Some(next);
                    tokio::time::sleep(next).await;
                }
                // Cancelled: the runtime is shutting down.
                Err(_) => return,
            }
        }
    })
}

/// A receiver kept across the restarts of the loop that owns it ([`spawn_receiving`]).
pub type Held<R> = std::sync::Arc<tokio::sync::Mutex<R>>;

/// Spawns a loop that owns a receiver (a subscription to the store's change feed, a channel's
/// incoming frames or requests), supervised as [`spawn`] does. The receiver outlives a run that
/// panics (a tokio mutex is not poisoned: the panicking run's guard is dropped as it unwinds),
/// so the next run goes on with the messages that queued meanwhile, having lost only the one it
/// was handling; it is told it was `restarted`, and must then reload whatever it derives from
/// the messages (what the lost one would have changed).
pub fn spawn_receiving<R, F, Fut>(
    name: &'static str,
    receiver: R,
    run: F,
) -> tokio::task::JoinHandle<()>
where
    R: Send + 'static,
    F: Fn(Held<R>, bool) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let held: Held<R> = std::sync::Arc::new(tokio::sync::Mutex::new(receiver));
    let started = std::sync::atomic::AtomicBool::new(false);
    spawn(name, move || {
        let restarted = started.swap(true, std::sync::atomic::Ordering::SeqCst);
        run(held.clone(), restarted)
    })
}

/// Runs `body` on a thread named `name`, again whenever it panics (for loops that block:
/// the kubelet's runtime calls).
pub fn spawn_thread<F>(name: &'static str, body: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: Fn() + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut wait = None;
            loop {
                let began = Instant::now();
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&body)) {
                    Ok(()) => return,
                    Err(payload) => {
                        let next = next_wait(wait, began.elapsed());
                        error!(
                            thread = name,
                            panic = %panic_message(payload.as_ref()),
                            restart_in = ?next,
                            "thread panicked: restarting it"
                        );
                        wait = Some(next);
                        std::thread::sleep(next);
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn restarts_back_off_and_reset_after_a_healthy_run() {
        let w = next_wait(None, Duration::ZERO);
        assert_eq!(w, FIRST_RESTART);
        let w = next_wait(Some(w), Duration::from_secs(1));
        assert_eq!(w, FIRST_RESTART * 2);
        assert_eq!(
            next_wait(Some(MAX_RESTART), Duration::from_secs(1)),
            MAX_RESTART
        );
        assert_eq!(next_wait(Some(MAX_RESTART), HEALTHY_RUN), FIRST_RESTART);
    }

    /// A task that panics is started again; one that returns is not.
    #[tokio::test]
    async fn a_panicked_task_starts_again() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        spawn("test", move || {
            let runs = counted.clone();
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("poison");
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    /// A loop that panics on one message goes on with the next from the same receiver, told
    /// it was restarted; it ends when the receiver closes.
    #[tokio::test]
    async fn a_receiving_loop_keeps_its_receiver_across_a_panic() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = seen.clone();
        for n in [1, 2, 3, 4] {
            tx.send(n).unwrap();
        }
        drop(tx);
        spawn_receiving("test", rx, move |rx, restarted| {
            let seen = recorded.clone();
            async move {
                let mut rx = rx.lock().await;
                seen.lock().unwrap().push(if restarted { 100 } else { 0 });
                while let Some(n) = rx.recv().await {
                    assert_ne!(n, 2, "a poison message");
                    seen.lock().unwrap().push(n);
                }
            }
        })
        .await
        .unwrap();
        // Message 2 was lost with the run that panicked on it; 3 and 4 were not.
        assert_eq!(*seen.lock().unwrap(), [0, 1, 100, 3, 4]);
    }

    #[test]
    fn a_panicked_thread_starts_again() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        spawn_thread("test", move || {
            if counted.fetch_add(1, Ordering::SeqCst) < 1 {
                panic!("poison");
            }
        })
        .unwrap()
        .join()
        .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
