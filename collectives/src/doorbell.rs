//! A doorbell for threads of one process: a change counter, and a condition variable to
//! sleep on until it moves, rung by whoever makes a change a sleeper may wait for.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Instant;

use crate::transport::Readiness;

fn poisoned<T>(_: PoisonError<T>) -> io::Error {
    io::Error::other("a thread panicked while holding a doorbell's lock")
}

/// A change counter, and a condition variable to sleep on until it moves. A ring costs
/// one atomic add while nobody sleeps; the lock and the wake-up only when someone does.
#[derive(Default)]
pub(crate) struct Doorbell {
    rings: AtomicU64,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    rung: Condvar,
}

impl Doorbell {
    /// Called after the change it announces. Sequentially consistent with
    /// [`sleep_until_rung`](Self::sleep_until_rung): either the sleeper reads the new
    /// count before it sleeps, or this sees the sleeper and wakes it.
    pub(crate) fn ring(&self) {
        self.rings.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
            self.rung.notify_all();
        }
    }

    /// Sleeps until `ready` holds (`Ready`) or `deadline` passes (`TimedOut`). `ready` is
    /// asked after the count is read, so a change rung after that read always wakes us.
    pub(crate) fn sleep_until_rung(
        &self,
        deadline: Instant,
        mut ready: impl FnMut() -> io::Result<bool>,
    ) -> io::Result<Readiness> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let outcome = (|| loop {
            let seen = self.rings.load(Ordering::SeqCst);
            if ready()? {
                return Ok(Readiness::Ready);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Readiness::TimedOut);
            }
            let guard = self.lock.lock().map_err(poisoned)?;
            let _guard = self
                .rung
                .wait_timeout_while(guard, deadline - now, |()| {
                    self.rings.load(Ordering::SeqCst) == seen
                })
                .map_err(poisoned)?;
        })();
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        outcome
    }
}
