//! The getters of ringccl 0.1, kept so that existing code still builds. New code reads
//! the fields: `opts.timeout` rather than `opts.get_timeout()`.

use std::time::Duration;

use ringccl_collectives::AllReduceAlgo;
use ringccl_rendezvous::AuthToken;

use super::{InitOptions, TransportKind};
use crate::Error;

#[doc(hidden)]
impl InitOptions {
    /// `self.local_rank`.
    pub fn get_local_rank(&self) -> Option<usize> {
        self.local_rank
    }

    /// `self.timeout`.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// `self.dead_peer_timeout`.
    pub fn get_dead_peer_timeout(&self) -> Duration {
        self.dead_peer_timeout
    }

    /// `self.auth_token.as_ref()`.
    pub fn get_auth_token(&self) -> Option<&AuthToken> {
        self.auth_token.as_ref()
    }

    /// `self.device`.
    pub fn get_device(&self) -> Option<usize> {
        self.device
    }

    /// `self.chunk_bytes`.
    pub fn get_chunk_bytes(&self) -> Option<usize> {
        self.chunk_bytes
    }

    /// `self.small_all_reduce_max_bytes`.
    pub fn get_small_all_reduce_max_bytes(&self) -> Option<usize> {
        self.small_all_reduce_max_bytes
    }

    /// The algorithm set in code, else `RINGCCL_ALGO`, else auto.
    pub fn get_all_reduce_algo(&self) -> Result<AllReduceAlgo, Error> {
        self.resolved_all_reduce_algo()
    }

    /// The transport set in code, else `RINGCCL_TRANSPORT`, else auto.
    pub fn get_transport(&self) -> Result<TransportKind, Error> {
        self.resolved_transport()
    }
}
