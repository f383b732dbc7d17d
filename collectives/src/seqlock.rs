//! A sequence lock over fields that are atomics themselves: one writer at a time changes
//! them together, readers on any thread read them in one piece without a lock.
//!
//! The writer makes the generation odd, writes, and makes it even again; a reader
//! retries while it saw an odd or a changed generation. On x86 both sides are plain
//! loads and stores. The fields are relaxed atomics, so a torn read is only ever
//! retried, never undefined.

use std::sync::atomic::{fence, AtomicU64, Ordering, Ordering::Relaxed};

/// See the module documentation.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
/// use ringccl_collectives::seqlock::SeqLock;
///
/// let (lock, a, b) = (SeqLock::default(), AtomicU64::new(0), AtomicU64::new(0));
/// lock.write(|| {
///     a.store(1, Relaxed);
///     b.store(2, Relaxed);
/// });
/// let read = lock.read(1000, || (a.load(Relaxed), b.load(Relaxed)));
/// assert_eq!(read, Some((1, 2)));
/// ```
#[derive(Debug, Default)]
pub struct SeqLock {
    /// Odd while the writer changes the fields.
    generation: AtomicU64,
}

impl SeqLock {
    /// Runs `write`, which stores the guarded fields (relaxed). Only one thread may
    /// write at a time: the caller serialises writers.
    #[inline]
    pub fn write(&self, write: impl FnOnce()) {
        let generation = self.generation.load(Relaxed);
        self.generation.store(generation.wrapping_add(1), Relaxed);
        fence(Ordering::Release);
        write();
        self.generation
            .store(generation.wrapping_add(2), Ordering::Release);
    }

    /// Runs `read`, which loads the guarded fields (relaxed), until it ran while no
    /// write did; `None` when writes kept coming for `attempts` tries (it yields the
    /// processor now and then, so that a writer preempted mid-write can finish). `read`
    /// may run several times: what it writes elsewhere is that of its last run.
    #[inline]
    pub fn read<R>(&self, attempts: usize, mut read: impl FnMut() -> R) -> Option<R> {
        for attempt in 0..attempts {
            let before = self.generation.load(Ordering::Acquire);
            if before % 2 == 0 {
                let value = read();
                fence(Ordering::Acquire);
                if self.generation.load(Relaxed) == before {
                    return Some(value);
                }
            }
            if attempt % 64 == 63 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        None
    }
}
