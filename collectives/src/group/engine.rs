//! What a backend implements: running one validated, numbered call.

use std::fmt;
use std::sync::Arc;

use super::Request;
use crate::control::GroupControl;
use crate::hooks::CallHooks;
use crate::Deadline;
use crate::{Error, OpDesc};

/// The part of a backend that moves data: it runs one call that
/// [`GroupRunner`](super::GroupRunner) has already validated, numbered and given a
/// deadline. Sequence numbers, the broken state, argument checks and the diagnosis of
/// failures live once, in the runner, for every engine.
///
/// The runner serialises calls: an engine never runs two at once.
pub trait Engine: Send + fmt::Debug {
    /// Runs `request`, described to peers and in errors as `op`, by `deadline`.
    fn execute(
        &mut self,
        op: &OpDesc,
        request: Request<'_>,
        deadline: Deadline,
    ) -> Result<(), Error>;

    /// Peers whose connection to this rank has closed or failed, for the diagnosis of an
    /// error (never blocks). Engines without such knowledge say none.
    fn failed_peers(&mut self) -> Vec<usize> {
        Vec::new()
    }

    /// Called once, when the runner takes the engine: the engine publishes what it is
    /// doing in `control.activity()` and registers its connections' closers there, so an
    /// abort can wake a call in progress.
    fn attach(&mut self, control: &Arc<GroupControl>) {
        let _ = control;
    }

    /// Called when hooks are attached to the group
    /// ([`GroupRunner::attach_hooks`](super::GroupRunner::attach_hooks)): the engine
    /// tells `hooks` how it runs each call ([`CallHooks::running`],
    /// [`CallHooks::ran`]) and, where it can, the bytes it moves per peer and the peer
    /// it waits for.
    fn attach_hooks(&mut self, hooks: &Arc<dyn CallHooks>) {
        let _ = hooks;
    }

    /// The group has broken or been aborted: release whatever could still be waiting on
    /// peers (NCCL aborts its communicator). Called under the runner's lock, possibly
    /// more than once: later calls must do nothing.
    fn abort(&mut self) {}
}
