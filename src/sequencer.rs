//! Issue order: every operation of a process group, synchronous or asynchronous, runs in
//! the order it was issued, because every rank must run the same operations in the same
//! order.

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct Counters {
    next_ticket: u64,
    now_serving: u64,
}

/// A ticket lock: `issue` hands out tickets in order, `turn` waits for a ticket's turn.
#[derive(Debug, Default)]
pub(crate) struct Sequencer {
    counters: Mutex<Counters>,
    turn_changed: Condvar,
}

/// Holding this means it is this ticket's turn; dropping it passes the turn on.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    sequencer: &'a Sequencer,
}

impl Sequencer {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        // The counters are plain integers updated in one step: a poisoned lock still
        // holds consistent values.
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the next ticket and, while no other ticket can be taken, calls `enqueue`
    /// with it (so tickets reach the worker's queue in ticket order).
    pub(crate) fn issue<R>(&self, enqueue: impl FnOnce(u64) -> R) -> R {
        let mut counters = self.lock();
        let ticket = counters.next_ticket;
        counters.next_ticket += 1;
        enqueue(ticket)
    }

    /// Blocks until every earlier ticket has finished. Earlier operations end by their
    /// own deadlines, so this wait is bounded by theirs.
    pub(crate) fn turn(&self, ticket: u64) -> Turn<'_> {
        let mut counters = self.lock();
        while counters.now_serving != ticket {
            counters = self
                .turn_changed
                .wait(counters)
                .unwrap_or_else(|p| p.into_inner());
        }
        Turn { sequencer: self }
    }

    /// Passes over a ticket that will never run (its job could not be queued).
    pub(crate) fn skip(&self, ticket: u64) {
        drop(self.turn(ticket));
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut counters = self.sequencer.lock();
        counters.now_serving += 1;
        drop(counters);
        self.sequencer.turn_changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn turns_follow_ticket_order_across_threads() {
        let seq = Arc::new(Sequencer::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        let tickets: Vec<u64> = (0..8).map(|_| seq.issue(|t| t)).collect();
        let handles: Vec<_> = tickets
            .into_iter()
            .rev()
            .map(|t| {
                let (seq, log) = (Arc::clone(&seq), Arc::clone(&log));
                std::thread::spawn(move || {
                    let _turn = seq.turn(t);
                    log.lock().unwrap().push(t);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*log.lock().unwrap(), (0..8).collect::<Vec<_>>());
    }
}
