//! The running call's live counters: bytes moved with each peer so far and the peer it
//! waits for. Written by the one thread that runs the group's calls (the executor's),
//! read at any moment by a dump: relaxed atomics, each updated by a plain load and store
//! (one writer, so no read-modify-write instruction is needed).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::ring::{PeerCount, PeerCounts, PEER_SLOTS};

const NOBODY: usize = usize::MAX;

#[derive(Debug, Default)]
struct PeerCell {
    /// The peer's rank + 1; 0 while the cell is free.
    key: AtomicUsize,
    sent: AtomicU64,
    received: AtomicU64,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct LiveCall {
    cells: [PeerCell; PEER_SLOTS],
    others_sent: AtomicU64,
    others_received: AtomicU64,
    blocked_on: AtomicUsize,
}

impl Default for LiveCall {
    fn default() -> LiveCall {
        LiveCall {
            cells: Default::default(),
            others_sent: AtomicU64::new(0),
            others_received: AtomicU64::new(0),
            blocked_on: AtomicUsize::new(NOBODY),
        }
    }
}

#[inline]
fn add(counter: &AtomicU64, n: usize) {
    counter.store(counter.load(Relaxed).wrapping_add(n as u64), Relaxed);
}

impl LiveCall {
    /// A new call starts: nothing moved, waiting for nobody.
    pub(crate) fn reset(&self) {
        for cell in &self.cells {
            if cell.key.load(Relaxed) == 0 {
                break;
            }
            cell.key.store(0, Relaxed);
            cell.sent.store(0, Relaxed);
            cell.received.store(0, Relaxed);
        }
        self.others_sent.store(0, Relaxed);
        self.others_received.store(0, Relaxed);
        self.blocked_on.store(NOBODY, Relaxed);
    }

    /// The cell of `peer`, taking a free one on first use; `None` once all are taken.
    #[inline]
    fn cell(&self, peer: usize) -> Option<&PeerCell> {
        let key = peer.wrapping_add(1);
        for cell in &self.cells {
            match cell.key.load(Relaxed) {
                k if k == key => return Some(cell),
                0 => {
                    cell.key.store(key, Relaxed);
                    return Some(cell);
                }
                _ => {}
            }
        }
        None
    }

    /// `n` more bytes went to `peer`.
    #[inline]
    pub(crate) fn sent(&self, peer: usize, n: usize) {
        match self.cell(peer) {
            Some(cell) => add(&cell.sent, n),
            None => add(&self.others_sent, n),
        }
    }

    /// `n` more bytes came from `peer`.
    #[inline]
    pub(crate) fn received(&self, peer: usize, n: usize) {
        match self.cell(peer) {
            Some(cell) => add(&cell.received, n),
            None => add(&self.others_received, n),
        }
    }

    /// The call is about to sleep until `peer` is ready.
    #[inline]
    pub(crate) fn blocked_on(&self, peer: usize) {
        self.blocked_on.store(peer, Relaxed);
    }

    /// The peer the call last waited for.
    pub(crate) fn waiting_for(&self) -> Option<usize> {
        Some(self.blocked_on.load(Relaxed)).filter(|&p| p != NOBODY)
    }

    /// The counts so far.
    pub(crate) fn counts(&self) -> PeerCounts {
        let mut counts = PeerCounts::default();
        self.copy_into(&mut counts);
        counts
    }

    /// Writes the counts so far into `counts` (only the slots in use).
    pub(crate) fn copy_into(&self, counts: &mut PeerCounts) {
        counts.used = 0;
        for (cell, slot) in self.cells.iter().zip(counts.slots.iter_mut()) {
            let key = cell.key.load(Relaxed);
            if key == 0 {
                break;
            }
            *slot = PeerCount {
                peer: key - 1,
                sent: cell.sent.load(Relaxed),
                received: cell.received.load(Relaxed),
            };
            counts.used += 1;
        }
        let others = (
            self.others_sent.load(Relaxed),
            self.others_received.load(Relaxed),
        );
        counts.others = (others != (0, 0)).then_some(others);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_counted_per_peer_and_beyond_the_slots_together() {
        let live = LiveCall::default();
        live.sent(3, 100);
        live.received(1, 40);
        live.sent(3, 28);
        for peer in 10..10 + PEER_SLOTS {
            live.received(peer, 1);
        }
        let counts = live.counts();
        assert_eq!(counts.used, PEER_SLOTS);
        assert_eq!(
            counts.used()[..2],
            [
                PeerCount {
                    peer: 3,
                    sent: 128,
                    received: 0
                },
                PeerCount {
                    peer: 1,
                    sent: 0,
                    received: 40
                }
            ]
        );
        assert_eq!(counts.others, Some((0, 2)), "peers 16 and 17 had no slot left");
        live.blocked_on(4);
        assert_eq!(live.waiting_for(), Some(4));
        live.reset();
        assert_eq!(live.counts(), PeerCounts::default());
        assert_eq!(live.waiting_for(), None);
    }
}
