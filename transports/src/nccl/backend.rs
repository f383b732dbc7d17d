//! The `"nccl"` backend: an NCCL communicator with a deadline on every call.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaViewMut, DeviceRepr, DriverError, ValidAsZeroBits,
};
use ringccl_collectives::{
    validate_blocks, validate_reduce, validate_root, Backend, BufferMut, BufferRef, CollectiveKind,
    Element, Error, OpDesc, ReduceOp,
};
use tracing::warn;

use super::ffi::{self, Call, DeviceRegion, NcclCode, Progress, RawComm, UNIQUE_ID_LEN};
use super::libraries::{check_driver_library, check_nccl_library};
use crate::{connect_mesh, InitOptions, TcpTransport};

/// The oldest NCCL this backend drives (non-blocking communicators, `ncclCommFinalize`,
/// `ncclGetLastError`, bf16 and `ncclAvg` are all older).
const MIN_NCCL_VERSION: i32 = 21800;
const ID_KEY: &str = "ringccl/nccl/id";
/// How often a waiting rank checks that its peers' processes are still alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);
/// How long an operation may keep running after a peer's process is seen gone (it may
/// have finished its part and exited) before the peer is declared lost.
const GONE_PEER_GRACE: Duration = Duration::from_secs(2);
/// The longest an orderly shutdown (`ncclCommFinalize`) may take before it is aborted.
const FINALIZE_LIMIT: Duration = Duration::from_secs(10);

/// Element types NCCL and CUDA memory both handle: all eight [`Element`] types.
pub trait DeviceElement: Element + DeviceRepr + ValidAsZeroBits {}

impl<T: Element + DeviceRepr + ValidAsZeroBits> DeviceElement for T {}

/// The number of CUDA devices this process sees, or an error that says why there are
/// none (no driver library, a failing driver, no device). Never panics.
pub fn cuda_device_count() -> Result<usize, Error> {
    let unavailable = |reason: String| Error::BackendUnavailable {
        backend: "nccl",
        reason,
    };
    check_driver_library().map_err(unavailable)?;
    let count = CudaContext::device_count()
        .map_err(|e| unavailable(format!("the CUDA driver loaded but failed: {e}")))?;
    match usize::try_from(count) {
        Ok(count) if count > 0 => Ok(count),
        _ => Err(unavailable(
            "the CUDA driver loaded but sees no device (check nvidia-smi and \
             CUDA_VISIBLE_DEVICES)"
                .into(),
        )),
    }
}

/// One rank's NCCL communicator, behind the same [`Backend`] interface as the CPU backend.
///
/// * Host buffers (the [`Backend`] methods) are staged through device memory: copied to
///   the GPU, reduced there by NCCL, copied back.
/// * Device buffers (`CudaSlice<T>`, the `*_device` methods) go to NCCL directly.
///
/// NCCL has no deadline of its own. The communicator is non-blocking; every call is
/// polled (`ncclCommGetAsyncError` and a CUDA event) until it finishes, the group's
/// deadline passes, or a peer's process is seen gone (a TCP connection to every peer is
/// kept as a liveness channel). In the last two cases the communicator is aborted and
/// the call returns [`Error::DeviceTimeout`] or [`Error::PeerLost`]; later calls return
/// [`Error::GroupBroken`]. Dropping the backend shuts NCCL down in an orderly way (or
/// aborts it) and never panics.
///
/// NCCL does not check that ranks issue the same collectives; a mismatch ends in the
/// deadline. Point-to-point tags are not carried by NCCL: messages between two ranks
/// match in order, and the tag is not checked.
pub struct NcclBackend {
    rank: usize,
    world_size: usize,
    device: usize,
    timeout: Duration,
    stream: Arc<CudaStream>,
    state: Mutex<State>,
}

struct State {
    comm: Option<RawComm>,
    broken: Option<String>,
    seq: u64,
    staging: Staging,
    peers: TcpTransport,
    call_timeout: Option<Duration>,
}

/// Device memory that host buffers pass through, kept between calls.
#[derive(Default)]
struct Staging {
    input: Option<CudaSlice<u8>>,
    output: Option<CudaSlice<u8>>,
}

/// Which peers an operation depends on.
#[derive(Clone, Copy)]
enum Involved {
    All,
    One(usize),
}

