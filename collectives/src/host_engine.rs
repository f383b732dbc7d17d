//! The CPU engine: ringccl's own schedules, run by the executor over any [`Transport`],
//! and the calls in memory its transport may offer ([`HostTransport`]). Over the TCP or
//! shared-memory transport, this is the `"gloo"` backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::control::GroupControl;
use crate::executor::{execute, Call};
use crate::group::{Engine, GroupRunner, Request};
use crate::hooks::{CallHooks, CallScope, NoHooks, ProgressSink, Running};
use crate::memory_barrier::{self, OffersMemoryBarrier, Reduction, SLOT_DATA};
use crate::one_copy;
use crate::peer_memory::OffersPeerMemory;
use crate::schedule::{
    binomial_tree_broadcast, chain_broadcast, dissemination_barrier, gather_release_barrier,
    halving_doubling_all_reduce, hierarchical_all_reduce, hierarchical_barrier,
    hierarchical_broadcast, pairwise_all_to_all, recursive_doubling_all_reduce, recv_from,
    ring_order, ring_over, ring_reduce, segment, send_to, RingCollective, Schedule,
};
use crate::schedule_cache::{ScheduleCache, ScheduleKey};
use crate::transport::Transport;
use crate::wire::{Algorithm, MAX_FRAME_PAYLOAD};
use crate::Deadline;
use crate::{barrier_algorithm, AllReduceAlgo, DType, Error, OpDesc, ReduceOp};

/// Tuning knobs of the host engine. Every rank must use the same values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Default deadline of each call.
    pub timeout: Duration,
    /// Largest chunk a pipelined step sends as one frame.
    pub chunk_bytes: usize,
    /// Broadcasts up to this size use the binomial tree; larger ones the pipelined chain.
    pub tree_broadcast_max_bytes: usize,
    /// Which all-reduce algorithm to run.
    pub all_reduce_algo: AllReduceAlgo,
    /// With [`AllReduceAlgo::Auto`], all-reduces up to this size use recursive doubling.
    pub small_all_reduce_max_bytes: usize,
    /// With [`AllReduceAlgo::Auto`] and four ranks or more, larger all-reduces up to this
    /// size use halving-doubling; the ring above.
    pub mid_all_reduce_max_bytes: usize,
    /// With [`AllReduceAlgo::Auto`], ranks that share this process (the transport offers
    /// [`OffersPeerMemory::peer_memory`]) all-reduce buffers of at least this size by reading
    /// each other's buffers. (Processes of one host that can read each other's memory
    /// through the kernel do so only under [`AllReduceAlgo::PeerMemory`].)
    pub peer_memory_min_bytes: usize,
    /// With [`AllReduceAlgo::Auto`] or [`AllReduceAlgo::PeerMemory`], processes of one
    /// host all-reduce a buffer of at least this size that lies in a shared buffer
    /// ([`MemoryBarrier::shared_ticket`]) by reading each other's shared buffers in place
    /// (`one_copy.rs`): every rank must then pass a shared buffer.
    pub shared_buffer_min_bytes: usize,
}

/// Default crossover between recursive doubling and the ring; see docs/benchmarks.md.
pub const DEFAULT_SMALL_ALL_REDUCE_MAX_BYTES: usize = 32 * 1024;
/// Default crossover between halving-doubling and the ring; see docs/benchmarks.md.
pub const DEFAULT_MID_ALL_REDUCE_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Default crossover to the peer-memory all-reduce between ranks of one process; see
/// docs/benchmarks.md.
pub const DEFAULT_PEER_MEMORY_MIN_BYTES: usize = 1024 * 1024;
/// Default crossover to the in-place all-reduce of shared buffers between processes;
/// see docs/benchmarks.md.
pub const DEFAULT_SHARED_BUFFER_MIN_BYTES: usize = 16 * 1024;

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            timeout: Duration::from_secs(30 * 60),
            chunk_bytes: 256 * 1024,
            tree_broadcast_max_bytes: 64 * 1024,
            all_reduce_algo: AllReduceAlgo::Auto,
            small_all_reduce_max_bytes: DEFAULT_SMALL_ALL_REDUCE_MAX_BYTES,
            mid_all_reduce_max_bytes: DEFAULT_MID_ALL_REDUCE_MAX_BYTES,
            peer_memory_min_bytes: DEFAULT_PEER_MEMORY_MIN_BYTES,
            shared_buffer_min_bytes: DEFAULT_SHARED_BUFFER_MIN_BYTES,
        }
    }
}

