//! One NCCL call's context: enqueueing it, polling it to completion against its deadline
//! and its peers' liveness (NCCL has no deadline of its own), and watching the calls
//! left in flight without a wait.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream, DriverError};
use ringccl_collectives::control::GroupControl;
use ringccl_collectives::{Deadline, Error, OpDesc, PEER_FAILURE_GRACE};

use super::engine::OnStream;
use super::ffi::{self, Call, NcclCode, Progress, RawComm};
use super::in_flight::{InFlight, Stage, Watch};
use crate::{DeviceError, StreamOrder};
use ringccl_transports::TcpTransport;

/// How often a waiting rank checks that its peers' processes are still alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);

/// Which peers an operation depends on.
#[derive(Clone, Copy)]
pub(super) enum Involved {
    All,
    One(usize),
}

/// One operation's view of the engine: the live communicator, its stream, its deadline,
/// and whom it waits for.
pub(super) struct Cx<'a> {
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) comm: &'a RawComm,
    pub(super) stream: &'a Arc<CudaStream>,
    /// Connections to every peer, kept idle as a liveness channel.
    pub(super) peers: &'a TcpTransport,
    pub(super) op: &'a OpDesc,
    pub(super) involved: Involved,
    pub(super) deadline: Deadline,
    /// The group's shared state, once running: an abort (here or by a peer) ends the wait.
    pub(super) control: Option<&'a GroupControl>,
}

