//! The typed, user-facing handle on a group of ranks.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringccl_collectives::bucket::plan_buckets;
use ringccl_collectives::{
    validate_reduce, Backend, BufferMut, BufferRef, Deadline, Element, HostBackend, HostConfig,
    ReduceOp,
};
use ringccl_rendezvous::{connect_mesh, KeptStore, SetupError};
use ringccl_transports::{shm, ShmTransport, TcpTransport, DEFAULT_RING_BYTES};

use crate::options::{InitOptions, TransportKind};
use crate::sequencer::Sequencer;
use crate::work::Work;
use crate::worker::{Job, Worker};
use crate::Error;

/// The backend names [`init_process_group`] accepts (case-insensitive).
pub const BACKENDS: &[&str] = &["gloo", "nccl"];

/// How many fused buckets [`ProcessGroup::all_reduce_bucketed`] keeps on the wire while
/// it packs the next one.
const BUCKETS_IN_FLIGHT: usize = 2;

/// Joins the process group described by `opts` using the backend named `backend`
/// (`"gloo"` or `"nccl"`, case-insensitive).
///
/// Every rank of the group must call this; it returns once this rank is connected to
/// every other rank, or fails within `opts`' deadline with an error that says whom it
/// was waiting for.
///
/// ```
/// // A group of one needs no peers: handy for a quick check.
/// let pg = ringccl::init_process_group("GLOO", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// let mut x = [1.5f32, -2.0];
/// pg.all_reduce(&mut x, ringccl::ReduceOp::Sum)?;
/// assert_eq!(x, [1.5, -2.0]);
///
/// let err = ringccl::init_process_group("mpi", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))
///     .unwrap_err();
/// assert!(err.to_string().contains("gloo, nccl"));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn init_process_group(backend: &str, mut opts: InitOptions) -> Result<ProcessGroup, Error> {
    match backend.trim().to_ascii_lowercase().as_str() {
        "gloo" => {
            opts.validate()?;
            let mut config = HostConfig {
                timeout: opts.timeout,
                all_reduce_algo: opts.resolved_all_reduce_algo()?,
                ..HostConfig::default()
            };
            if let Some(chunk) = opts.chunk_bytes {
                config.chunk_bytes = chunk;
            }
            if let Some(bytes) = opts.small_all_reduce_max_bytes {
                config.small_all_reduce_max_bytes = bytes;
            }
            let kind = opts.resolved_transport()?;
            let deadline = Deadline::after(opts.timeout).at();
            let mut mesh = connect_mesh(opts.mesh_config())?;
            let (rank, world_size, job) = (mesh.rank(), mesh.world_size(), mesh.job_id());
            let rings = match kind {
                TransportKind::Tcp => None,
                required => shm::set_up(
                    mesh.store(),
                    rank,
                    world_size,
                    job,
                    DEFAULT_RING_BYTES,
                    deadline,
                    required == TransportKind::SharedMemory,
                )?,
            };
            let dead_peer = mesh.dead_peer_timeout();
            let (connections, store) = mesh.finish(deadline)?;
            let tcp = TcpTransport::new(rank, connections, dead_peer).map_err(|source| {
                SetupError::Io {
                    rank,
                    context: "configuring the connections to the other ranks".into(),
                    source,
                }
            })?;
            let backend: Box<dyn Backend> = match rings {
                Some(rings) => Box::new(HostBackend::new(
                    "gloo",
                    ShmTransport::new(rings, tcp),
                    config,
                )),
                None => Box::new(HostBackend::new("gloo", tcp, config)),
            };
            let mut pg = ProcessGroup::from_backend(backend);
            pg._store = Some(store);
            Ok(pg)
        }
        #[cfg(feature = "nccl")]
        "nccl" => {
            opts.validate()?;
            let mut config = ringccl_nccl::NcclConfig::new(opts.mesh_config());
            config.device = opts.device;
            config.local_rank = opts.local_rank;
            Ok(ProcessGroup::from_nccl(Arc::new(
                ringccl_nccl::NcclBackend::connect(config)?,
            )))
        }
        #[cfg(not(feature = "nccl"))]
        "nccl" => Err(Error::BackendUnavailable {
            backend: "nccl",
            reason: "this build of ringccl was compiled without its `nccl` cargo feature; \
                     rebuild with default features, or use \"gloo\""
                .into(),
        }),
        _ => Err(Error::UnknownBackend {
            name: backend.to_string(),
            valid: BACKENDS,
        }),
    }
}

