//! The timeline: every rank writes a Chrome trace (the Trace Event JSON that Perfetto and
//! chrome://tracing open) with one span per collective call, and whatever else marks its
//! time (DDP's buckets, the trainer's backward pass).
//!
//! - [`TraceFile`]: one rank's file, its bounded buffer and writer thread.
//! - [`Timeline`]: a row of the file, where spans are recorded; [`SpanGuard`] times one.
//! - [`Span`]: what a span says.
//! - [`CollectiveTrace`]: the engine's hook, one span per call.
//!
//! Times are microseconds since the Unix epoch, so the files of all ranks line up and
//! can be merged (`ringrun --trace DIR` does, into `DIR/trace.json`).

mod buffer;
mod chrome;
mod clock;
mod collective;
mod file;
mod row;
mod span;

pub use buffer::{BUFFER_CAPACITY, UNFINISHED_AFTER, UNFINISHED_EVERY};
pub use collective::CollectiveTrace;
pub(crate) use collective::{Call, Started};
pub use file::{TraceFile, TraceHold, CLOSE_WAIT};
pub use row::{SpanGuard, Timeline};
pub use span::{BucketArgs, CollectiveArgs, PeerBytes, PeerTraffic, Span, SpanArgs};

#[cfg(test)]
mod tests;