impl NcclBackend {
    /// Checks that libcuda and libnccl load and that a CUDA device is visible, without
    /// touching the network. Returns the number of devices, or the error
    /// `init_process_group("nccl", ..)` would return, which says what to install or set.
    pub fn probe() -> Result<usize, Error> {
        let unavailable = |reason: String| Error::BackendUnavailable {
            backend: "nccl",
            reason,
        };
        let count = cuda_device_count()?;
        check_nccl_library().map_err(unavailable)?;
        let version = ffi::nccl_version()
            .map_err(|code| unavailable(format!("ncclGetVersion failed: {}", code.describe())))?;
        if version < MIN_NCCL_VERSION {
            return Err(unavailable(format!(
                "NCCL {} is loaded but ringccl needs NCCL 2.18 or newer; put a newer \
                 libnccl first on LD_LIBRARY_PATH",
                version_text(version)
            )));
        }
        Ok(count)
    }

    /// Joins the group described by `opts` (the same options and rendezvous as the CPU
    /// backend). Rank 0 makes the NCCL unique id and shares it through the rendezvous
    /// store; every rank then opens its communicator on device `opts.get_device()`, or
    /// `(local rank or rank) % device_count`.
    pub fn connect(opts: InitOptions) -> Result<NcclBackend, Error> {
        opts.validate()?;
        let device_count = NcclBackend::probe()?;
        let rank = opts.rank();
        let world_size = opts.world_size();
        let timeout = opts.get_timeout();
        let device = match opts.get_device() {
            Some(d) if d >= device_count => {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank}: CUDA device {d} was requested but only {device_count} \
                     device(s) are visible (after CUDA_VISIBLE_DEVICES)"
                )))
            }
            Some(d) => d,
            None => opts.get_local_rank().unwrap_or(rank) % device_count,
        };
        let startup_error = |call: &str, reason: String| Error::Device {
            rank,
            op: format!("NCCL start-up on cuda:{device}"),
            call: call.to_string(),
            reason,
        };
        let driver = |call: &'static str| move |e: DriverError| startup_error(call, e.to_string());
        let ctx = CudaContext::new(device).map_err(driver("creating the CUDA context"))?;
        let stream = ctx
            .new_stream()
            .map_err(driver("creating the NCCL stream"))?;

        let deadline = Instant::now() + timeout;
        let mut peers = connect_mesh(opts)?;
        let id = share_unique_id(&mut peers, rank, deadline)?;
        peers.release_store(deadline).map_err(|source| Error::Io {
            rank,
            context: "finishing NCCL start-up (telling rank 0 the store is no longer needed)"
                .into(),
            source,
        })?;

        ctx.bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        let comm = RawComm::start_init(world_size, rank, &id)
            .map_err(|code| startup_error("ncclCommInitRankConfig", code.describe()))?;
        let backend = NcclBackend {
            rank,
            world_size,
            device,
            timeout,
            stream,
            state: Mutex::new(State {
                comm: None,
                broken: None,
                seq: 0,
                staging: Staging::default(),
                peers,
                call_timeout: None,
            }),
        };
        {
            let mut state = backend.lock()?;
            let op = OpDesc::barrier(0);
            let cx = Cx {
                backend: &backend,
                comm: &comm,
                peers: &state.peers,
                op: &op,
                involved: Involved::All,
                deadline,
                timeout,
            };
            let ready = cx.poll(|| {
                Ok(comm
                    .async_status()
                    .map_err(|c| cx.nccl("ncclCommInitRankConfig", c))?
                    == Progress::Done)
            });
            if let Err(e) = ready {
                comm.abort();
                return Err(match e {
                    Error::DeviceTimeout { .. } => Error::RendezvousTimeout {
                        rank,
                        waiting_for: "every rank to join the NCCL communicator".into(),
                        timeout,
                    },
                    other => other,
                });
            }
            state.comm = Some(comm);
        }
        Ok(backend)
    }

    /// The CUDA device this rank's communicator runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The stream NCCL work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, Error> {
        self.state.lock().map_err(|_| Error::GroupBroken {
            rank: self.rank,
            cause: "a thread panicked inside an NCCL call".into(),
        })
    }

    /// Runs one operation: numbers it, gives `body` the communicator, and breaks the
    /// group (aborting NCCL) if it fails in a way that leaves NCCL in an unknown state.
    fn run(
        &self,
        involved: Involved,
        describe: impl FnOnce(u64) -> OpDesc,
        body: impl FnOnce(&Cx<'_>, &mut Staging) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut guard = self.lock()?;
        let State {
            comm,
            broken,
            seq,
            staging,
            peers,
            call_timeout,
        } = &mut *guard;
        let (None, Some(live)) = (broken.as_ref(), comm.as_ref()) else {
            return Err(Error::GroupBroken {
                rank: self.rank,
                cause: broken
                    .clone()
                    .unwrap_or_else(|| "NCCL was shut down".into()),
            });
        };
        *seq += 1;
        let op = describe(*seq);
        let timeout = call_timeout.unwrap_or(self.timeout);
        let cx = Cx {
            backend: self,
            comm: live,
            peers,
            op: &op,
            involved,
            deadline: Instant::now() + timeout,
            timeout,
        };
        let result = self
            .stream
            .context()
            .bind_to_thread()
            .map_err(cx.driver("binding the CUDA context"))
            .and_then(|()| body(&cx, staging));
        if let Err(e) = &result {
            if e.breaks_group() {
                *broken = Some(e.to_string());
                if let Some(comm) = comm.take() {
                    comm.abort();
                }
            }
        }
        result
    }

    fn check_device<T>(&self, what: &str, slice: &CudaSlice<T>) -> Result<(), Error> {
        if slice.ordinal() != self.device {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {what}: the buffer is on cuda:{} but this rank's NCCL communicator \
                 is on cuda:{}; allocate it on the communicator's device (see \
                 InitOptions::device)",
                self.rank,
                slice.ordinal(),
                self.device
            )));
        }
        Ok(())
    }

    fn check_peer(&self, peer: usize, what: &str) -> Result<(), Error> {
        validate_root(peer, self.world_size)?;
        if peer == self.rank {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {what} names itself as the peer",
                self.rank
            )));
        }
        Ok(())
    }

    /// All-reduces a device buffer in place; see [`Backend::all_reduce`].
    pub fn all_reduce_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        validate_reduce(T::DTYPE, op)?;
        self.check_device("all_reduce", buf)?;
        let count = buf.len();
        self.run(
            Involved::All,
            |seq| OpDesc::all_reduce(seq, T::DTYPE, count, op),
            |cx, _| {
                let region = DeviceRegion::writing(buf, &cx.backend.stream);
                cx.launch(&[Call::AllReduce {
                    buf: &region,
                    count,
                    dtype: T::DTYPE,
                    op,
                }])
            },
        )
    }

    /// Broadcasts a device buffer from `root`; see [`Backend::broadcast`].
    pub fn broadcast_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<(), Error> {
        validate_root(root, self.world_size)?;
        self.check_device("broadcast", buf)?;
        let count = buf.len();
        self.run(
            Involved::All,
            |seq| OpDesc::broadcast(seq, T::DTYPE, count, root),
            |cx, _| {
                let region = DeviceRegion::writing(buf, &cx.backend.stream);
                cx.launch(&[Call::Broadcast {
                    buf: &region,
                    count,
                    dtype: T::DTYPE,
                    root,
                }])
            },
        )
    }

    /// Reduces a device buffer into `root`'s; see [`Backend::reduce`].
    pub fn reduce_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), Error> {
        validate_reduce(T::DTYPE, op)?;
        validate_root(root, self.world_size)?;
        self.check_device("reduce", buf)?;
        let count = buf.len();
        self.run(
            Involved::All,
            |seq| {
                OpDesc::new(
                    seq,
                    CollectiveKind::Reduce,
                    T::DTYPE,
                    count,
                    Some(op),
                    Some(root),
                )
            },
            |cx, _| {
                let region = DeviceRegion::writing(buf, &cx.backend.stream);
                cx.launch(&[Call::Reduce {
                    buf: &region,
                    count,
                    dtype: T::DTYPE,
                    op,
                    root,
                }])
            },
        )
    }

    /// All-gathers device buffers; see [`Backend::all_gather`].
    pub fn all_gather_device<T: DeviceElement>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
    ) -> Result<(), Error> {
        let (n, m) = (input.len(), output.len());
        validate_blocks("all_gather", T::DTYPE, T::DTYPE, n, m, self.world_size)?;
        self.check_device("all_gather", input)?;
        self.check_device("all_gather", output)?;
        self.run(
            Involved::All,
            |seq| OpDesc::new(seq, CollectiveKind::AllGather, T::DTYPE, n, None, None),
            |cx, _| {
                let stream = &cx.backend.stream;
                let (input, output) = (
                    DeviceRegion::reading(input, stream),
                    DeviceRegion::writing(output, stream),
                );
                cx.launch(&[Call::AllGather {
                    input: &input,
                    output: &output,
                    count: n,
                    dtype: T::DTYPE,
                }])
            },
        )
    }

    /// Reduce-scatters device buffers; see [`Backend::reduce_scatter`].
    pub fn reduce_scatter_device<T: DeviceElement>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        validate_reduce(T::DTYPE, op)?;
        let (n, m) = (input.len(), output.len());
        validate_blocks("reduce_scatter", T::DTYPE, T::DTYPE, m, n, self.world_size)?;
        self.check_device("reduce_scatter", input)?;
        self.check_device("reduce_scatter", output)?;
        self.run(
            Involved::All,
            |seq| {
                OpDesc::new(
                    seq,
                    CollectiveKind::ReduceScatter,
                    T::DTYPE,
                    n,
                    Some(op),
                    None,
                )
            },
            |cx, _| {
                let stream = &cx.backend.stream;
                let (input, output) = (
                    DeviceRegion::reading(input, stream),
                    DeviceRegion::writing(output, stream),
                );
                cx.launch(&[Call::ReduceScatter {
                    input: &input,
                    output: &output,
                    count: m,
                    dtype: T::DTYPE,
                    op,
                }])
            },
        )
    }
}

