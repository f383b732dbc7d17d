//! The rendezvous key/value store: rank 0 hosts it, every rank talks to it during
//! start-up to find its peers.

mod client;
mod listener;
pub mod protocol;
mod server;

pub use client::StoreClient;
pub use listener::{resolve, StoreListener};
pub use server::{RefusedClaim, StoreServer};
