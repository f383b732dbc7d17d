//! The running call, as the recorder numbered it: its number, its number in its
//! sequence, when it started and its peer. Written by the one thread that runs the
//! group's calls, without a lock; read at any moment by a dump. What the call does (its
//! description, bytes per peer, the peer it waits for) is in the group's
//! [`Probe`](ringccl_collectives::control::Probe), not here.
//!
//! The fields change together, under a [`SeqLock`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use ringccl_collectives::seqlock::SeqLock;

const NOBODY: usize = usize::MAX;
/// How often a reader retries before it gives up on a writer that keeps changing the call.
const READ_ATTEMPTS: usize = 1000;

/// The running call, read in one piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LiveRecord {
    /// The recorder's number of the call.
    pub(crate) call: u64,
    /// Its number in its sequence.
    pub(crate) seq: u64,
    /// When it started (Unix microseconds); `None`: when it was issued.
    pub(crate) started_us: Option<u64>,
    /// For a point-to-point call, the peer.
    pub(crate) peer: Option<usize>,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct LiveCall {
    lock: SeqLock,
    /// The call running now (0: none).
    call: AtomicU64,
    seq: AtomicU64,
    /// 0: when it was issued.
    started_us: AtomicU64,
    peer: AtomicUsize,
}

impl Default for LiveCall {
    fn default() -> LiveCall {
        LiveCall {
            lock: SeqLock::default(),
            call: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            started_us: AtomicU64::new(0),
            peer: AtomicUsize::new(NOBODY),
        }
    }
}

impl LiveCall {
    /// Call `call` starts as number `seq` of its sequence, at `started_us` (`None`: when
    /// it was issued), with `peer` for a point-to-point call.
    #[inline]
    pub(crate) fn begin(&self, call: u64, seq: u64, started_us: Option<u64>, peer: Option<usize>) {
        self.lock.write(|| {
            self.seq.store(seq, Relaxed);
            self.started_us.store(started_us.unwrap_or(0), Relaxed);
            self.peer.store(peer.unwrap_or(NOBODY), Relaxed);
            self.call.store(call, Relaxed);
        });
    }

    /// The running call's number, if one runs. Only the writer calls this.
    #[inline]
    pub(crate) fn call(&self) -> Option<u64> {
        Some(self.call.load(Relaxed)).filter(|&call| call != 0)
    }

    /// The current call ends: returns what was recorded of it, if one was running. Only
    /// the writer calls this.
    #[inline]
    pub(crate) fn end(&self) -> Option<LiveRecord> {
        let record = self.read_fields()?;
        self.lock.write(|| self.call.store(0, Relaxed));
        Some(record)
    }

    /// The running call, read in one piece; `None` if none runs (or the writer kept
    /// changing it for [`READ_ATTEMPTS`] reads).
    pub(crate) fn read(&self) -> Option<LiveRecord> {
        self.lock
            .read(READ_ATTEMPTS, || self.read_fields())
            .flatten()
    }

    #[inline]
    fn read_fields(&self) -> Option<LiveRecord> {
        let call = self.call.load(Relaxed);
        if call == 0 {
            return None;
        }
        let started_us = self.started_us.load(Relaxed);
        let peer = self.peer.load(Relaxed);
        Some(LiveRecord {
            call,
            seq: self.seq.load(Relaxed),
            started_us: (started_us != 0).then_some(started_us),
            peer: (peer != NOBODY).then_some(peer),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_never_sees_one_call_mixed_with_another() {
        let live = LiveCall::default();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut seen = 0u64;
                while !stop.load(Relaxed) {
                    if let Some(record) = live.read() {
                        // The writer numbers call `c` as seq `c + 7`, started at `3c`.
                        assert_eq!(record.seq, record.call + 7, "{record:?}");
                        assert_eq!(record.started_us, Some(3 * record.call), "{record:?}");
                        seen += 1;
                    }
                }
                seen
            });
            for call in 1..200_000u64 {
                live.begin(call, call + 7, Some(3 * call), None);
                assert_eq!(live.end().map(|r| r.call), Some(call));
            }
            stop.store(true, Relaxed);
            let seen = reader.join().unwrap();
            eprintln!("the reader saw {seen} calls");
        });
        assert_eq!(live.call(), None);
    }
}
