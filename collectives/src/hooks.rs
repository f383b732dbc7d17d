//! The hook contract: what the runtime tells whoever watches it. The runner and the
//! engines call a group's [`CallHooks`]; they never name what is attached (the flight
//! recorder and the timeline of `ringccl-observe`, or a user's own observer).
//!
//! Hooks run on the thread that runs the group's calls, most of them under the group's
//! lock: they must be quick, and never block or call back into the group. Work that may
//! block (writing a file) is handed back as a [`Deferred`], which the runner runs once it
//! has released the lock.
//!
//! A call's hooks come in this order: [`refused`](CallHooks::refused) alone, or
//! [`started`](CallHooks::started), then [`running`](CallHooks::running) once the engine
//! knows how it runs the call, any number of [`blocked_on`](CallHooks::blocked_on), then
//! [`ran`](CallHooks::ran) and [`finished`](CallHooks::finished). [`broke`](CallHooks::broke)
//! comes whenever the group breaks, with the failed call still running.
//!
//! What a call does between its hooks (its bytes per peer, its waits) is not told: it is
//! in the group's [`Probe`], which an observer reads when it needs it
//! ([`CallHooks::attached`] gives it the group's control state, the probe's home).

use std::fmt;
use std::sync::Arc;

use crate::control::{GroupControl, Probe};
use crate::schedule::Schedule;
use crate::wire::Algorithm;
use crate::{Deadline, Error, OpDesc, Sequence};

/// Work a hook leaves for after the group's lock is released (writing a dump).
pub type Deferred = Box<dyn FnOnce() + Send>;

/// What broke the group.
#[derive(Clone, Copy, Debug)]
pub enum Broke<'a> {
    /// A call failed with an error that leaves the connections in an unknown state (or
    /// a call was refused because a peer had aborted the group).
    By(&'a Error),
    /// This rank's user aborted the group ([`Backend::abort`](crate::Backend::abort)),
    /// saying why.
    Aborted(&'a str),
}

/// A call as its engine runs it.
#[derive(Clone, Copy, Debug)]
pub struct Running {
    /// What the call is, with its number.
    pub op: OpDesc,
    /// How the engine runs it.
    pub algorithm: Algorithm,
    /// This rank.
    pub rank: usize,
    /// The group's size.
    pub world_size: usize,
    /// The deadline the call was issued with.
    pub deadline: Deadline,
}

/// A call its engine has finished running.
#[derive(Clone, Copy, Debug)]
pub struct Ran<'a> {
    /// The call.
    pub call: &'a Running,
    /// The schedule it followed and the size of its elements, for a call that followed
    /// one (its bytes per peer can be counted from it); `None` for other calls.
    pub schedule: Option<(&'a Arc<Schedule>, usize)>,
    /// How it ended.
    pub result: &'a Result<(), Error>,
}

/// What the runtime tells an observer of one group. Every method does nothing by
/// default; [`NoHooks`] is a group with nobody watching.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use ringccl_collectives::hooks::CallHooks;
/// use ringccl_collectives::{Error, Sequence};
///
/// /// Counts the calls that fail.
/// #[derive(Debug, Default)]
/// struct Failures(AtomicU64);
///
/// impl CallHooks for Failures {
///     fn finished(&self, error: Option<&Error>) {
///         if error.is_some() {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// let failures = Failures::default();
/// failures.started(Sequence::Collective, 1);
/// failures.finished(Some(&Error::InvalidArgument("bad root".into())));
/// assert_eq!(failures.0.load(Ordering::Relaxed), 1);
/// ```
pub trait CallHooks: Send + Sync + fmt::Debug {
    /// The hooks were attached to a group, whose control state is `control` (whether it
    /// is aborted, and by whom).
    fn attached(&self, control: &Arc<GroupControl>) {
        let _ = control;
    }

    /// A call in `sequence` was refused before it started (misuse, or a broken or
    /// aborted group). `would_be`: the number it would have had, and what it would have
    /// run, when the runner knows them.
    fn refused(&self, sequence: Sequence, would_be: Option<(u64, Option<OpDesc>)>, error: &Error) {
        let _ = (sequence, would_be, error);
    }

    /// Call number `seq` of `sequence` starts.
    fn started(&self, sequence: Sequence, seq: u64) {
        let _ = (sequence, seq);
    }

    /// The engine runs the current call as `call` says.
    fn running(&self, call: &Running) {
        let _ = call;
    }

    /// The current call is about to sleep until `peer` is ready (after the probe was
    /// told).
    #[inline]
    fn blocked_on(&self, peer: usize) {
        let _ = peer;
    }

    /// The engine handed the current call to its device without waiting for it (NCCL's
    /// stream-ordered calls). Returns a token for [`CallHooks::device_finished`], `None`
    /// when the hooks do not follow calls on devices.
    fn handed_to_device(&self) -> Option<u64> {
        None
    }

    /// A call handed to the device ([`CallHooks::handed_to_device`] gave `token`) has
    /// finished there, failed with `error` if given.
    fn device_finished(&self, token: u64, error: Option<&Error>) {
        let _ = (token, error);
    }

    /// The engine has finished running the current call.
    fn ran(&self, call: &Ran<'_>) {
        let _ = call;
    }

    /// The current call is over, failed with `error` if given.
    fn finished(&self, error: Option<&Error>) {
        let _ = error;
    }

    /// The group broke (`how`); a call that failed still shows as running. Returns what
    /// to do once the group's lock is released.
    fn broke(&self, how: Broke<'_>) -> Option<Deferred> {
        let _ = how;
        None
    }
}

/// Nobody watching: every hook does nothing.
///
/// ```
/// use ringccl_collectives::hooks::{CallHooks, NoHooks};
/// assert!(NoHooks.handed_to_device().is_none());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl CallHooks for NoHooks {}

/// What every engine does around a call, whatever runs it: it says what it runs (in the
/// group's probe, and to the hooks), and that it ended.
///
/// ```
/// use std::time::Duration;
/// use ringccl_collectives::hooks::{CallScope, NoHooks, Running};
/// use ringccl_collectives::{wire::Algorithm, Deadline, OpDesc};
///
/// let call = Running {
///     op: OpDesc::barrier(1),
///     algorithm: Algorithm::Dissemination,
///     rank: 0,
///     world_size: 1,
///     deadline: Deadline::after(Duration::from_secs(1)),
/// };
/// let scope = CallScope::begin(None, &NoHooks, call);
/// scope.end(None, &Ok(()));
/// ```
#[derive(Debug)]
pub struct CallScope<'a> {
    probe: Option<&'a Probe>,
    hooks: &'a dyn CallHooks,
    call: Running,
}

