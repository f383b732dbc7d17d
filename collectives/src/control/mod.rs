//! The control plane: what lets one rank stop the whole group at once, and lets a
//! blocked rank find out what the peer it waits on is doing.
//!
//! Data frames only tell a rank about the peers it is reading from, and only once a frame
//! arrives. A rank that breaks the group (a mismatch, a timeout, a lost peer, a panic)
//! must tell *everyone*, and a mismatch where no frame ever crosses must still be found.
//! Both travel on a second, always-read connection per pair of ranks, as small
//! [`ControlMessage`]s:
//!
//! - [`probe`]: what this rank is doing now (its call, how it was numbered, the bytes it
//!   moved, the peer it is blocked on, its counts of calls with each peer), written by
//!   the runner and the executor without a lock, read by the control thread and by
//!   whatever observes the group;
//! - [`deadlock`]: when two ranks' calls provably wait on each other (point-to-point
//!   against a collective, two receives, two sends that filled the connection);
//! - [`message`]: the control messages and their encoding;
//! - [`sentinel`]: the protocol, as a pure state machine that takes `now` and messages and
//!   says what to send and what it concluded; the I/O driver lives with the transports
//!   (`ringccl_transports::ControlLink`), and tests drive the machine in memory;
//! - `sentinel_driver.rs`: [`SentinelDriver`], the sentinel bound to this rank's control
//!   state, which both I/O drivers run around their reads and writes;
//! - `memory_link.rs`: [`MemoryControlLink`], the I/O driver for ranks that share one
//!   process (`ringccl::local_groups`), over channels;
//! - [`group_control`]: the state the runner, the executor and the control thread share:
//!   the abort record, and how to close the data connections and wake their waiters.

pub mod deadlock;
pub mod group_control;
mod memory_link;
pub mod message;
pub mod probe;
pub mod sentinel;
mod sentinel_driver;

pub use crate::call_desc::CallDesc;
pub use group_control::{AbortRecord, GroupControl};
pub use memory_link::MemoryControlLink;
pub use message::{ControlMessage, MAX_CONTROL_BODY};
pub use probe::{LastCall, MovedBytes, PairCounts, PeerMoved, Probe, Snapshot, PEER_SLOTS};
pub use sentinel::{Sentinel, Verdict, ASK_AFTER, ASK_EVERY, FOLLOW_UP, RETRY_EVERY, TICK};
pub use sentinel_driver::SentinelDriver;