/// What the host engine runs over: a [`Transport`] and the capabilities it may offer
/// beyond byte movement, each declared beside its protocol ([`OffersMemoryBarrier`],
/// [`OffersPeerMemory`]; a transport without one implements it empty). Implemented for
/// every type that implements the three.
pub trait HostTransport: Transport + OffersMemoryBarrier + OffersPeerMemory {}

impl<T: Transport + OffersMemoryBarrier + OffersPeerMemory + ?Sized> HostTransport for T {}

/// The `"gloo"` backend: a [`GroupRunner`] around a [`HostEngine`].
pub type HostBackend<T> = GroupRunner<HostEngine<T>>;

impl<T: HostTransport> HostBackend<T> {
    /// Wraps a connected transport. `config.chunk_bytes` is clamped to
    /// `1..=`[`MAX_FRAME_PAYLOAD`].
    pub fn new(name: &'static str, transport: T, config: HostConfig) -> HostBackend<T> {
        let (rank, world_size, timeout) =
            (transport.rank(), transport.world_size(), config.timeout);
        GroupRunner::with_engine(
            name,
            rank,
            world_size,
            timeout,
            HostEngine::new(transport, config),
        )
    }
}

/// Runs ring and recursive-doubling all-reduce, tree/chain broadcast, dissemination
/// barrier, ring reduce / reduce-scatter / all-gather, pairwise all-to-all and
/// point-to-point messages over a transport.
pub struct HostEngine<T> {
    transport: T,
    config: HostConfig,
    /// Receive space for reductions, kept between calls (u64 words: kernels need
    /// typed alignment).
    scratch: Vec<u64>,
    /// Where the running op is published, once a runner has taken the engine.
    control: Option<Arc<GroupControl>>,
    /// Whoever watches the group.
    hooks: Arc<dyn CallHooks>,
    /// The schedules of the last calls.
    schedules: ScheduleCache,
    /// Calls run in memory so far (`memory_barrier.rs`): they alternate between two
    /// slots.
    memory_calls: u64,
}

/// What one call asks of the executor.
struct Job<'a> {
    algorithm: Algorithm,
    schedule: Arc<Schedule>,
    elem_size: usize,
    reduce: Option<(DType, ReduceOp)>,
    buf: &'a mut [u8],
    send_from: Option<&'a [u8]>,
}

/// The ring schedule of `collective` for rank `rank` of `n`: around the hosts when the
/// group spans them (`hosts`, see [`ring_order`]), else around the ranks in order.
fn ring_for(
    collective: RingCollective,
    hosts: Option<&[usize]>,
    rank: usize,
    n: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let order: Vec<usize> = hosts.map_or_else(|| (0..n).collect(), ring_order);
    ring_over(collective, rank, &order, count, elem_size, max_chunk_bytes)
}

/// Element-aligned scratch copy of `bytes` (kernels need typed alignment).
fn aligned_copy(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
    words
}