/// One rank's handle on a group of processes that run collectives together.
///
/// `Send + Sync`: it can be shared between threads. Every operation — blocking or
/// `*_async` — runs in the order it was issued on this rank, one at a time. Every
/// collective must be issued by all ranks in the same order with matching arguments; a
/// rank that disagrees gets [`Error::CollectiveMismatch`] instead of a hang.
pub struct ProcessGroup {
    backend: Arc<dyn Backend>,
    /// The same backend as `backend` when it is NCCL, for the device-buffer methods.
    #[cfg(feature = "nccl")]
    pub(crate) nccl: Option<Arc<ringccl_nccl::NcclBackend>>,
    sequencer: Arc<Sequencer>,
    worker: Mutex<Option<Worker>>,
    fusion_buffers: FusionPool,
    /// The rendezvous store, kept for the life of the group (dropped after the backend).
    _store: Option<KeptStore>,
}

/// Fusion buffers kept between calls of `all_reduce_bucketed`, so that a training loop
/// does not allocate (and page-fault in) fresh buckets every step.
#[derive(Default)]
struct FusionPool {
    /// Each entry is a `Vec<Vec<T>>` for some element type `T`.
    by_type: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl FusionPool {
    fn take<T: Element>(&self) -> Vec<Vec<T>> {
        let Ok(mut pool) = self.by_type.lock() else {
            return Vec::new();
        };
        let found = pool.iter().position(|entry| entry.is::<Vec<Vec<T>>>());
        found
            .map(|i| pool.swap_remove(i))
            .and_then(|entry| entry.downcast::<Vec<Vec<T>>>().ok())
            .map_or_else(Vec::new, |buffers| *buffers)
    }

    fn put<T: Element>(&self, mut buffers: Vec<Vec<T>>) {
        buffers.truncate(BUCKETS_IN_FLIGHT + 1);
        if let Ok(mut pool) = self.by_type.lock() {
            pool.push(Box::new(buffers));
        }
    }
}

impl ProcessGroup {
    /// Wraps any backend implementation.
    pub fn from_backend(backend: Box<dyn Backend>) -> ProcessGroup {
        ProcessGroup {
            backend: Arc::from(backend),
            #[cfg(feature = "nccl")]
            nccl: None,
            sequencer: Arc::default(),
            worker: Mutex::new(None),
            fusion_buffers: FusionPool::default(),
            _store: None,
        }
    }

    #[cfg(feature = "nccl")]
    fn from_nccl(nccl: Arc<ringccl_nccl::NcclBackend>) -> ProcessGroup {
        ProcessGroup {
            backend: nccl.group(),
            nccl: Some(nccl),
            sequencer: Arc::default(),
            worker: Mutex::new(None),
            fusion_buffers: FusionPool::default(),
            _store: None,
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.backend.rank()
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.backend.world_size()
    }

    /// The backend's name (`"gloo"` or `"nccl"`).
    pub fn backend(&self) -> &str {
        self.backend.name()
    }

    /// The type-erased backend underneath. Calls made on it directly bypass the group's
    /// issue order; prefer the methods of `ProcessGroup`.
    pub fn as_backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Runs `op` on the calling thread once every earlier operation has finished, with
    /// the group's deadline counted from now.
    pub(crate) fn in_order<R, E>(
        &self,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<R, E>,
    ) -> Result<R, Error>
    where
        Error: From<E>,
    {
        self.in_order_within(self.backend.timeout(), op)
    }

    /// [`ProcessGroup::in_order`] with a deadline `timeout` from now.
    fn in_order_within<R, E>(
        &self,
        timeout: Duration,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<R, E>,
    ) -> Result<R, Error>
    where
        Error: From<E>,
    {
        let deadline = Deadline::after(timeout);
        let ticket = self.sequencer.issue(|ticket| ticket);
        let _turn = self.sequencer.turn(ticket);
        Ok(op(&*self.backend, deadline)?)
    }

    /// Queues `op` on the background worker, behind every earlier operation, with the
    /// group's deadline counted from now (time spent queued counts).
    pub(crate) fn queue<T: Send + 'static, E>(
        &self,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<T, E> + Send + 'static,
    ) -> Result<Work<T>, Error>
    where
        Error: From<E>,
    {
        let rank = self.rank();
        let deadline = Deadline::after(self.backend.timeout());
        let mut slot = self.worker.lock().map_err(|_| Error::GroupBroken {
            rank,
            cause: "a thread panicked while queueing an operation".into(),
        })?;
        let worker = match &mut *slot {
            Some(worker) => worker,
            empty => empty.insert(Worker::start(
                Arc::clone(&self.backend),
                Arc::clone(&self.sequencer),
            )?),
        };
        let (done, result) = crossbeam_channel::bounded(1);
        let submitted = self.sequencer.issue(|ticket| {
            worker.submit(Job {
                ticket,
                run: Box::new(move |backend| {
                    let result = panic::catch_unwind(AssertUnwindSafe(|| {
                        op(backend, deadline).map_err(Error::from)
                    }))
                    .unwrap_or_else(|_| {
                        Err(Error::GroupBroken {
                            rank,
                            cause: "an operation panicked in the background worker".into(),
                        })
                    });
                    // The Work may have been dropped: the result is then discarded.
                    let _ = done.send(result);
                }),
            })
        });
        if let Err(job) = submitted {
            self.sequencer.skip(job.ticket);
            return Err(Error::GroupBroken {
                rank,
                cause: "the group's background worker has stopped".into(),
            });
        }
        Ok(Work::new(result, rank))
    }