impl<'a> CallScope<'a> {
    /// `call` begins, on a group whose control state is `control` (if the engine has
    /// one) and whose hooks are `hooks`.
    #[inline]
    pub fn begin(
        control: Option<&'a GroupControl>,
        hooks: &'a dyn CallHooks,
        call: Running,
    ) -> CallScope<'a> {
        let probe = control.map(GroupControl::probe);
        if let Some(probe) = probe {
            probe.begin(call.op, call.algorithm);
        }
        hooks.running(&call);
        CallScope { probe, hooks, call }
    }

    /// Where the call's progress goes (the group's probe and its hooks), for the code
    /// that runs it inside the crate.
    pub(crate) fn progress(&self) -> ProgressSink<'a> {
        ProgressSink {
            probe: self.probe,
            hooks: self.hooks,
        }
    }

    /// The call ended with `result`, having followed `schedule` (with elements of the
    /// given size) if it followed one.
    #[inline]
    pub fn end(self, schedule: Option<(&Arc<Schedule>, usize)>, result: &Result<(), Error>) {
        if let Some(probe) = self.probe {
            probe.end();
        }
        self.hooks.ran(&Ran {
            call: &self.call,
            schedule,
            result,
        });
    }
}

/// Where a running call reports its progress: the group's probe and its hooks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProgressSink<'a> {
    pub(crate) probe: Option<&'a Probe>,
    pub(crate) hooks: &'a dyn CallHooks,
}

impl ProgressSink<'_> {
    /// The call is about to sleep until `peer` is ready, having moved `moved` bytes.
    pub(crate) fn blocked_on(&self, peer: usize, moved: u64) {
        if let Some(probe) = self.probe {
            probe.blocked_on(peer, moved);
        }
        self.hooks.blocked_on(peer);
    }

    /// `n` more bytes went to `peer`.
    #[inline]
    pub(crate) fn sent(&self, peer: usize, n: usize) {
        if let Some(probe) = self.probe {
            probe.sent(peer, n);
        }
    }

    /// `n` more bytes came from `peer`.
    #[inline]
    pub(crate) fn received(&self, peer: usize, n: usize) {
        if let Some(probe) = self.probe {
            probe.received(peer, n);
        }
    }
}
