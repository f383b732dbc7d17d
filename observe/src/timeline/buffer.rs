//! The bounded buffer between the threads that record spans and the thread that writes
//! them: recording takes an uncontended lock and pushes (no system call, no I/O); a full
//! buffer drops the record and counts it, so a writer that falls behind (a slow disk)
//! never slows a collective down, and memory never grows past the cap.
//!
//! It also keeps the spans still open (collective calls in progress): one that runs
//! longer than [`UNFINISHED_AFTER`] is written as an *unfinished* span, from its start to
//! the moment of writing, and again every [`UNFINISHED_EVERY`] while it runs (and once
//! more when the file is finished). So a call that hangs until the process is killed
//! still shows on the timeline, up to about the moment the process died; `ringrun`'s
//! merge keeps only the longest copy, or none once the call's own span exists.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::chrome::Record;
use super::span::Span;

/// Records the buffer holds at most. At 8-byte all-reduces (some 20 µs each) a batch
/// interval's worth is about 5,000; each record is a few hundred bytes, so the buffer
/// and the writer's batch together stay under a few MiB.
pub const BUFFER_CAPACITY: usize = 8192;

/// How often the writer takes what has been recorded (sooner when the buffer is half
/// full): what a crash can lose, besides what is in the buffer.
pub(crate) const BATCH_INTERVAL: Duration = Duration::from_millis(100);

/// How long a span stays open before it is written as unfinished.
pub const UNFINISHED_AFTER: Duration = Duration::from_secs(1);
/// How often an open span's unfinished copy is written again while it stays open.
pub const UNFINISHED_EVERY: Duration = Duration::from_secs(1);

/// A span still open: started, not ended.
#[derive(Debug)]
struct OpenSpan {
    id: u64,
    tid: u32,
    /// The span, its end unknown yet.
    span: Span,
    /// When its unfinished copy was last written.
    written: Option<Instant>,
}

impl OpenSpan {
    fn due(&self, now: Instant) -> bool {
        match self.written {
            None => now.saturating_duration_since(self.span.start) >= UNFINISHED_AFTER,
            Some(at) => now.saturating_duration_since(at) >= UNFINISHED_EVERY,
        }
    }
}

#[derive(Debug, Default)]
struct Queue {
    records: Vec<Record>,
    dropped: u64,
    /// No more records are taken; the writer finishes the file.
    closing: bool,
    /// The writer has finished the file (or given up on it).
    closed: bool,
    open: Vec<OpenSpan>,
    next_open: u64,
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

    /// Opens `span` (its end not known yet) on row `tid`; returns its id for
    /// [`Buffer::close_span`]. Nothing is written unless it stays open past
    /// [`UNFINISHED_AFTER`]. A closing file opens nothing (and returns an id that closes
    /// nothing).
    pub(crate) fn open_span(&self, tid: u32, span: Span) -> u64 {
        let mut queue = self.lock();
        queue.next_open = queue.next_open.wrapping_add(1);
        let id = queue.next_open;
        if !queue.closing {
            queue.open.push(OpenSpan {
                id,
                tid,
                span,
                written: None,
            });
        }
        id
    }

    /// Closes the open span `id` (its own span is recorded by the caller).
    pub(crate) fn close_span(&self, id: u64) {
        let mut queue = self.lock();
        if let Some(at) = queue.open.iter().position(|o| o.id == id) {
            queue.open.swap_remove(at);
        }
    }

    /// The writer's wait: until `next` (its next batch time) with records waiting or an
    /// open span due for its unfinished copy, the buffer half full, or closing; then
    /// swaps the records into `into` (empty), followed by the unfinished copies due
    /// (every open span's, when closing).
    pub(crate) fn take(&self, into: &mut Vec<Record>, next: Instant) -> Batch {
        let mut queue = self.lock();
        loop {
            let now = Instant::now();
            let due =
                now >= next && (!queue.records.is_empty() || queue.open.iter().any(|o| o.due(now)));
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
        let now = Instant::now();
        let closing = queue.closing;
        for open in queue.open.iter_mut().filter(|o| closing || o.due(now)) {
            open.written = Some(now);
            let mut span = open.span.clone();
            span.end = now;
            into.push(Record::Unfinished {
                tid: open.tid,
                span,
            });
        }
        if closing {
            queue.open.clear();
        }
        Batch { closing }
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
