//! The flight recorder: every rank keeps its last few thousand calls in a fixed-size
//! ring, and writes them out as JSON when the group breaks, when a call times out, or on
//! request, so that a stuck job can be diagnosed across ranks: `ringrun diagnose`, of the
//! `ringccl-tools` package, reads the dumps and the beacons.
//!
//! - [`dump`]: the dump's format, shared by the library that writes it and the tools
//!   that read it, and what a dump's reason says of how the rank's part ended
//!   ([`Ending`]).
//! - [`beacon`]: the progress beacon, a tiny file per rank that a watcher polls.
//! - [`FlightRecorder`]: one group's recorder (`recorder.rs`), over the ring of calls
//!   (`ring.rs`), the running call's live counters (`live.rs`) and the beacon file
//!   (`beacon_file.rs`, mapped by `mapping.rs`).
//! - [`dump_all`]: the dumps on request (`SIGUSR1`, `requests.rs`); file names and
//!   atomic replacement in `files.rs`.

pub mod beacon;
mod beacon_file;
pub mod dump;
mod files;
mod live;
mod mapping;
mod recorder;
mod requests;
mod ring;
mod tick_clock;

pub use dump::{
    CallState, Ending, FlightDump, FlightEntry, OtherPeers, PeerBytes, FORMAT_VERSION,
    OLDEST_FORMAT_READ,
};
pub use files::{file_name, group_tag, MAIN_GROUP};
pub(crate) use recorder::break_reason;
pub use recorder::{FlightConfig, FlightRecorder, DEFAULT_FLIGHT_ENTRIES, MAX_FLIGHT_ENTRIES};
pub use requests::{dump_all, WATCH_EVERY};
pub use ringccl_collectives::control::PEER_SLOTS;