impl<T: HostTransport> HostEngine<T> {
    /// An engine over a connected transport. `config.chunk_bytes` is clamped to
    /// `1..=`[`MAX_FRAME_PAYLOAD`].
    pub fn new(transport: T, mut config: HostConfig) -> HostEngine<T> {
        config.chunk_bytes = config.chunk_bytes.clamp(1, MAX_FRAME_PAYLOAD);
        HostEngine {
            transport,
            config,
            scratch: Vec::new(),
            control: None,
            hooks: Arc::new(NoHooks),
            schedules: ScheduleCache::default(),
            memory_calls: 0,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The all-reduce between ranks of one process, through each other's buffers.
    fn run_peer_memory(
        &mut self,
        op: &OpDesc,
        buf: &mut [u8],
        reduce: (DType, ReduceOp),
        deadline: Deadline,
    ) -> Result<(), Error> {
        let rank = self.transport.rank();
        self.run_unscheduled(
            op,
            Algorithm::PeerMemory,
            deadline,
            |transport, progress| match transport.peer_memory() {
                Some(access) => access.memory.all_reduce(
                    rank,
                    op,
                    buf,
                    reduce,
                    access.spin,
                    (deadline.at(), deadline.timeout()),
                    &|peer| progress.blocked_on(peer, 0),
                ),
                None => Err(Error::InvalidArgument(format!(
                    "rank {rank}: the peer-memory all-reduce needs ranks in one process"
                ))),
            },
        )
    }

    /// The all-reduce between processes that read each other's buffers (`one_copy.rs`).
    fn run_one_copy(
        &mut self,
        op: &OpDesc,
        buf: &mut [u8],
        (dtype, reduce): (DType, ReduceOp),
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.with_memory_slot(|engine, slot, scratch| {
            engine.run_unscheduled(
                op,
                Algorithm::PeerMemory,
                deadline,
                |transport, progress| {
                    one_copy::all_reduce(
                        transport,
                        op,
                        (buf, dtype, reduce),
                        (slot, scratch),
                        (deadline.at(), deadline.timeout()),
                        progress,
                    )
                },
            )
        })
    }

    /// Runs `body` with the next of the two slots the calls in memory alternate between
    /// and the engine's scratch (lent for the call).
    fn with_memory_slot<R>(
        &mut self,
        body: impl FnOnce(&mut Self, usize, &mut Vec<u64>) -> R,
    ) -> R {
        let slot = (self.memory_calls % 2) as usize;
        self.memory_calls += 1;
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = body(self, slot, &mut scratch);
        self.scratch = scratch;
        result
    }

    /// A barrier, or with `reduce` a small all-reduce of `buf`, in memory every rank
    /// shares (`memory_barrier.rs`).
    fn run_in_memory(
        &mut self,
        op: &OpDesc,
        reduce: Option<(&mut [u8], DType, ReduceOp)>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.with_memory_slot(|engine, slot, scratch| {
            let reduction = reduce.map(|(buf, dtype, op)| Reduction {
                buf,
                dtype,
                op,
                scratch,
            });
            engine.run_unscheduled(
                op,
                Algorithm::SharedCounters,
                deadline,
                |transport, progress| {
                    memory_barrier::run(
                        transport,
                        op,
                        (slot, reduction),
                        (deadline.at(), deadline.timeout()),
                        progress,
                    )
                },
            )
        })
    }

    /// Runs `body`, a call that follows no schedule, announced and recorded as `op` run
    /// by `algorithm` like every other call.
    fn run_unscheduled(
        &mut self,
        op: &OpDesc,
        algorithm: Algorithm,
        deadline: Deadline,
        body: impl FnOnce(&mut T, ProgressSink<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let call = CallScope::begin(
            self.control.as_deref(),
            &*self.hooks,
            self.running(op, algorithm, deadline),
        );
        let result = body(&mut self.transport, call.progress());
        call.end(None, &result);
        result
    }

    fn run(&mut self, op: &OpDesc, job: Job<'_>, deadline: Deadline) -> Result<(), Error> {
        let scope = CallScope::begin(
            self.control.as_deref(),
            &*self.hooks,
            self.running(op, job.algorithm, deadline),
        );
        let call = Call {
            rank: self.transport.rank(),
            world_size: self.transport.world_size(),
            op: *op,
            algorithm: job.algorithm,
            elem_size: job.elem_size,
            reduce: job.reduce,
            deadline: deadline.at(),
            timeout: deadline.timeout(),
            report: scope.progress(),
        };
        let result = execute(
            &mut self.transport,
            &job.schedule,
            &call,
            job.buf,
            job.send_from,
            &mut self.scratch,
        );
        scope.end(Some((&job.schedule, job.elem_size)), &result);
        result
    }

    /// `op`, run by `algorithm` by `deadline`, as the hooks are told.
    fn running(&self, op: &OpDesc, algorithm: Algorithm, deadline: Deadline) -> Running {
        Running {
            op: *op,
            algorithm,
            rank: self.transport.rank(),
            world_size: self.transport.world_size(),
            deadline,
        }
    }
}

impl<T: HostTransport> Engine for HostEngine<T> {
    fn execute(
        &mut self,
        op: &OpDesc,
        request: Request<'_>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let (rank, n) = (self.transport.rank(), self.transport.world_size());
        let cfg = &self.config;
        let chunk = cfg.chunk_bytes;
        let plain = |algorithm, schedule, dtype: DType, buf| Job {
            algorithm,
            schedule,
            elem_size: dtype.size(),
            reduce: None,
            buf,
            send_from: None,
        };
        match request {
            Request::AllReduce {
                mut buf,
                op: reduce,
            } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                let es = dtype.size();
                let peer_memory = match cfg.all_reduce_algo {
                    AllReduceAlgo::PeerMemory => true,
                    AllReduceAlgo::Auto => count * es >= cfg.peer_memory_min_bytes,
                    _ => false,
                };
                if peer_memory && self.transport.peer_memory().is_some() {
                    return self.run_peer_memory(op, buf.bytes_mut(), (dtype, reduce), deadline);
                }
                // Processes read each other's buffers in place when they are shared
                // buffers; through the kernel only when asked for: on the machines
                // measured, that read is slower than the rings (see docs/benchmarks.md),
                // so the automatic choice never takes it.
                let asked = cfg.all_reduce_algo == AllReduceAlgo::PeerMemory;
                let in_place = matches!(
                    cfg.all_reduce_algo,
                    AllReduceAlgo::Auto | AllReduceAlgo::PeerMemory
                ) && count * es >= cfg.shared_buffer_min_bytes;
                let (address, len) = (buf.bytes_mut().as_ptr() as u64, count * es);
                let one_copy = n > 1
                    && self.transport.memory_barrier().is_some_and(|barrier| {
                        (in_place && barrier.shared_ticket(address, len).is_some())
                            || (asked && barrier.reads_peer_memory())
                    });
                if one_copy {
                    return self.run_one_copy(op, buf.bytes_mut(), (dtype, reduce), deadline);
                }
                let in_memory =
                    cfg.all_reduce_algo == AllReduceAlgo::Auto && n > 1 && count * es <= SLOT_DATA;
                if in_memory && self.transport.memory_barrier().is_some() {
                    return self.run_in_memory(
                        op,
                        Some((buf.bytes_mut(), dtype, reduce)),
                        deadline,
                    );
                }
                let hosts = self.transport.hosts();
                let algorithm = cfg.all_reduce_algo.pick_on_hosts(
                    count * es,
                    n,
                    cfg.small_all_reduce_max_bytes,
                    cfg.mid_all_reduce_max_bytes,
                    hosts.is_some(),
                );
                let schedule = match algorithm {
                    Algorithm::RecursiveDoubling => self.schedules.get(
                        ScheduleKey::RecursiveDoublingAllReduce {
                            count,
                            elem_size: es,
                        },
                        || recursive_doubling_all_reduce(rank, n, count, es, chunk),
                    ),
                    Algorithm::HalvingDoubling => self.schedules.get(
                        ScheduleKey::HalvingDoublingAllReduce {
                            count,
                            elem_size: es,
                        },
                        || halving_doubling_all_reduce(rank, n, count, es, chunk),
                    ),
                    Algorithm::Hierarchical => self.schedules.get(
                        ScheduleKey::HierarchicalAllReduce {
                            count,
                            elem_size: es,
                        },
                        || hierarchical_all_reduce(rank, hosts.unwrap_or(&[]), count, es, chunk),
                    ),
                    _ => self.schedules.get(
                        ScheduleKey::RingAllReduce {
                            count,
                            elem_size: es,
                        },
                        || ring_for(RingCollective::AllReduce, hosts, rank, n, count, es, chunk),
                    ),
                };
                let job = Job {
                    reduce: Some((dtype, reduce)),
                    ..plain(algorithm, schedule, dtype, buf.bytes_mut())
                };
                self.run(op, job, deadline)
            }
            Request::Broadcast { mut buf, root } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                let es = dtype.size();
                let tree = count * es <= cfg.tree_broadcast_max_bytes;
                let job = if let Some(hosts) = self.transport.hosts() {
                    // One crossing per host, then inside each host.
                    let key = ScheduleKey::HierarchicalBroadcast {
                        root,
                        count,
                        elem_size: es,
                        pipelined: !tree,
                    };
                    let schedule = self.schedules.get(key, || {
                        hierarchical_broadcast(rank, hosts, root, count, es, chunk, !tree)
                    });
                    plain(Algorithm::Hierarchical, schedule, dtype, buf.bytes_mut())
                } else if tree {
                    let key = ScheduleKey::TreeBroadcast {
                        root,
                        count,
                        elem_size: es,
                    };
                    let schedule = self.schedules.get(key, || {
                        binomial_tree_broadcast(rank, n, root, count, es, chunk)
                    });
                    plain(Algorithm::BinomialTree, schedule, dtype, buf.bytes_mut())
                } else {
                    let key = ScheduleKey::ChainBroadcast {
                        root,
                        count,
                        elem_size: es,
                    };
                    let schedule = self
                        .schedules
                        .get(key, || chain_broadcast(rank, n, root, count, es, chunk));
                    plain(Algorithm::Chain, schedule, dtype, buf.bytes_mut())
                };
                self.run(op, job, deadline)
            }
            Request::Barrier if self.transport.memory_barrier().is_some() => {
                self.run_in_memory(op, None, deadline)
            }
            Request::Barrier => {
                let job = match self.transport.hosts() {
                    Some(hosts) => {
                        let schedule = self.schedules.get(ScheduleKey::HierarchicalBarrier, || {
                            hierarchical_barrier(rank, hosts)
                        });
                        plain(Algorithm::Hierarchical, schedule, DType::U8, &mut [])
                    }
                    None => match barrier_algorithm(n, self.transport.one_machine()) {
                        Algorithm::GatherRelease => {
                            let schedule =
                                self.schedules.get(ScheduleKey::GatherReleaseBarrier, || {
                                    gather_release_barrier(rank, n)
                                });
                            plain(Algorithm::GatherRelease, schedule, DType::U8, &mut [])
                        }
                        _ => {
                            let schedule = self
                                .schedules
                                .get(ScheduleKey::Barrier, || dissemination_barrier(rank, n));
                            plain(Algorithm::Dissemination, schedule, DType::U8, &mut [])
                        }
                    },
                };
                self.run(op, job, deadline)
            }
            Request::Reduce {
                mut buf,
                op: reduce,
                root,
            } => {
                let (dtype, count) = (buf.dtype(), buf.len());
                let es = dtype.size();
                let key = ScheduleKey::RingReduce {
                    root,
                    count,
                    elem_size: es,
                };
                let schedule = self
                    .schedules
                    .get(key, || ring_reduce(rank, n, root, count, es, chunk));
                let job = Job {
                    reduce: Some((dtype, reduce)),
                    ..plain(Algorithm::Ring, schedule, dtype, buf.bytes_mut())
                };
                self.run(op, job, deadline)
            }
            Request::AllGather { input, mut output } => {
                let (dtype, count) = (output.dtype(), output.len());
                let es = dtype.size();
                let own = segment(count, n, rank);
                output.bytes_mut()[own.start * es..own.end * es].copy_from_slice(input.bytes());
                let key = ScheduleKey::AllGather {
                    count,
                    elem_size: es,
                };
                let hosts = self.transport.hosts();
                let schedule = self.schedules.get(key, || {
                    ring_for(RingCollective::AllGather, hosts, rank, n, count, es, chunk)
                });
                let job = plain(Algorithm::Ring, schedule, dtype, output.bytes_mut());
                self.run(op, job, deadline)
            }
            Request::ReduceScatter {
                input,
                mut output,
                op: reduce,
            } => {
                let (dtype, count) = (input.dtype(), input.len());
                let es = dtype.size();
                // The ring reduces in place: work on a copy so the caller's input stays
                // intact.
                let mut work = aligned_copy(input.bytes());
                let work_bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut work)[..count * es];
                let key = ScheduleKey::ReduceScatter {
                    count,
                    elem_size: es,
                };
                let hosts = self.transport.hosts();
                let schedule = self.schedules.get(key, || {
                    ring_for(
                        RingCollective::ReduceScatter,
                        hosts,
                        rank,
                        n,
                        count,
                        es,
                        chunk,
                    )
                });
                let job = Job {
                    reduce: Some((dtype, reduce)),
                    ..plain(Algorithm::Ring, schedule, dtype, &mut *work_bytes)
                };
                self.run(op, job, deadline)?;
                let own = segment(count, n, rank);
                output
                    .bytes_mut()
                    .copy_from_slice(&work_bytes[own.start * es..own.end * es]);
                Ok(())
            }
            Request::AllToAll { input, mut output } => {
                let (dtype, count) = (input.dtype(), input.len());
                let es = dtype.size();
                let own = segment(count, n, rank);
                let own_bytes = own.start * es..own.end * es;
                output.bytes_mut()[own_bytes.clone()].copy_from_slice(&input.bytes()[own_bytes]);
                let key = ScheduleKey::AllToAll {
                    count,
                    elem_size: es,
                };
                let schedule = self
                    .schedules
                    .get(key, || pairwise_all_to_all(rank, n, count, es, chunk));
                let job = Job {
                    send_from: Some(input.bytes()),
                    ..plain(Algorithm::Pairwise, schedule, dtype, output.bytes_mut())
                };
                self.run(op, job, deadline)
            }
            Request::Send { buf, peer, .. } => {
                let dtype = buf.dtype();
                let (count, es) = (buf.len(), dtype.size());
                let key = ScheduleKey::Send {
                    peer,
                    count,
                    elem_size: es,
                };
                let schedule = self.schedules.get(key, || send_to(peer, count, es, chunk));
                let job = Job {
                    send_from: Some(buf.bytes()),
                    ..plain(Algorithm::Direct, schedule, dtype, &mut [])
                };
                self.run(op, job, deadline)
            }
            Request::Recv { mut buf, peer, .. } => {
                let dtype = buf.dtype();
                let (count, es) = (buf.len(), dtype.size());
                let key = ScheduleKey::Recv {
                    peer,
                    count,
                    elem_size: es,
                };
                let schedule = self
                    .schedules
                    .get(key, || recv_from(peer, count, es, chunk));
                let job = plain(Algorithm::Direct, schedule, dtype, buf.bytes_mut());
                self.run(op, job, deadline)
            }
        }
    }

    fn failed_peers(&mut self) -> Vec<usize> {
        self.transport.failed_peers()
    }

    fn attach(&mut self, control: &Arc<GroupControl>) {
        if let Some(closer) = self.transport.closer() {
            control.add_closer(closer);
        }
        self.control = Some(Arc::clone(control));
    }

    fn attach_hooks(&mut self, hooks: &Arc<dyn CallHooks>) {
        self.hooks = Arc::clone(hooks);
    }
}

impl<T: fmt::Debug> fmt::Debug for HostEngine<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostEngine")
            .field("config", &self.config)
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}
