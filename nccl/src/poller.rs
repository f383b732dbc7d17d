//! One NCCL call's context: enqueueing it, and polling it to completion against its
//! deadline and its peers' liveness (NCCL has no deadline of its own).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, DriverError};
use ringccl_collectives::control::GroupControl;
use ringccl_collectives::{Deadline, Error, OpDesc, PEER_FAILURE_GRACE};

use super::ffi::{self, Call, NcclCode, Progress, RawComm};
use crate::DeviceError;
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

    /// Enqueues `calls` on the communicator's stream (as one NCCL group when there are
    /// several) and waits, within the deadline, until the GPU has finished them.
    pub(super) fn launch(&self, calls: &[Call<'_, '_>]) -> Result<(), Error> {
        if calls.is_empty() {
            return Ok(());
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
        let event = self
            .stream
            .record_event(None)
            .map_err(self.driver("recording a completion event"))?;
        self.poll(|| {
            if let Err(code) = self.comm.async_status() {
                return Err(self.nccl("the running collective", code));
            }
            event
                .try_is_complete()
                .map_err(self.driver("querying the completion event"))
        })
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
                let detail = self.comm.last_error();
                return Err(DeviceError::Timeout {
                    rank: self.rank,
                    op: *self.op,
                    timeout: self.deadline.timeout(),
                    detail: if detail.is_empty() {
                        String::new()
                    } else {
                        format!("; NCCL says: {detail}")
                    },
                }
                .into());
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
                match (gone_since, self.gone_peer()) {
                    (None, Some(peer)) => gone_since = Some((peer, now)),
                    (Some((peer, since)), _) if now.duration_since(since) >= PEER_FAILURE_GRACE => {
                        return Err(Error::PeerLost {
                            rank: peer,
                            observer: self.rank,
                            op: *self.op,
                            reason: format!(
                                "its process closed its connection to rank {} (killed or \
                                 exited) while NCCL was still waiting for it",
                                self.rank
                            ),
                            gone: Vec::new(),
                        });
                    }
                    _ => {}
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
