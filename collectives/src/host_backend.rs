//! A [`Backend`] that runs ringccl's own schedules on the CPU over any [`Transport`]:
//! with the TCP transport, this is the `"gloo"` backend.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::{validate_blocks, validate_reduce, validate_root};
use crate::executor::{execute, Call};
use crate::schedule::{
    binomial_tree_broadcast, chain_broadcast, dissemination_barrier, pairwise_all_to_all,
    recursive_doubling_all_reduce, recv_from, ring_all_gather, ring_all_reduce, ring_reduce,
    ring_reduce_scatter, segment, send_to, Schedule,
};
use crate::transport::Transport;
use crate::wire::{Algorithm, MAX_FRAME_PAYLOAD};
use crate::{
    AllReduceAlgo, Backend, BufferMut, BufferRef, CollectiveKind, DType, Error, OpDesc, ReduceOp,
};

/// Tuning knobs of [`HostBackend`]. Every rank must use the same values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Deadline of each collective.
    pub timeout: Duration,
    /// Largest chunk a pipelined step sends as one frame.
    pub chunk_bytes: usize,
    /// Broadcasts up to this size use the binomial tree; larger ones the pipelined chain.
    pub tree_broadcast_max_bytes: usize,
    /// Which all-reduce algorithm to run.
    pub all_reduce_algo: AllReduceAlgo,
    /// With [`AllReduceAlgo::Auto`], all-reduces up to this size use recursive doubling.
    pub small_all_reduce_max_bytes: usize,
}

/// Default crossover between recursive doubling and the ring; see docs/benchmarks.md.
pub const DEFAULT_SMALL_ALL_REDUCE_MAX_BYTES: usize = 32 * 1024;

/// After a peer failure, how long to wait for other failing connections to show, so the
/// error can name the rank really at fault when this one was only blocked behind another.
const DIAGNOSIS_GRACE: Duration = Duration::from_secs(2);

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            timeout: Duration::from_secs(30 * 60),
            chunk_bytes: 256 * 1024,
            tree_broadcast_max_bytes: 64 * 1024,
            all_reduce_algo: AllReduceAlgo::Auto,
            small_all_reduce_max_bytes: DEFAULT_SMALL_ALL_REDUCE_MAX_BYTES,
        }
    }
}

struct HostState<T> {
    transport: T,
    seq: u64,
    /// Point-to-point message counters, per peer, for each direction.
    sent_to: Vec<u64>,
    received_from: Vec<u64>,
    scratch: Vec<u64>,
    broken: Option<String>,
    /// Deadline of the calls that follow, when one call overrides the group's.
    call_timeout: Option<Duration>,
}

/// What one call asks of [`HostBackend::run`].
struct Job<'a> {
    op: OpDesc,
    algorithm: Algorithm,
    schedule: Schedule,
    elem_size: usize,
    reduce: Option<(DType, ReduceOp)>,
    buf: &'a mut [u8],
    send_from: Option<&'a [u8]>,
}

/// Runs ring and recursive-doubling all-reduce, tree/chain broadcast, dissemination
/// barrier, ring reduce / reduce-scatter / all-gather, pairwise all-to-all and
/// point-to-point messages over a transport.
///
/// Calls from several threads are serialised; each call is one collective with its own
/// deadline. After an error that leaves the connections in an unknown state, every later
/// call fails at once with [`Error::GroupBroken`].
pub struct HostBackend<T> {
    name: &'static str,
    rank: usize,
    world_size: usize,
    config: HostConfig,
    state: Mutex<HostState<T>>,
}

/// Element-aligned scratch copy of `bytes` (kernels need typed alignment).
fn aligned_copy(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
    words
}

