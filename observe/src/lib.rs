//! What ringccl lets you see of a running job, attached to a group from outside its core
//! through the group's [hooks](ringccl_collectives::hooks::CallHooks):
//!
//! - [`flight`]: the flight recorder. Every rank keeps its last calls in a fixed-size
//!   ring and writes them out when the group breaks, when a call times out, or on
//!   request, for `ringrun diagnose` to read across ranks.
//! - [`timeline`]: every rank writes a Chrome trace with one span per call, and whatever
//!   else marks its time (DDP's buckets, the trainer's own spans).
//! - [`Observers`]: both, as the one set of hooks a group gets at start-up.
//!
//! Most users want the `ringccl` crate, which attaches them from its environment
//! (`RINGCCL_FLIGHT_DIR`, `RINGCCL_TRACE`) and re-exports what matters from here.

#![deny(unsafe_code)]

pub mod flight;
mod observers;
pub mod timeline;

pub use observers::Observers;