/// One operation's view of the backend: the live communicator, its deadline, and who it
/// waits for.
struct Cx<'a> {
    backend: &'a NcclBackend,
    comm: &'a RawComm,
    peers: &'a TcpTransport,
    op: &'a OpDesc,
    involved: Involved,
    deadline: Instant,
    timeout: Duration,
}

impl Cx<'_> {
    fn nccl(&self, call: &str, code: NcclCode) -> Error {
        let detail = self.comm.last_error();
        let hint = if code.is_remote() {
            "a peer or the network failed; the group is broken, create a new one"
        } else {
            "set NCCL_DEBUG=WARN for NCCL's own diagnosis"
        };
        Error::Device {
            rank: self.backend.rank,
            op: self.op.to_string(),
            call: call.to_string(),
            reason: if detail.is_empty() {
                format!("{} ({hint})", code.describe())
            } else {
                format!("{} — {detail} ({hint})", code.describe())
            },
        }
    }

    fn driver<'s>(&'s self, call: &'s str) -> impl Fn(DriverError) -> Error + 's {
        move |e| Error::Device {
            rank: self.backend.rank,
            op: self.op.to_string(),
            call: call.to_string(),
            reason: format!("{e}"),
        }
    }

    /// Enqueues `calls` on the communicator's stream (as one NCCL group when there are
    /// several) and waits, within the deadline, until the GPU has finished them.
    fn launch(&self, calls: &[Call<'_, '_>]) -> Result<(), Error> {
        if calls.is_empty() {
            return Ok(());
        }
        let stream = &self.backend.stream;
        let grouped = calls.len() > 1;
        if grouped {
            ffi::group_start().map_err(|c| self.nccl("ncclGroupStart", c))?;
        }
        for call in calls {
            match self.comm.enqueue(call, stream) {
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
        let event = stream
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
    fn settle(&self, call: &str) -> Result<(), Error> {
        self.poll(|| {
            self.comm
                .async_status()
                .map(|p| p == Progress::Done)
                .map_err(|code| self.nccl(call, code))
        })
    }

    /// Polls `done` until it says so, with a short spin, then sleeps that grow to 1 ms;
    /// fails at the deadline or when a peer this operation needs is gone.
    fn poll(&self, mut done: impl FnMut() -> Result<bool, Error>) -> Result<(), Error> {
        let start = Instant::now();
        let mut next_liveness = start + LIVENESS_EVERY;
        let mut gone_since: Option<(usize, Instant)> = None;
        let mut nap = Duration::from_micros(5);
        loop {
            if done()? {
                return Ok(());
            }
            let now = Instant::now();
            if now >= self.deadline {
                let detail = self.comm.last_error();
                return Err(Error::DeviceTimeout {
                    rank: self.backend.rank,
                    op: *self.op,
                    timeout: self.timeout,
                    detail: if detail.is_empty() {
                        String::new()
                    } else {
                        format!("; NCCL says: {detail}")
                    },
                });
            }
            if now >= next_liveness {
                next_liveness = now + LIVENESS_EVERY;
                match (gone_since, self.gone_peer()) {
                    (None, Some(peer)) => gone_since = Some((peer, now)),
                    (Some((peer, since)), _) if now.duration_since(since) >= GONE_PEER_GRACE => {
                        return Err(Error::PeerLost {
                            rank: peer,
                            observer: self.backend.rank,
                            op: *self.op,
                            reason: format!(
                                "its process closed its connection to rank {} (killed or \
                                 exited) while NCCL was still waiting for it",
                                self.backend.rank
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
        let me = self.backend.rank;
        match self.involved {
            Involved::One(peer) => self.peers.peer_gone(peer).then_some(peer),
            Involved::All => (0..self.backend.world_size)
                .filter(|&p| p != me)
                .find(|&p| self.peers.peer_gone(p)),
        }
    }
}

/// Device memory of at least `bytes` in `slot` (grown when too small), as a view of
/// exactly `bytes`.
fn staged<'s>(
    slot: &'s mut Option<CudaSlice<u8>>,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<CudaViewMut<'s, u8>, DriverError> {
    let buffer = match slot.take() {
        Some(buffer) if buffer.len() >= bytes => buffer,
        too_small => {
            drop(too_small); // free it before allocating the bigger one
            stream.alloc_zeros::<u8>(bytes.max(1))?
        }
    };
    Ok(slot.insert(buffer).slice_mut(0..bytes))
}

/// Copies `host` into the staging slot (on the communicator's stream).
fn upload<'s>(
    cx: &Cx<'_>,
    slot: &'s mut Option<CudaSlice<u8>>,
    host: &[u8],
) -> Result<CudaViewMut<'s, u8>, Error> {
    let stream = &cx.backend.stream;
    let mut device =
        staged(slot, stream, host.len()).map_err(cx.driver("allocating staging memory"))?;
    stream
        .memcpy_htod(host, &mut device)
        .map_err(cx.driver("copying the buffer to the GPU"))?;
    Ok(device)
}

/// Copies the staged result back into `host`.
fn download(cx: &Cx<'_>, device: &CudaViewMut<'_, u8>, host: &mut [u8]) -> Result<(), Error> {
    let stream = &cx.backend.stream;
    stream
        .memcpy_dtoh(device, host)
        .map_err(cx.driver("copying the result from the GPU"))?;
    stream
        .synchronize()
        .map_err(cx.driver("waiting for the copy from the GPU"))
}

/// Stages `input` and an output of `output.len()` bytes through device memory: copies
/// the input in, hands both regions to `launch`, copies the output back.
fn through_staging(
    cx: &Cx<'_>,
    staging: &mut Staging,
    input: &[u8],
    output: &mut [u8],
    launch: impl FnOnce(&DeviceRegion<'_>, &DeviceRegion<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    let stream = &cx.backend.stream;
    let mut device_in = upload(cx, &mut staging.input, input)?;
    let mut device_out = staged(&mut staging.output, stream, output.len())
        .map_err(cx.driver("allocating staging memory"))?;
    {
        let input = DeviceRegion::writing(&mut device_in, stream);
        let output = DeviceRegion::writing(&mut device_out, stream);
        launch(&input, &output)?;
    }
    download(cx, &device_out, output)
}

impl Backend for NcclBackend {
    fn name(&self) -> &str {
        "nccl"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce(&self, mut buf: BufferMut<'_>, op: ReduceOp) -> Result<(), Error> {
        let (dtype, count) = (buf.dtype(), buf.len());
        validate_reduce(dtype, op)?;
        self.run(
            Involved::All,
            |seq| OpDesc::all_reduce(seq, dtype, count, op),
            |cx, staging| {
                if count == 0 {
                    return Ok(());
                }
                let host = buf.bytes_mut();
                let mut device = upload(cx, &mut staging.input, host)?;
                {
                    let region = DeviceRegion::writing(&mut device, &cx.backend.stream);
                    cx.launch(&[Call::AllReduce {
                        buf: &region,
                        count,
                        dtype,
                        op,
                    }])?;
                }
                download(cx, &device, host)
            },
        )
    }

    fn broadcast(&self, mut buf: BufferMut<'_>, root: usize) -> Result<(), Error> {
        let (dtype, count) = (buf.dtype(), buf.len());
        validate_root(root, self.world_size)?;
        self.run(
            Involved::All,
            |seq| OpDesc::broadcast(seq, dtype, count, root),
            |cx, staging| {
                if count == 0 {
                    return Ok(());
                }
                let host = buf.bytes_mut();
                let mut device = if self.rank == root {
                    upload(cx, &mut staging.input, host)?
                } else {
                    staged(&mut staging.input, &cx.backend.stream, host.len())
                        .map_err(cx.driver("allocating staging memory"))?
                };
                {
                    let region = DeviceRegion::writing(&mut device, &cx.backend.stream);
                    cx.launch(&[Call::Broadcast {
                        buf: &region,
                        count,
                        dtype,
                        root,
                    }])?;
                }
                if self.rank == root {
                    return Ok(());
                }
                download(cx, &device, host)
            },
        )
    }

    fn set_call_timeout(&self, timeout: Option<Duration>) {
        if let Ok(mut state) = self.state.lock() {
            state.call_timeout = timeout;
        }
    }

    fn barrier(&self) -> Result<(), Error> {
        self.run(Involved::All, OpDesc::barrier, |cx, staging| {
            let mut device = staged(&mut staging.output, &cx.backend.stream, 4)
                .map_err(cx.driver("allocating staging memory"))?;
            let region = DeviceRegion::writing(&mut device, &cx.backend.stream);
            cx.launch(&[Call::AllReduce {
                buf: &region,
                count: 1,
                dtype: ringccl_collectives::DType::F32,
                op: ReduceOp::Sum,
            }])
        })
    }

    fn reduce(&self, mut buf: BufferMut<'_>, op: ReduceOp, root: usize) -> Result<(), Error> {
        let (dtype, count) = (buf.dtype(), buf.len());
        validate_reduce(dtype, op)?;
        validate_root(root, self.world_size)?;
        self.run(
            Involved::All,
            |seq| {
                OpDesc::new(
                    seq,
                    CollectiveKind::Reduce,
                    dtype,
                    count,
                    Some(op),
                    Some(root),
                )
            },
            |cx, staging| {
                if count == 0 {
                    return Ok(());
                }
                let host = buf.bytes_mut();
                let mut device = upload(cx, &mut staging.input, host)?;
                {
                    let region = DeviceRegion::writing(&mut device, &cx.backend.stream);
                    cx.launch(&[Call::Reduce {
                        buf: &region,
                        count,
                        dtype,
                        op,
                        root,
                    }])?;
                }
                if self.rank != root {
                    return Ok(());
                }
                download(cx, &device, host)
            },
        )
    }

    fn all_gather(&self, input: BufferRef<'_>, mut output: BufferMut<'_>) -> Result<(), Error> {
        let (dtype, n) = (input.dtype(), input.len());
        validate_blocks(
            "all_gather",
            dtype,
            output.dtype(),
            n,
            output.len(),
            self.world_size,
        )?;
        self.run(
            Involved::All,
            |seq| OpDesc::new(seq, CollectiveKind::AllGather, dtype, n, None, None),
            |cx, staging| {
                if n == 0 {
                    return Ok(());
                }
                through_staging(cx, staging, input.bytes(), output.bytes_mut(), |i, o| {
                    cx.launch(&[Call::AllGather {
                        input: i,
                        output: o,
                        count: n,
                        dtype,
                    }])
                })
            },
        )
    }

    fn reduce_scatter(
        &self,
        input: BufferRef<'_>,
        mut output: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        let (dtype, n, m) = (input.dtype(), input.len(), output.len());
        validate_reduce(dtype, op)?;
        validate_blocks(
            "reduce_scatter",
            dtype,
            output.dtype(),
            m,
            n,
            self.world_size,
        )?;
        self.run(
            Involved::All,
            |seq| OpDesc::new(seq, CollectiveKind::ReduceScatter, dtype, n, Some(op), None),
            |cx, staging| {
                if m == 0 {
                    return Ok(());
                }
                through_staging(cx, staging, input.bytes(), output.bytes_mut(), |i, o| {
                    cx.launch(&[Call::ReduceScatter {
                        input: i,
                        output: o,
                        count: m,
                        dtype,
                        op,
                    }])
                })
            },
        )
    }

    fn all_to_all(&self, input: BufferRef<'_>, mut output: BufferMut<'_>) -> Result<(), Error> {
        let (dtype, n) = (input.dtype(), input.len());
        validate_blocks("all_to_all", dtype, output.dtype(), n, output.len(), 1)?;
        let block = n / self.world_size;
        validate_blocks("all_to_all", dtype, dtype, block, n, self.world_size)?;
        self.run(
            Involved::All,
            |seq| OpDesc::new(seq, CollectiveKind::AllToAll, dtype, n, None, None),
            |cx, staging| {
                if block == 0 {
                    return Ok(());
                }
                let world = self.world_size;
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
            },
        )
    }

    fn send(&self, buf: BufferRef<'_>, dst: usize, tag: u32) -> Result<(), Error> {
        self.check_peer(dst, "send")?;
        let (dtype, count) = (buf.dtype(), buf.len());
        self.run(
            Involved::One(dst),
            |seq| OpDesc::send_recv(seq, dtype, count, tag),
            |cx, staging| {
                if count == 0 {
                    return Ok(());
                }
                let mut device = upload(cx, &mut staging.input, buf.bytes())?;
                let region = DeviceRegion::writing(&mut device, &cx.backend.stream);
                cx.launch(&[Call::Send {
                    buf: &region,
                    at: 0,
                    count,
                    dtype,
                    peer: dst,
                }])
            },
        )
    }

    fn recv(&self, mut buf: BufferMut<'_>, src: usize, tag: u32) -> Result<(), Error> {
        self.check_peer(src, "recv")?;
        let (dtype, count) = (buf.dtype(), buf.len());
        self.run(
            Involved::One(src),
            |seq| OpDesc::send_recv(seq, dtype, count, tag),
            |cx, staging| {
                if count == 0 {
                    return Ok(());
                }
                let host = buf.bytes_mut();
                let mut device = staged(&mut staging.output, &cx.backend.stream, host.len())
                    .map_err(cx.driver("allocating staging memory"))?;
                {
                    let region = DeviceRegion::writing(&mut device, &cx.backend.stream);
                    cx.launch(&[Call::Recv {
                        buf: &region,
                        at: 0,
                        count,
                        dtype,
                        peer: src,
                    }])?;
                }
                download(cx, &device, host)
            },
        )
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        let state = match self.state.get_mut() {
            Ok(state) => state,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Some(comm) = state.comm.take() else {
            return;
        };
        if state.broken.is_some() || self.stream.context().bind_to_thread().is_err() {
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

impl fmt::Debug for NcclBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclBackend")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// NCCL's version code as `major.minor.patch`.
fn version_text(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

/// Rank 0 makes the unique id (or records why it could not); the others read it.
fn share_unique_id(
    peers: &mut TcpTransport,
    rank: usize,
    deadline: Instant,
) -> Result<[u8; UNIQUE_ID_LEN], Error> {
    let Some(store) = peers.store.as_mut() else {
        return Err(Error::Handshake {
            rank,
            peer: "rendezvous store".into(),
            reason: "the store connection is gone".into(),
        });
    };
    let raw = if rank == 0 {
        match ffi::new_unique_id() {
            Ok(id) => {
                store.set(ID_KEY, &id)?;
                id.to_vec()
            }
            Err(code) => {
                let reason = format!("ncclGetUniqueId failed: {}", code.describe());
                store.set(ID_KEY, format!("error: {reason}").as_bytes())?;
                return Err(Error::Device {
                    rank,
                    op: "NCCL start-up".into(),
                    call: "ncclGetUniqueId".into(),
                    reason: code.describe(),
                });
            }
        }
    } else {
        store.wait(ID_KEY, deadline, &|| {
            "rank 0 to publish the NCCL unique id".into()
        })?
    };
    raw.as_slice().try_into().map_err(|_| Error::Handshake {
        rank,
        peer: "rank 0".into(),
        reason: format!(
            "rank 0 could not start NCCL ({})",
            String::from_utf8_lossy(&raw).trim_start_matches("error: ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_as_dotted_versions() {
        assert_eq!(version_text(22803), "2.28.3");
        assert_eq!(version_text(MIN_NCCL_VERSION), "2.18.0");
    }
}
