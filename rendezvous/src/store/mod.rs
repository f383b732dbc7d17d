//! The rendezvous key/value store: rank 0 hosts it, every rank talks to it during
//! start-up to find its peers. Start-up sees it through [`Store`], which another store
//! every rank reaches (torch's, say) can implement instead.

mod client;
mod interface;
mod listener;
pub mod protocol;
mod server;

pub use client::StoreClient;
pub use interface::{wait_by_polling, Store, ABORT_KEY};
pub use listener::{resolve, StoreListener};
pub use server::{RefusedClaim, StoreServer};
