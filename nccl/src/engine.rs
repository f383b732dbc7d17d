//! The NCCL engine: a live communicator, its stream and staging memory, running the
//! calls the group runner hands it; and its orderly (or aborted) teardown.

use std::fmt;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};
use ringccl_collectives::control::GroupControl;
use ringccl_collectives::hooks::{CallHooks, CallScope, NoHooks, Running};
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::{
    CollectiveKind, DType, Deadline, Engine, Error, OpDesc, ReduceOp, Request, Transport,
};
use tracing::warn;

use super::ffi::{Call, DeviceRegion, Progress, RawComm};
use super::in_flight::InFlight;
use super::poller::{Cx, Involved};
use super::staging::{in_place, scratch, through_staging, upload, Staging};
use ringccl_transports::TcpTransport;

/// The longest an orderly shutdown (`ncclCommFinalize`) may take before it is aborted.
const FINALIZE_LIMIT: Duration = Duration::from_secs(10);

/// The longest dropping a communicator takes: the orderly shutdown, then the abort.
pub const TEARDOWN_LIMIT: Duration =
    Duration::from_secs(FINALIZE_LIMIT.as_secs() + super::ffi::ABORT_LIMIT.as_secs());

/// A stream-ordered call's completion: the event that fires when the GPU has finished
/// it, and the hooks' token for it (a call left "on the device" until then).
pub(super) struct OnStream {
    pub(super) event: CudaEvent,
    record: Option<u64>,
}

/// One rank's NCCL communicator. Host buffers are staged through device memory: copied
/// to the GPU, reduced there by NCCL, copied back.
pub struct NcclEngine {
    rank: usize,
    world_size: usize,
    /// `None` once aborted.
    comm: Option<RawComm>,
    stream: Arc<CudaStream>,
    staging: Staging,
    /// Connections to every peer, idle, as a liveness channel.
    peers: TcpTransport,
    timeout: Duration,
    /// The group's shared state, once a runner has taken the engine.
    control: Option<Arc<GroupControl>>,
    /// Whoever watches the group.
    hooks: Arc<dyn CallHooks>,
    /// Stream-ordered calls handed to the GPU and not yet settled.
    in_flight: InFlight<OnStream>,
    /// A peer seen gone while calls were in flight, and since when.
    gone_since: Option<(usize, Instant)>,
}

impl NcclEngine {
    pub(super) fn new(
        rank: usize,
        world_size: usize,
        comm: RawComm,
        stream: Arc<CudaStream>,
        peers: TcpTransport,
        timeout: Duration,
    ) -> NcclEngine {
        NcclEngine {
            rank,
            world_size,
            comm: Some(comm),
            stream,
            staging: Staging::default(),
            peers,
            timeout,
            control: None,
            hooks: Arc::new(NoHooks),
            in_flight: InFlight::default(),
            gone_since: None,
        }
    }

    /// Runs `body` with the call's context, on this thread bound to the device.
    pub(super) fn with_cx<R>(
        &mut self,
        op: &OpDesc,
        involved: Involved,
        deadline: Deadline,
        body: impl FnOnce(&Cx<'_>, &mut Staging) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let Some(comm) = self.comm.as_ref() else {
            return Err(Error::GroupBroken {
                rank: self.rank,
                cause: "NCCL was shut down".into(),
            });
        };
        let cx = Cx {
            rank: self.rank,
            world_size: self.world_size,
            comm,
            stream: &self.stream,
            peers: &self.peers,
            op,
            involved,
            deadline,
            control: self.control.as_deref(),
        };
        self.stream
            .context()
            .bind_to_thread()
            // cudarc reports here, too, a failure it recorded earlier on this context
            // where it could not return one (freeing a buffer, recording an event).
            .map_err(cx.driver(
                "binding the CUDA context (or an earlier cudarc call on it that could not \
                 report its failure, such as a buffer's release)",
            ))?;
        body(&cx, &mut self.staging)
    }
}

