//! The flight recorder: every rank keeps its last few thousand calls in a fixed-size
//! ring, and writes them out as JSON when the group breaks, when a call times out, or on
//! request, so that a stuck job can be diagnosed across ranks (`ringrun diagnose`).
//!
//! - [`dump`]: the dump's format, shared by the library that writes it and the tools
//!   that read it.
//! - [`beacon`]: the progress beacon, a tiny file per rank that a watcher polls.
//! - [`diagnose`]: the analysis across ranks that reads them (`ringrun diagnose`).

pub mod beacon;
pub mod diagnose;
pub mod dump;
