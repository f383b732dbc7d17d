//! A [`Backend`] that runs ringccl's own schedules on the CPU over any [`Transport`]:
//! with the TCP transport, this is the `"gloo"` backend.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::{validate_reduce, validate_root};
use crate::executor::{execute, Call};
use crate::schedule::{
    binomial_tree_broadcast, chain_broadcast, dissemination_barrier, ring_all_reduce, Schedule,
};
use crate::transport::Transport;
use crate::wire::MAX_FRAME_PAYLOAD;
use crate::{Backend, BufferMut, Error, OpDesc, ReduceOp};

/// Tuning knobs of [`HostBackend`]. Every rank must use the same values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Deadline of each collective.
    pub timeout: Duration,
    /// Largest chunk a ring or chain step sends as one frame.
    pub chunk_bytes: usize,
    /// Broadcasts up to this size use the binomial tree; larger ones the pipelined chain.
    pub tree_broadcast_max_bytes: usize,
}

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            timeout: Duration::from_secs(30 * 60),
            chunk_bytes: 256 * 1024,
            tree_broadcast_max_bytes: 64 * 1024,
        }
    }
}

struct HostState<T> {
    transport: T,
    seq: u64,
    scratch: Vec<u64>,
    broken: Option<String>,
}

/// Runs ring all-reduce, tree/chain broadcast and dissemination barrier over a transport.
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

impl<T: Transport> HostBackend<T> {
    /// Wraps a connected transport. `config.chunk_bytes` is clamped to
    /// `1..=`[`MAX_FRAME_PAYLOAD`].
    pub fn new(name: &'static str, transport: T, mut config: HostConfig) -> HostBackend<T> {
        config.chunk_bytes = config.chunk_bytes.clamp(1, MAX_FRAME_PAYLOAD);
        HostBackend {
            name,
            rank: transport.rank(),
            world_size: transport.world_size(),
            config,
            state: Mutex::new(HostState {
                transport,
                seq: 0,
                scratch: Vec::new(),
                broken: None,
            }),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    fn run(
        &self,
        describe: impl FnOnce(u64) -> OpDesc,
        plan: impl FnOnce(&HostConfig) -> Schedule,
        elem_size: usize,
        reduce: Option<(crate::DType, ReduceOp)>,
        buf: &mut [u8],
    ) -> Result<(), Error> {
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
        state.seq += 1;
        let op = describe(state.seq);
        let schedule = plan(&self.config);
        let call = Call {
            rank: self.rank,
            world_size: self.world_size,
            op,
            elem_size,
            reduce,
            deadline: Instant::now() + self.config.timeout,
            timeout: self.config.timeout,
        };
        let HostState {
            transport, scratch, ..
        } = &mut *state;
        let result = execute(transport, &schedule, &call, buf, scratch);
        if let Err(e) = &result {
            if e.breaks_group() {
                state.broken = Some(e.to_string());
            }
        }
        result
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
        self.run(
            |seq| OpDesc::all_reduce(seq, dtype, count, op),
            |cfg| ring_all_reduce(rank, n, count, dtype.size(), cfg.chunk_bytes),
            dtype.size(),
            Some((dtype, op)),
            buf.bytes_mut(),
        )
    }

    fn broadcast(&self, mut buf: BufferMut<'_>, root: usize) -> Result<(), Error> {
        validate_root(root, self.world_size)?;
        let dtype = buf.dtype();
        let count = buf.len();
        let (rank, n) = (self.rank, self.world_size);
        self.run(
            |seq| OpDesc::broadcast(seq, dtype, count, root),
            |cfg| {
                if count * dtype.size() <= cfg.tree_broadcast_max_bytes {
                    binomial_tree_broadcast(rank, n, root, count, dtype.size(), cfg.chunk_bytes)
                } else {
                    chain_broadcast(rank, n, root, count, dtype.size(), cfg.chunk_bytes)
                }
            },
            dtype.size(),
            None,
            buf.bytes_mut(),
        )
    }

    fn barrier(&self) -> Result<(), Error> {
        let (rank, n) = (self.rank, self.world_size);
        self.run(
            OpDesc::barrier,
            |_| dissemination_barrier(rank, n),
            1,
            None,
            &mut [],
        )
    }
}

impl<T: fmt::Debug> fmt::Debug for HostBackend<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBackend")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