/// Tells the hooks that call `done` has finished on the GPU (failed, with `error`).
fn device_finished(hooks: &dyn CallHooks, done: &OnStream, error: Option<&Error>) {
    if let Some(token) = done.record {
        hooks.device_finished(token, error);
    }
}

impl Engine for NcclEngine {
    fn execute(
        &mut self,
        op: &OpDesc,
        request: Request<'_>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        if request.is_empty() {
            return Ok(()); // NCCL needs no call to move nothing
        }
        let involved = request.peer().map_or(Involved::All, Involved::One);
        self.running(op, deadline, |engine| {
            engine.run_request(op, request, involved, deadline)
        })
    }

    fn failed_peers(&mut self) -> Vec<usize> {
        (0..self.world_size)
            .filter(|&p| p != self.rank && self.peers.peer_gone(p))
            .collect()
    }

    fn attach(&mut self, control: &Arc<GroupControl>) {
        if let Some(closer) = self.peers.closer() {
            control.add_closer(closer);
        }
        self.control = Some(Arc::clone(control));
    }

    fn attach_hooks(&mut self, hooks: &Arc<dyn CallHooks>) {
        self.hooks = Arc::clone(hooks);
    }

    fn abort(&mut self) {
        if let Some(comm) = self.comm.take() {
            comm.abort();
        }
        // Calls left on the device will never settle now: each is reported failed, so
        // that no observer shows them running forever.
        let error = Error::GroupBroken {
            rank: self.rank,
            cause: "the communicator was aborted while this call was on the GPU".into(),
        };
        for done in std::mem::take(&mut self.in_flight).iter() {
            // A call the GPU finished before the abort, not yet looked at, is done.
            let finished = matches!(done.event.try_is_complete(), Ok(true));
            device_finished(&*self.hooks, done, (!finished).then_some(&error));
        }
    }
}

impl NcclEngine {
    /// Runs `body`, the NCCL side of `op`, to completion on the GPU, publishing it as
    /// this rank's activity and, for a collective, checking that every rank runs the
    /// same one: NCCL does not check (ranks that disagree on the op or the element type,
    /// with the same count, get different results and no error), so each rank sends its
    /// description to the next rank over the control connections while NCCL runs, and
    /// compares the previous rank's with its own before it returns.
    ///
    /// Calls still in flight settle first, each within its own deadline: this call is
    /// queued behind them on the stream anyway, and its staging copies could otherwise
    /// wait on the host for them where no deadline reaches.
    pub(super) fn running(
        &mut self,
        op: &OpDesc,
        deadline: Deadline,
        body: impl FnOnce(&mut NcclEngine) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.wait_in_flight()?;
        self.published(op, deadline, |engine, checked| {
            body(engine)?;
            match &engine.control {
                Some(control) if checked => {
                    control.check_fingerprint(op, engine.predecessor(), deadline)
                }
                _ => Ok(()),
            }
        })
    }

    /// Runs `body`, which enqueues the NCCL side of `op` and returns the event of its
    /// completion, and returns without waiting for the GPU: the call joins the calls in
    /// flight, watched by [`NcclEngine::watch`] against its deadline, its fingerprint
    /// check included.
    pub(super) fn running_enqueued(
        &mut self,
        op: &OpDesc,
        deadline: Deadline,
        body: impl FnOnce(&mut NcclEngine) -> Result<Option<CudaEvent>, Error>,
    ) -> Result<(), Error> {
        self.published(op, deadline, |engine, checked| {
            if let Some(event) = body(engine)? {
                let record = engine.hooks.handed_to_device();
                let done = OnStream { event, record };
                engine.in_flight.push(*op, deadline, done, checked);
            }
            Ok(())
        })
    }

    /// The previous rank in rank order: whose fingerprint this rank compares.
    fn predecessor(&self) -> usize {
        (self.rank + self.world_size - 1) % self.world_size
    }

