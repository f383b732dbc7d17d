//! Running calls on a group: the shared runner, the engine interface backends
//! implement, and the request each call becomes.

mod backend_engine;
mod engine;
mod request;
mod runner;

pub use backend_engine::BackendEngine;
pub use engine::Engine;
pub use request::{validate_peer, Request};
pub use runner::{GroupRunner, ABORT_NOTICE_GRACE, PEER_FAILURE_GRACE};

#[cfg(test)]
mod tests;
