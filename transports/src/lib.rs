//! ringccl's byte movers: the TCP mesh transport, the same-host shared-memory
//! transport, `poll(2)`, and the liveness probe of a peer's connection.
//!
//! Transports know nothing about collectives or about how ranks find each other; they
//! move bytes between connected ranks. Connecting is the rendezvous crate's job
//! (`ringccl-rendezvous`), which hands over handshaken connections; shared-memory
//! set-up reads the rendezvous store only through [`SetupStore`]. Most users want the
//! `ringccl` crate, which re-exports what matters from here.
//!
//! - [`TcpTransport`]: one non-blocking connection per peer.
//! - [`ShmTransport`]: futex-signalled rings under `/dev/shm` ([`shm::set_up`] builds
//!   them collectively), with the TCP connections kept as a liveness channel.
//! - [`InProcessTransport`]: the same rings in anonymous memory, between ranks that are
//!   threads of one process (`ringccl::local_groups`).
//! - [`discover_hosts`]: where every rank runs ([`HostMap`]), for shared-memory set-up
//!   and for the topology-aware collectives over TCP.
//! - [`poll`]: sleeping until a socket is ready.
//! - The spin window every transport shares (`RINGCCL_SPIN_US`) is
//!   `ringccl_collectives::spin`: spin between looks while every rank has a core, yield
//!   the core when they outnumber it.
//! - [`liveness`]: is a peer's process still there?
//! - [`WatchedStore`]: waiting on the store during start-up while watching the peers
//!   ([`PeerWatch`]), so a peer that dies is named at once ([`PeerGone`]).
//! - [`ControlLink`]: the group's control thread, which carries abort notices and the
//!   questions blocked ranks ask each other.

#![deny(unsafe_code)]

mod control_link;
mod host_map;
pub mod liveness;
mod peer_watch;
pub mod poll;
mod setup_errors;
mod setup_store;
pub mod shm;
mod tcp;

use ringccl_collectives::spin;

pub use control_link::ControlLink;
pub use host_map::{discover_hosts, HostMap};
pub use peer_watch::{PeerWatch, WatchedStore};
pub use setup_errors::PeerGone;
pub use setup_store::SetupStore;
pub use shm::{InProcessTransport, ShmTransport, DEFAULT_RING_BYTES};
pub use tcp::TcpTransport;