    /// Runs `body` as `op`, announced to the activity and the hooks, its fingerprint
    /// posted.
    /// `body` learns whether the fingerprint is to be checked (collectives in groups of
    /// more than one).
    fn published(
        &mut self,
        op: &OpDesc,
        deadline: Deadline,
        body: impl FnOnce(&mut NcclEngine, bool) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let control = self.control.clone();
        let hooks = Arc::clone(&self.hooks);
        // A group of one has nobody to compare with.
        let checked = op.kind != CollectiveKind::SendRecv && self.world_size > 1;
        let running = Running {
            op: *op,
            algorithm: Algorithm::Device,
            rank: self.rank,
            world_size: self.world_size,
            deadline,
        };
        let scope = CallScope::begin(control.as_deref(), &*hooks, running);
        if let (Some(control), true) = (&control, checked) {
            control.post_fingerprint(*op);
        }
        let result = body(self, checked && control.is_some());
        scope.end(None, &result);
        result
    }

    /// One look at the calls in flight at `now` (see [`Cx::watch`]): when to look again,
    /// `None` when none is left. Errors break the group.
    pub(super) fn watch(&mut self, now: Instant) -> Result<Option<Instant>, Error> {
        let Some((oldest, due, _)) = self.in_flight.oldest() else {
            return Ok(None);
        };
        let predecessor = self.predecessor();
        let hooks = Arc::clone(&self.hooks);
        let mut calls = std::mem::take(&mut self.in_flight);
        let mut gone_since = self.gone_since.take();
        let looked = self.with_cx(&oldest, Involved::All, due, |cx, _| {
            let settled = |done: OnStream| device_finished(&*hooks, &done, None);
            cx.watch(&mut calls, now, predecessor, &mut gone_since, settled)
        });
        match &looked {
            // The group breaks: no call left will settle. Each is recorded failed with
            // the error, which names the call it is about, and is forgotten.
            Err(error) => {
                for done in calls.iter() {
                    device_finished(&*hooks, done, Some(error));
                }
            }
            Ok(_) => self.in_flight = calls,
        }
        self.gone_since = gone_since;
        looked
    }

