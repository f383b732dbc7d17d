//! The bounded buffer between the threads that record spans and the thread that writes
//! them: recording takes an uncontended lock and pushes (no system call, no I/O); a full
//! buffer drops the record and counts it, so a writer that falls behind (a slow disk)
//! never slows a collective down, and memory never grows past the cap.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::chrome::Record;

/// Records the buffer holds at most. At 8-byte all-reduces (some 20 µs each) a batch
/// interval's worth is about 5,000; each record is a few hundred bytes, so the buffer
/// and the writer's batch together stay under a few MiB.
pub const BUFFER_CAPACITY: usize = 8192;

/// How often the writer takes what has been recorded (sooner when the buffer is half
/// full): what a crash can lose, besides what is in the buffer.
pub(crate) const BATCH_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
struct Queue {
    records: Vec<Record>,
    dropped: u64,
    /// No more records are taken; the writer finishes the file.
    closing: bool,
    /// The writer has finished the file (or given up on it).
    closed: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Buffer {
    capacity: usize,
    queue: Mutex<Queue>,
    /// Wakes the writer early (half full, or closing).
    wake: Condvar,
    /// Signals that the file is finished.
    finished: Condvar,
}

/// What the writer takes out in one go.
pub(crate) struct Batch {
    /// Whether the buffer is closing: after writing this batch, finish the file.
    pub(crate) closing: bool,
}

impl Buffer {
    pub(crate) fn new(capacity: usize) -> Buffer {
        Buffer {
            capacity: capacity.max(1),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            finished: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Every update is a push or a swap: a poisoned lock still holds a usable queue.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most records it holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queues `record`, or drops it (counted) when the buffer is full or closing.
    /// `always` queues it even when full (row names: few, and the file needs them).
    pub(crate) fn push(&self, record: Record, always: bool) {
        let mut queue = self.lock();
        let len = queue.records.len();
        if queue.closing || (len >= self.capacity && !always) {
            queue.dropped += 1;
            return;
        }
        queue.records.push(record);
        if len + 1 == self.capacity / 2 {
            self.wake.notify_one();
        }
    }

    /// Whether [`Buffer::close`] has been called.
    pub(crate) fn is_closing(&self) -> bool {
        self.lock().closing
    }

    /// Records dropped so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Records waiting for the writer now.
    pub(crate) fn pending(&self) -> usize {
        self.lock().records.len()
    }

    /// The writer's wait: until `next` (its next batch time) with records waiting, the
    /// buffer half full, or closing; then swaps the records into `into` (empty).
    pub(crate) fn take(&self, into: &mut Vec<Record>, next: Instant) -> Batch {
        let mut queue = self.lock();
        loop {
            let now = Instant::now();
            let due = now >= next && !queue.records.is_empty();
            if due || queue.closing || queue.records.len() >= self.capacity / 2 {
                break;
            }
            let wait = if now >= next {
                BATCH_INTERVAL
            } else {
                next - now
            };
            queue = self
                .wake
                .wait_timeout(queue, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        std::mem::swap(&mut queue.records, into);
        Batch {
            closing: queue.closing,
        }
    }

    /// Refuses further records and wakes the writer to finish the file.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_all();
    }

    /// The writer has finished the file.
    pub(crate) fn mark_closed(&self) {
        self.lock().closed = true;
        self.finished.notify_all();
    }

    /// Waits up to `limit` for the writer to finish the file; whether it did.
    pub(crate) fn wait_closed(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        let mut queue = self.lock();
        while !queue.closed {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            queue = self
                .finished
                .wait_timeout(queue, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}
