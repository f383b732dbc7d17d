//! What a transport's set-up needs from the rendezvous store: publish a value, look one
//! up, wait for another rank's. The rendezvous crate implements it for every `dyn Store`.

use std::time::Instant;

use crate::setup_errors::{PeerGone, ShmUnavailable};

/// A key/value store every rank of the group reaches during start-up.
pub trait SetupStore {
    /// The store's error. Set-up failures of the transport itself (shared memory that
    /// cannot work, a peer that went away) become this type too, so the caller sees one
    /// error type for the whole start-up.
    type Error: From<ShmUnavailable> + From<PeerGone> + std::fmt::Display;

    /// Publishes `value` under `key`.
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), Self::Error>;

    /// `key`'s value if it is published, without waiting.
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Self::Error>;

    /// Waits until `key` is published and returns its value; fails at `deadline` (at
    /// once if it has passed) with an error that says it was waiting for `waiting_for()`.
    fn wait(
        &mut self,
        key: &str,
        deadline: Instant,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, Self::Error>;
}
