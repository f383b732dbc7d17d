//! What this rank is doing right now: its current op and the peer it is blocked on.
//! Written by the thread running the op, read by the control thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::wire::Algorithm;
use crate::OpDesc;

const NOBODY: usize = usize::MAX;

/// A copy of [`Activity`] at one moment, as sent to a peer that asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The op running now, and the schedule it runs.
    pub current: Option<(OpDesc, Algorithm)>,
    /// The peer the running op is waiting for, if it is waiting.
    pub blocked_on: Option<usize>,
}

/// What this rank is doing: cheap to update (an uncontended lock per op, an atomic store
/// per wait), safe to read from another thread.
///
/// ```
/// use ringccl_collectives::control::Activity;
/// use ringccl_collectives::{wire::Algorithm, OpDesc};
///
/// let activity = Activity::default();
/// activity.begin(OpDesc::barrier(3), Algorithm::Dissemination);
/// activity.blocked_on(1);
/// let now = activity.snapshot();
/// assert_eq!(now.current.map(|(op, _)| op.seq), Some(3));
/// assert_eq!(now.blocked_on, Some(1));
/// activity.end();
/// assert_eq!(activity.snapshot().current, None);
/// ```
#[derive(Debug)]
pub struct Activity {
    current: Mutex<Option<(OpDesc, Algorithm)>>,
    blocked_on: AtomicUsize,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            current: Mutex::new(None),
            blocked_on: AtomicUsize::new(NOBODY),
        }
    }
}

impl Activity {
    /// `op` starts, running `algorithm`.
    pub fn begin(&self, op: OpDesc, algorithm: Algorithm) {
        self.blocked_on.store(NOBODY, Ordering::Relaxed);
        // A poisoned lock still holds a plain value: keep using it.
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some((op, algorithm));
    }

    /// The running op is about to sleep until `peer` is ready.
    pub fn blocked_on(&self, peer: usize) {
        self.blocked_on.store(peer, Ordering::Relaxed);
    }

    /// The running op has ended (either way).
    pub fn end(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.blocked_on.store(NOBODY, Ordering::Relaxed);
    }

    /// What this rank is doing now.
    pub fn snapshot(&self) -> Snapshot {
        let current = *self.current.lock().unwrap_or_else(|p| p.into_inner());
        let blocked = self.blocked_on.load(Ordering::Relaxed);
        Snapshot {
            current,
            blocked_on: (current.is_some() && blocked != NOBODY).then_some(blocked),
        }
    }
}