impl Cx<'_> {
    /// An NCCL failure of `call`, with NCCL's own last words and what to do.
    pub(super) fn nccl(&self, call: &str, code: NcclCode) -> Error {
        let detail = self.comm.last_error();
        let hint = if code.is_remote() {
            "a peer or the network failed; the group is broken, create a new one"
        } else {
            "set NCCL_DEBUG=WARN for NCCL's own diagnosis"
        };
        DeviceError::Call {
            rank: self.rank,
            op: self.op.to_string(),
            call: call.to_string(),
            reason: if detail.is_empty() {
                format!("{} ({hint})", code.describe())
            } else {
                format!("{} — {detail} ({hint})", code.describe())
            },
        }
        .into()
    }

    /// Maps a CUDA driver failure of `call` to this operation's error.
    pub(super) fn driver<'s>(&'s self, call: &'s str) -> impl Fn(DriverError) -> Error + 's {
        move |e| {
            DeviceError::Call {
                rank: self.rank,
                op: self.op.to_string(),
                call: call.to_string(),
                reason: format!("{e}"),
            }
            .into()
        }
    }

    /// Enqueues `calls` ordered by `order` against `buffers`' streams (see
    /// [`StreamOrder`]): NCCL's stream waits for them first, and they wait for the calls
    /// after. Returns the completion event (`None` for no calls) without waiting for it.
    pub(super) fn enqueue_ordered(
        &self,
        calls: &[Call<'_, '_>],
        order: StreamOrder<'_>,
        buffers: &[&CudaStream],
    ) -> Result<Option<CudaEvent>, Error> {
        order
            .before(self.stream, buffers)
            .map_err(self.driver("ordering NCCL's stream after the buffers'"))?;
        let done = self.enqueue(calls)?;
        if let Some(done) = &done {
            if let Err(e) = order.after(done, self.stream, buffers) {
                // The calls are on their way and the buffers' streams do not wait for
                // them: the host does, so that no buffer is released under NCCL.
                let _ = self.wait(done);
                return Err(self.driver("ordering the buffers' streams after NCCL's")(e));
            }
        }
        Ok(done)
    }

    /// [`Cx::enqueue_ordered`], then waits, within the deadline, until the GPU has
    /// finished the calls.
    pub(super) fn launch_ordered(
        &self,
        calls: &[Call<'_, '_>],
        order: StreamOrder<'_>,
        buffers: &[&CudaStream],
    ) -> Result<(), Error> {
        match self.enqueue_ordered(calls, order, buffers)? {
            Some(done) => self.wait(&done),
            None => Ok(()),
        }
    }

    /// Enqueues `calls` on the communicator's stream (as one NCCL group when there are
    /// several) and waits, within the deadline, until the GPU has finished them.
    pub(super) fn launch(&self, calls: &[Call<'_, '_>]) -> Result<(), Error> {
        match self.enqueue(calls)? {
            Some(done) => self.wait(&done),
            None => Ok(()),
        }
    }

    /// Waits, within the deadline, until the GPU has reached `done`, NCCL reports an
    /// error, or a peer is gone.
    pub(super) fn wait(&self, done: &CudaEvent) -> Result<(), Error> {
        self.poll(|| {
            if let Err(code) = self.comm.async_status() {
                return Err(self.nccl("the running collective", code));
            }
            done.try_is_complete()
                .map_err(self.driver("querying the completion event"))
        })
    }

    /// Enqueues `calls` on the communicator's stream (as one NCCL group when there are
    /// several) and returns an event that fires when the GPU has finished them (`None`
    /// for no calls), without waiting for it.
    pub(super) fn enqueue(&self, calls: &[Call<'_, '_>]) -> Result<Option<CudaEvent>, Error> {
        if calls.is_empty() {
            return Ok(None);
        }
        let grouped = calls.len() > 1;
        if grouped {
            ffi::group_start().map_err(|c| self.nccl("ncclGroupStart", c))?;
        }
        for call in calls {
            match self.comm.enqueue(call, self.stream) {
                Ok(Progress::Pending) if !grouped => self.settle("enqueueing")?,
                Ok(_) => {}
                Err(code) => {
                    if grouped {
                        // Leave this thread's group mode whatever happens to the comm.
                        let _ = ffi::group_end();
                    }
                    return Err(self.nccl("enqueueing the collective", code));
                }
            }
        }
        if grouped
            && ffi::group_end().map_err(|c| self.nccl("ncclGroupEnd", c))? == Progress::Pending
        {
            self.settle("ncclGroupEnd")?;
        }
        self.stream
            .record_event(None)
            .map(Some)
            .map_err(self.driver("recording a completion event"))
    }

    /// One look at the calls in flight (this context is the oldest's): hands those
    /// settled to `settled`, and fails when NCCL reports an error, a peer this rank needs is gone
    /// (`gone_since` keeps when it was first seen gone), the group was aborted, or a call
    /// is past its deadline. Returns when to look again (`None`: nothing left).
    pub(super) fn watch(
        &self,
        calls: &mut InFlight<OnStream>,
        now: Instant,
        predecessor: usize,
        gone_since: &mut Option<(usize, Instant)>,
        settled: impl FnMut(OnStream),
    ) -> Result<Option<Instant>, Error> {
        // NCCL's error first, as the waited call does: a call whose event fired while
        // NCCL reported an error must not be settled as done.
        if let Err(code) = self.comm.async_status() {
            return Err(self.nccl("a collective running on the GPU", code));
        }
        let verdict = calls.poll(
            now,
            |done| {
                done.event
                    .try_is_complete()
                    .map_err(self.driver("querying a completion event"))
            },
            |op| match self.control {
                Some(control) => control.try_fingerprint(op, predecessor),
                None => Ok(true),
            },
            settled,
        )?;
        if verdict == Watch::Idle {
            *gone_since = None;
            return Ok(None);
        }
        if let Some(record) = self.control.and_then(GroupControl::aborted) {
            return Err(Error::GroupBroken {
                rank: self.rank,
                cause: record.reason,
            });
        }
        if let Some(lost) = self.lost_peer(now, gone_since) {
            return Err(lost);
        }
        match verdict {
            Watch::Idle => Ok(None),
            Watch::Again(at) => Ok(Some(at)),
            Watch::Overdue {
                op,
                deadline,
                stage: Stage::Running,
            } => Err(self.timeout_of(&op, deadline)),
            Watch::Overdue {
                op,
                deadline,
                stage: Stage::Unconfirmed,
            } => Err(Error::Timeout {
                rank: self.rank,
                peer: predecessor,
                op,
                moved: 0,
                expected: 0,
                timeout: deadline.timeout(),
                gone: Vec::new(),
                cause: None,
            }),
        }
    }

    /// The error of `op`, due by `deadline`, not finished on the GPU in time.
    fn timeout_of(&self, op: &OpDesc, deadline: Deadline) -> Error {
        let detail = self.comm.last_error();
        DeviceError::Timeout {
            rank: self.rank,
            op: *op,
            timeout: deadline.timeout(),
            detail: if detail.is_empty() {
                String::new()
            } else {
                format!("; NCCL says: {detail}")
            },
        }
        .into()
    }

    /// A peer this operation needs, gone for [`PEER_FAILURE_GRACE`] by `now` (first seen
    /// gone at `gone_since`): it may have finished its part and exited, so a moment's
    /// absence is forgiven.
    fn lost_peer(&self, now: Instant, gone_since: &mut Option<(usize, Instant)>) -> Option<Error> {
        match (*gone_since, self.gone_peer()) {
            (_, None) => *gone_since = None,
            (None, Some(peer)) => *gone_since = Some((peer, now)),
            (Some((peer, since)), Some(_)) if now.duration_since(since) >= PEER_FAILURE_GRACE => {
                return Some(Error::PeerLost {
                    rank: peer,
                    observer: self.rank,
                    op: *self.op,
                    reason: format!(
                        "its process closed its connection to rank {} (killed or exited) \
                         while NCCL was still waiting for it",
                        self.rank
                    ),
                    gone: Vec::new(),
                });
            }
            _ => {}
        }
        None
    }

    /// Waits until the communicator has accepted a call it answered `ncclInProgress` to.
    pub(super) fn settle(&self, call: &str) -> Result<(), Error> {
        self.poll(|| {
            self.comm
                .async_status()
                .map(|p| p == Progress::Done)
                .map_err(|code| self.nccl(call, code))
        })
    }

    /// Polls `done` until it says so, with a short spin, then sleeps that grow to 1 ms;
    /// fails at the deadline or when a peer this operation needs has been gone for
    /// [`PEER_FAILURE_GRACE`] (it may have finished its part and exited).
    pub(super) fn poll(&self, mut done: impl FnMut() -> Result<bool, Error>) -> Result<(), Error> {
        let start = Instant::now();
        let mut next_liveness = start + LIVENESS_EVERY;
        let mut gone_since: Option<(usize, Instant)> = None;
        let mut nap = Duration::from_micros(5);
        loop {
            if done()? {
                return Ok(());
            }
            let now = Instant::now();
            if now >= self.deadline.at() {
                return Err(self.timeout_of(self.op, self.deadline));
            }
            if now >= next_liveness {
                next_liveness = now + LIVENESS_EVERY;
                if let Some(record) = self.control.and_then(GroupControl::aborted) {
                    // The runner turns this into the abort's own error.
                    return Err(Error::GroupBroken {
                        rank: self.rank,
                        cause: record.reason,
                    });
                }
                if let Some(lost) = self.lost_peer(now, &mut gone_since) {
                    return Err(lost);
                }
            }
            if now.duration_since(start) < Duration::from_micros(50) {
                thread::yield_now();
            } else {
                thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
    }

    /// A peer this operation needs whose process is gone, if any.
    fn gone_peer(&self) -> Option<usize> {
        match self.involved {
            Involved::One(peer) => self.peers.peer_gone(peer).then_some(peer),
            Involved::All => (0..self.world_size)
                .filter(|&p| p != self.rank)
                .find(|&p| self.peers.peer_gone(p)),
        }
    }
}