    /// Reduces `buf` element-wise across all ranks with `op`; every rank ends with the
    /// bit-identical result. `Avg` works on float types only.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), Error> {
        self.in_order(|b, d| b.all_reduce(BufferMut::from_slice(buf), op, d))
    }

    /// Copies rank `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), Error> {
        self.in_order(|b, d| b.broadcast(BufferMut::from_slice(buf), root, d))
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&self) -> Result<(), Error> {
        self.in_order(|b, d| b.barrier(d))
    }

    /// [`ProcessGroup::all_reduce`] with its own deadline (the group's, from
    /// `InitOptions::timeout`, applies to every other call).
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut x = [1.0f32];
    /// pg.all_reduce_with_timeout(&mut x, ringccl::ReduceOp::Sum, std::time::Duration::from_secs(5))?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all_reduce_with_timeout<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.in_order_within(timeout, |b, d| {
            b.all_reduce(BufferMut::from_slice(buf), op, d)
        })
    }

    /// [`ProcessGroup::broadcast`] with its own deadline.
    pub fn broadcast_with_timeout<T: Element>(
        &self,
        buf: &mut [T],
        root: usize,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.in_order_within(timeout, |b, d| {
            b.broadcast(BufferMut::from_slice(buf), root, d)
        })
    }

    /// [`ProcessGroup::barrier`] with its own deadline.
    pub fn barrier_with_timeout(&self, timeout: Duration) -> Result<(), Error> {
        self.in_order_within(timeout, |b, d| b.barrier(d))
    }

    /// Reduces `buf` across all ranks into rank `root`'s `buf`. The other ranks' `buf`
    /// contents are unspecified afterwards (they hold partial results).
    pub fn reduce<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), Error> {
        self.in_order(|b, d| b.reduce(BufferMut::from_slice(buf), op, root, d))
    }

    /// Concatenates every rank's `input`, in rank order, into every rank's `output`
    /// (`output.len() == world_size * input.len()`).
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        self.in_order(|b, d| {
            b.all_gather(
                BufferRef::from_slice(input),
                BufferMut::from_slice(output),
                d,
            )
        })
    }

    /// Reduces `input` (`world_size` equal blocks) across ranks: rank `r`'s `output`
    /// receives the reduction of everyone's block `r`
    /// (`input.len() == world_size * output.len()`).
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.in_order(|b, d| {
            b.reduce_scatter(
                BufferRef::from_slice(input),
                BufferMut::from_slice(output),
                op,
                d,
            )
        })
    }

    /// Exchanges blocks: block `q` of this rank's `input` becomes block `rank` of rank
    /// `q`'s `output`. Both buffers hold `world_size` equal blocks.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        self.in_order(|b, d| {
            b.all_to_all(
                BufferRef::from_slice(input),
                BufferMut::from_slice(output),
                d,
            )
        })
    }

    /// Sends `buf` to rank `dst`. Rank `dst` must call [`ProcessGroup::recv`] with this
    /// rank, the same tag, length and type; messages between two ranks are received in
    /// the order they were sent (a different tag or size is reported as an error).
    pub fn send<T: Element>(&self, buf: &[T], dst: usize, tag: u32) -> Result<(), Error> {
        self.in_order(|b, d| b.send(BufferRef::from_slice(buf), dst, tag, d))
    }

    /// Receives into `buf` the next message from rank `src`, which must carry `tag`.
    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize, tag: u32) -> Result<(), Error> {
        self.in_order(|b, d| b.recv(BufferMut::from_slice(buf), src, tag, d))
    }

    /// Starts an all-reduce in the background and returns at once. The buffer moves into
    /// the returned [`Work`] and comes back from [`Work::wait`].
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let work = pg.all_reduce_async(vec![1.0f32; 4], ringccl::ReduceOp::Sum)?;
    /// // ... compute while the all-reduce runs ...
    /// let grads = work.wait()?;
    /// assert_eq!(grads, vec![1.0; 4]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all_reduce_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>, Error> {
        validate_reduce(T::DTYPE, op)?;
        self.queue(move |b, d| {
            b.all_reduce(BufferMut::from_slice(&mut buf), op, d)
                .map(|()| buf)
        })
    }

    /// Starts a broadcast in the background; see [`ProcessGroup::all_reduce_async`].
    pub fn broadcast_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        root: usize,
    ) -> Result<Work<Vec<T>>, Error> {
        self.queue(move |b, d| {
            b.broadcast(BufferMut::from_slice(&mut buf), root, d)
                .map(|()| buf)
        })
    }

    /// Starts a barrier in the background.
    pub fn barrier_async(&self) -> Result<Work<()>, Error> {
        self.queue(|b, d| b.barrier(d))
    }

    /// All-reduces many tensors through fusion buffers of at most `bucket_bytes`: the
    /// tensors are packed, in order, into buckets (a tensor larger than the space left is
    /// split across buckets), each bucket is all-reduced as one buffer, and the results
    /// are unpacked. The next bucket is packed while the previous ones are on the wire.
    /// A thousand 1 KiB tensors cost about one 1 MiB all-reduce, not a thousand
    /// latencies.
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let (mut a, mut b) = (vec![1.0f32; 3], vec![2.0f32; 1000]);
    /// pg.all_reduce_bucketed(&mut [&mut a[..], &mut b[..]], ringccl::ReduceOp::Sum, 1024)?;
    /// assert_eq!(b[999], 2.0);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all_reduce_bucketed<T: Element>(
        &self,
        tensors: &mut [&mut [T]],
        op: ReduceOp,
        bucket_bytes: usize,
    ) -> Result<(), Error> {
        validate_reduce(T::DTYPE, op)?;
        let lens: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
        let plan = plan_buckets(&lens, T::DTYPE.size(), bucket_bytes);
        let mut spare: Vec<Vec<T>> = self.fusion_buffers.take();
        if plan.len() == 1 {
            // One bucket: nothing to pipeline, so skip the hand-off to the worker.
            let mut fused = spare.pop().unwrap_or_default();
            fused.clear();
            for piece in &plan[0] {
                fused.extend_from_slice(&tensors[piece.tensor][piece.range.clone()]);
            }
            self.all_reduce(&mut fused, op)?;
            let mut at = 0;
            for piece in &plan[0] {
                let len = piece.range.len();
                tensors[piece.tensor][piece.range.clone()].copy_from_slice(&fused[at..at + len]);
                at += len;
            }
            spare.push(fused);
            self.fusion_buffers.put(spare);
            return Ok(());
        }
        let mut in_flight = VecDeque::<(usize, Work<Vec<T>>)>::new();
        let mut first_error = None;
        // Waits for bucket `index` and copies its result back into the tensors.
        let finish = |index: usize,
                      work: Work<Vec<T>>,
                      tensors: &mut [&mut [T]],
                      spare: &mut Vec<Vec<T>>|
         -> Result<(), Error> {
            let fused = work.wait()?;
            let mut at = 0;
            for piece in &plan[index] {
                let len = piece.range.len();
                tensors[piece.tensor][piece.range.clone()].copy_from_slice(&fused[at..at + len]);
                at += len;
            }
            spare.push(fused);
            Ok(())
        };
        for (index, bucket) in plan.iter().enumerate() {
            let mut fused = spare.pop().unwrap_or_default();
            fused.clear();
            for piece in bucket {
                fused.extend_from_slice(&tensors[piece.tensor][piece.range.clone()]);
            }
            match self.all_reduce_async(fused, op) {
                Ok(work) => in_flight.push_back((index, work)),
                Err(e) => {
                    first_error.get_or_insert(e);
                    break;
                }
            }
            if in_flight.len() > BUCKETS_IN_FLIGHT {
                if let Some((i, work)) = in_flight.pop_front() {
                    if let Err(e) = finish(i, work, tensors, &mut spare) {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        // Wait for every bucket, even after an error: no operation outlives this call.
        while let Some((i, work)) = in_flight.pop_front() {
            if let Err(e) = finish(i, work, tensors, &mut spare) {
                first_error.get_or_insert(e);
            }
        }
        self.fusion_buffers.put(spare);
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn process_group_is_send_and_sync() {
        assert_send_sync::<ProcessGroup>();
    }
}
