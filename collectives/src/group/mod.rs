//! Running calls on a group: the shared runner, the engine interface backends
//! implement, the request each call becomes, and deadlines.

mod deadline;
mod engine;
mod request;
mod runner;

pub use deadline::Deadline;
pub use engine::Engine;
pub use request::{validate_peer, Request, Sequence};
pub use runner::{GroupRunner, ABORT_NOTICE_GRACE, PEER_FAILURE_GRACE};

#[cfg(test)]
mod tests;