    /// Waits on this thread until every call in flight has settled, or one fails (each
    /// is bounded by its own deadline).
    pub(super) fn wait_in_flight(&mut self) -> Result<(), Error> {
        let mut nap = Duration::from_micros(5);
        loop {
            let now = Instant::now();
            let Some(again) = self.watch(now)? else {
                return Ok(());
            };
            thread::sleep(nap.min(again.saturating_duration_since(now)));
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    fn run_request(
        &mut self,
        op: &OpDesc,
        request: Request<'_>,
        involved: Involved,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let rank = self.rank;
        let world = self.world_size;
        self.with_cx(op, involved, deadline, |cx, staging| match request {
            Request::AllReduce { mut buf, op } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                in_place(
                    cx,
                    &mut staging.input,
                    buf.bytes_mut(),
                    true,
                    true,
                    |region| {
                        cx.launch(&[Call::AllReduce {
                            buf: region,
                            count,
                            dtype,
                            op,
                        }])
                    },
                )
            }
            Request::Broadcast { mut buf, root } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                let is_root = rank == root;
                let host = buf.bytes_mut();
                in_place(cx, &mut staging.input, host, is_root, !is_root, |region| {
                    cx.launch(&[Call::Broadcast {
                        buf: region,
                        count,
                        dtype,
                        root,
                    }])
                })
            }
            Request::Barrier => {
                let mut device = scratch(cx, &mut staging.output, 4)?;
                let region = DeviceRegion::writing(&mut device, cx.stream);
                cx.launch(&[Call::AllReduce {
                    buf: &region,
                    count: 1,
                    dtype: DType::F32,
                    op: ReduceOp::Sum,
                }])
            }
            Request::Reduce { mut buf, op, root } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                let host = buf.bytes_mut();
                in_place(cx, &mut staging.input, host, true, rank == root, |region| {
                    cx.launch(&[Call::Reduce {
                        buf: region,
                        count,
                        dtype,
                        op,
                        root,
                    }])
                })
            }
            Request::AllGather { input, mut output } => {
                let (dtype, count) = (input.dtype(), input.len());
                through_staging(cx, staging, input.bytes(), output.bytes_mut(), |i, o| {
                    cx.launch(&[Call::AllGather {
                        input: i,
                        output: o,
                        count,
                        dtype,
                    }])
                })
            }
            Request::ReduceScatter {
                input,
                mut output,
                op,
            } => {
                let (dtype, count) = (input.dtype(), output.len());
                through_staging(cx, staging, input.bytes(), output.bytes_mut(), |i, o| {
                    cx.launch(&[Call::ReduceScatter {
                        input: i,
                        output: o,
                        count,
                        dtype,
                        op,
                    }])
                })
            }
            Request::AllToAll { input, mut output } => {
                let dtype = input.dtype();
                let block = input.len() / world;
                through_staging(cx, staging, input.bytes(), output.bytes_mut(), |i, o| {
                    let mut calls = Vec::with_capacity(2 * world);
                    for peer in 0..world {
                        let at = peer * block;
                        calls.push(Call::Send {
                            buf: i,
                            at,
                            count: block,
                            dtype,
                            peer,
                        });
                        calls.push(Call::Recv {
                            buf: o,
                            at,
                            count: block,
                            dtype,
                            peer,
                        });
                    }
                    cx.launch(&calls)
                })
            }
            Request::Send { buf, peer, .. } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                let mut device = upload(cx, &mut staging.input, buf.bytes())?;
                let region = DeviceRegion::writing(&mut device, cx.stream);
                cx.launch(&[Call::Send {
                    buf: &region,
                    at: 0,
                    count,
                    dtype,
                    peer,
                }])
            }
            Request::Recv { mut buf, peer, .. } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                let host = buf.bytes_mut();
                in_place(cx, &mut staging.output, host, false, true, |region| {
                    cx.launch(&[Call::Recv {
                        buf: region,
                        at: 0,
                        count,
                        dtype,
                        peer,
                    }])
                })
            }
            // `Request` is non-exhaustive: a call this engine does not know is refused.
            #[allow(unreachable_patterns)] // reachable only once `Request` grows
            other => Err(Error::InvalidArgument(format!(
                "rank {rank}: the nccl backend cannot run {:?}",
                other.kind()
            ))),
        })
    }
}

impl Drop for NcclEngine {
    fn drop(&mut self) {
        let Some(comm) = self.comm.take() else {
            return; // aborted when the group broke
        };
        if self.in_flight.len() > 0 {
            warn!(
                rank = self.rank,
                calls = self.in_flight.len(),
                "the group is dropped with calls still in flight on the GPU: NCCL's \
                 shutdown finishes them, but their errors and same-collective checks go \
                 unreported; synchronize (DeviceDdp::synchronize) before dropping the group"
            );
        }
        if self.stream.context().bind_to_thread().is_err() {
            comm.abort();
            return;
        }
        // Orderly: flush outstanding work, then free; abort if that does not finish.
        let limit = Instant::now() + FINALIZE_LIMIT.min(self.timeout);
        let mut finalized = comm.start_finalize().map(|p| p == Progress::Done);
        while finalized == Ok(false) && Instant::now() < limit {
            thread::sleep(Duration::from_micros(200));
            finalized = comm.async_status().map(|p| p == Progress::Done);
        }
        match finalized {
            Ok(true) => {
                if let Err(code) = comm.destroy() {
                    warn!(
                        rank = self.rank,
                        error = %code.describe(),
                        "ncclCommDestroy failed"
                    );
                }
            }
            _ => comm.abort(),
        }
    }
}

impl fmt::Debug for NcclEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclEngine")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("aborted", &self.comm.is_none())
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}
