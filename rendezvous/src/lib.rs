//! How the ranks of a group find each other: rank 0 hosts a key/value store, every
//! rank publishes where it listens, and the ranks connect into a full mesh, each
//! connection opened with a checked hello and, with a shared secret, a mutual
//! challenge–response.
//!
//! - [`store`]: the rendezvous store (server on rank 0, client everywhere; the wire
//!   protocol is pure encode/decode), and the [`store::Store`] trait start-up runs over,
//!   so that it can use a store someone else hosts ([`connect_mesh_through`]).
//! - `hello`: the rank-to-rank handshake (pure).
//! - `auth`: HMAC-SHA256 challenge–response ([`AuthToken`]).
//! - [`connect_mesh`] → [`Mesh`]: the connected ranks and the store; [`Mesh::finish`]
//!   ends start-up on every rank, so "release the store" is a type, not a convention.
//! - `startup_watch`: a rank still waiting at start-up says whom it waits for, by itself
//!   (stderr, or the application's `tracing` subscriber), first after
//!   [`MeshConfig::startup_report`], then every twice that.
//! - [`MeshConfig`]: what connecting needs to know (the `ringccl` facade builds it
//!   from its `InitOptions`; nothing here reads the environment).
//! - `interface`: which address a rank listens on for its peers: where it reaches the
//!   store, or the interface [`MeshConfig::socket_ifname`] names ([`InterfaceSpec`]).
//! - [`SetupError`]: what can go wrong during start-up.
//!
//! Most users want the `ringccl` crate, which re-exports what matters from here.

#![deny(unsafe_code)]

mod auth;
mod config;
mod deadline_io;
mod error;
mod fd_limit;
mod hello;
mod interface;
mod job;
mod mesh;
mod peer_acceptor;
mod pending;
mod startup_watch;
pub mod store;

pub use auth::AuthToken;
pub use config::{MeshConfig, DEFAULT_STARTUP_REPORT};
pub use error::SetupError;
pub use interface::{InterfaceSpec, InterfaceSpecError};
pub use mesh::{connect_mesh, connect_mesh_through, KeptStore, Mesh, MeshConnections};
pub use store::StoreListener;