impl<T: Transport> HostBackend<T> {
    /// Wraps a connected transport. `config.chunk_bytes` is clamped to
    /// `1..=`[`MAX_FRAME_PAYLOAD`].
    pub fn new(name: &'static str, transport: T, mut config: HostConfig) -> HostBackend<T> {
        config.chunk_bytes = config.chunk_bytes.clamp(1, MAX_FRAME_PAYLOAD);
        let world_size = transport.world_size();
        HostBackend {
            name,
            rank: transport.rank(),
            world_size,
            config,
            state: Mutex::new(HostState {
                transport,
                seq: 0,
                sent_to: vec![0; world_size],
                received_from: vec![0; world_size],
                scratch: Vec::new(),
                broken: None,
                call_timeout: None,
            }),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Runs one call. `prepare` sees the state (for sequence numbers) and returns the job.
    fn run<'a>(&self, prepare: impl FnOnce(&mut HostState<T>) -> Job<'a>) -> Result<(), Error> {
        let mut state = self.state.lock().map_err(|_| Error::GroupBroken {
            rank: self.rank,
            cause: "a thread panicked while running a collective on this group".into(),
        })?;
        if let Some(cause) = &state.broken {
            return Err(Error::GroupBroken {
                rank: self.rank,
                cause: cause.clone(),
            });
        }
        let job = prepare(&mut state);
        let call = Call {
            rank: self.rank,
            world_size: self.world_size,
            op: job.op,
            algorithm: job.algorithm,
            elem_size: job.elem_size,
            reduce: job.reduce,
            deadline: Instant::now() + state.call_timeout.unwrap_or(self.config.timeout),
            timeout: state.call_timeout.unwrap_or(self.config.timeout),
        };
        let HostState {
            transport, scratch, ..
        } = &mut *state;
        let result = execute(
            transport,
            &job.schedule,
            &call,
            job.buf,
            job.send_from,
            scratch,
        );
        let result = result.map_err(|mut e| {
            // Name every rank whose connection is gone: when this rank was only blocked
            // behind a healthy peer, that is where the failure really is.
            if let Error::Timeout { peer, gone, .. }
            | Error::PeerLost {
                rank: peer, gone, ..
            } = &mut e
            {
                let named = *peer;
                // Other failures may be seconds behind (a cut link is noticed by
                // keepalive): give them a moment to show.
                let until = Instant::now() + DIAGNOSIS_GRACE.min(call.timeout);
                loop {
                    let others: Vec<usize> = state
                        .transport
                        .failed_peers()
                        .into_iter()
                        .filter(|&p| p != named && p != self.rank)
                        .collect();
                    if !others.is_empty() || Instant::now() >= until {
                        gone.extend(others);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            e
        });
        if let Err(e) = &result {
            if e.breaks_group() {
                state.broken = Some(e.to_string());
            }
        }
        result
    }

    /// A collective numbered by the group's sequence counter.
    // Internal: the fields of one OpDesc plus its buffers, called from a few places only.
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        count: usize,
        op: Option<ReduceOp>,
        root: Option<usize>,
        plan: impl FnOnce(&HostConfig) -> (Algorithm, Schedule),
        buf: &mut [u8],
        send_from: Option<&[u8]>,
    ) -> Result<(), Error> {
        let (algorithm, schedule) = plan(&self.config);
        self.run(|state| {
            state.seq += 1;
            Job {
                op: OpDesc::new(state.seq, kind, dtype, count, op, root),
                algorithm,
                schedule,
                elem_size: dtype.size(),
                reduce: op.map(|o| (dtype, o)),
                buf,
                send_from,
            }
        })
    }

    fn check_peer(&self, peer: usize, what: &str) -> Result<(), Error> {
        validate_root(peer, self.world_size)?;
        if peer == self.rank {
            return Err(Error::InvalidArgument(format!(
                "rank {}: cannot {what} itself",
                self.rank
            )));
        }
        Ok(())
    }
}

impl<T: Transport> Backend for HostBackend<T> {
    fn name(&self) -> &str {
        self.name
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce(&self, mut buf: BufferMut<'_>, op: ReduceOp) -> Result<(), Error> {
        let dtype = buf.dtype();
        validate_reduce(dtype, op)?;
        let count = buf.len();
        let (rank, n) = (self.rank, self.world_size);
        self.collective(
            CollectiveKind::AllReduce,
            dtype,
            count,
            Some(op),
            None,
            |cfg| {
                let es = dtype.size();
                let algorithm = cfg
                    .all_reduce_algo
                    .pick(count * es, cfg.small_all_reduce_max_bytes);
                let schedule = match algorithm {
                    Algorithm::RecursiveDoubling => {
                        recursive_doubling_all_reduce(rank, n, count, es, cfg.chunk_bytes)
                    }
                    _ => ring_all_reduce(rank, n, count, es, cfg.chunk_bytes),
                };
                (algorithm, schedule)
            },
            buf.bytes_mut(),
            None,
        )
    }

    fn broadcast(&self, mut buf: BufferMut<'_>, root: usize) -> Result<(), Error> {
        validate_root(root, self.world_size)?;
        let dtype = buf.dtype();
        let count = buf.len();
        let (rank, n) = (self.rank, self.world_size);
        self.collective(
            CollectiveKind::Broadcast,
            dtype,
            count,
            None,
            Some(root),
            |cfg| {
                let es = dtype.size();
                if count * es <= cfg.tree_broadcast_max_bytes {
                    (
                        Algorithm::BinomialTree,
                        binomial_tree_broadcast(rank, n, root, count, es, cfg.chunk_bytes),
                    )
                } else {
                    (
                        Algorithm::Chain,
                        chain_broadcast(rank, n, root, count, es, cfg.chunk_bytes),
                    )
                }
            },
            buf.bytes_mut(),
            None,
        )
    }

    fn set_call_timeout(&self, timeout: Option<Duration>) {
        if let Ok(mut state) = self.state.lock() {
            state.call_timeout = timeout;
        }
    }

    fn barrier(&self) -> Result<(), Error> {
        let (rank, n) = (self.rank, self.world_size);
        self.run(|state| {
            state.seq += 1;
            Job {
                op: OpDesc::barrier(state.seq),
                algorithm: Algorithm::Dissemination,
                schedule: dissemination_barrier(rank, n),
                elem_size: 1,
                reduce: None,
                buf: &mut [],
                send_from: None,
            }
        })
    }

    fn reduce(&self, mut buf: BufferMut<'_>, op: ReduceOp, root: usize) -> Result<(), Error> {
        validate_root(root, self.world_size)?;
        let dtype = buf.dtype();
        validate_reduce(dtype, op)?;
        let count = buf.len();
        let (rank, n) = (self.rank, self.world_size);
        self.collective(
            CollectiveKind::Reduce,
            dtype,
            count,
            Some(op),
            Some(root),
            |cfg| {
                (
                    Algorithm::Ring,
                    ring_reduce(rank, n, root, count, dtype.size(), cfg.chunk_bytes),
                )
            },
            buf.bytes_mut(),
            None,
        )
    }

    fn all_gather(&self, input: BufferRef<'_>, mut output: BufferMut<'_>) -> Result<(), Error> {
        let n = self.world_size;
        let dtype = input.dtype();
        validate_blocks(
            "all_gather",
            dtype,
            output.dtype(),
            input.len(),
            output.len(),
            n,
        )?;
        let count = output.len();
        let rank = self.rank;
        let own = segment(count, n, rank);
        let es = dtype.size();
        output.bytes_mut()[own.start * es..own.end * es].copy_from_slice(input.bytes());
        self.collective(
            CollectiveKind::AllGather,
            dtype,
            count,
            None,
            None,
            |cfg| {
                (
                    Algorithm::Ring,
                    ring_all_gather(rank, n, count, es, cfg.chunk_bytes),
                )
            },
            output.bytes_mut(),
            None,
        )
    }

    fn reduce_scatter(
        &self,
        input: BufferRef<'_>,
        mut output: BufferMut<'_>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        let n = self.world_size;
        let dtype = input.dtype();
        validate_blocks(
            "reduce_scatter",
            output.dtype(),
            dtype,
            output.len(),
            input.len(),
            n,
        )?;
        validate_reduce(dtype, op)?;
        let count = input.len();
        let rank = self.rank;
        let es = dtype.size();
        // The ring reduces in place: work on a copy so the caller's input stays intact.
        let mut work = aligned_copy(input.bytes());
        let work_bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut work)[..count * es];
        self.collective(
            CollectiveKind::ReduceScatter,
            dtype,
            count,
            Some(op),
            None,
            |cfg| {
                (
                    Algorithm::Ring,
                    ring_reduce_scatter(rank, n, count, es, cfg.chunk_bytes),
                )
            },
            work_bytes,
            None,
        )?;
        let own = segment(count, n, rank);
        output
            .bytes_mut()
            .copy_from_slice(&work_bytes[own.start * es..own.end * es]);
        Ok(())
    }

    fn all_to_all(&self, input: BufferRef<'_>, mut output: BufferMut<'_>) -> Result<(), Error> {
        let n = self.world_size;
        let dtype = input.dtype();
        if input.len() != output.len() || input.len() % n != 0 {
            return Err(Error::InvalidArgument(format!(
                "all_to_all: input ({}) and output ({}) must have the same length, a multiple of world_size ({n})",
                input.len(),
                output.len()
            )));
        }
        validate_blocks("all_to_all", dtype, output.dtype(), 0, 0, n)?;
        let count = input.len();
        let rank = self.rank;
        let es = dtype.size();
        let own = segment(count, n, rank);
        let own_bytes = own.start * es..own.end * es;
        output.bytes_mut()[own_bytes.clone()].copy_from_slice(&input.bytes()[own_bytes]);
        self.collective(
            CollectiveKind::AllToAll,
            dtype,
            count,
            None,
            None,
            |cfg| {
                (
                    Algorithm::Pairwise,
                    pairwise_all_to_all(rank, n, count, es, cfg.chunk_bytes),
                )
            },
            output.bytes_mut(),
            Some(input.bytes()),
        )
    }

    fn send(&self, buf: BufferRef<'_>, dst: usize, tag: u32) -> Result<(), Error> {
        self.check_peer(dst, "send to")?;
        let (dtype, count) = (buf.dtype(), buf.len());
        let schedule = send_to(dst, count, dtype.size(), self.config.chunk_bytes);
        self.run(|state| {
            state.sent_to[dst] += 1;
            p2p_job(
                state.sent_to[dst],
                dtype,
                count,
                tag,
                schedule,
                &mut [],
                Some(buf.bytes()),
            )
        })
    }

    fn recv(&self, mut buf: BufferMut<'_>, src: usize, tag: u32) -> Result<(), Error> {
        self.check_peer(src, "receive from")?;
        let (dtype, count) = (buf.dtype(), buf.len());
        let schedule = recv_from(src, count, dtype.size(), self.config.chunk_bytes);
        self.run(|state| {
            state.received_from[src] += 1;
            p2p_job(
                state.received_from[src],
                dtype,
                count,
                tag,
                schedule,
                buf.bytes_mut(),
                None,
            )
        })
    }
}

/// A point-to-point message: numbered per direction of the pair, the tag in the root field.
fn p2p_job<'a>(
    seq: u64,
    dtype: DType,
    count: usize,
    tag: u32,
    schedule: Schedule,
    buf: &'a mut [u8],
    send_from: Option<&'a [u8]>,
) -> Job<'a> {
    Job {
        op: OpDesc::send_recv(seq, dtype, count, tag),
        algorithm: Algorithm::Direct,
        schedule,
        elem_size: dtype.size(),
        reduce: None,
        buf,
        send_from,
    }
}

impl<T: fmt::Debug> fmt::Debug for HostBackend<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBackend")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("config", &self.config)
            .field("transport", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}
