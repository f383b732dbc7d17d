//! One call as the runner hands it to an engine: which collective, its buffers and
//! arguments. The one place that knows each call's shape, its checks and its
//! description.

use crate::backend::{validate_blocks, validate_reduce, validate_root};
use crate::{BufferMut, BufferRef, CollectiveKind, Error, OpDesc, ReduceOp, Sequence};

/// A call and its buffers, after the user's typed slices were erased to bytes.
#[derive(Debug)]
#[non_exhaustive]
pub enum Request<'a> {
    /// See [`Backend::all_reduce`](crate::Backend::all_reduce).
    AllReduce {
        /// Reduced in place.
        buf: BufferMut<'a>,
        /// Operator.
        op: ReduceOp,
    },
    /// See [`Backend::broadcast`](crate::Backend::broadcast).
    Broadcast {
        /// Root's data in, everyone's copy out.
        buf: BufferMut<'a>,
        /// Source rank.
        root: usize,
    },
    /// See [`Backend::barrier`](crate::Backend::barrier).
    Barrier,
    /// See [`Backend::reduce`](crate::Backend::reduce).
    Reduce {
        /// Reduced in place on the root.
        buf: BufferMut<'a>,
        /// Operator.
        op: ReduceOp,
        /// Destination rank.
        root: usize,
    },
    /// See [`Backend::all_gather`](crate::Backend::all_gather).
    AllGather {
        /// This rank's block.
        input: BufferRef<'a>,
        /// Every rank's block, in rank order.
        output: BufferMut<'a>,
    },
    /// See [`Backend::reduce_scatter`](crate::Backend::reduce_scatter).
    ReduceScatter {
        /// `world_size` blocks.
        input: BufferRef<'a>,
        /// The reduction of block `rank`.
        output: BufferMut<'a>,
        /// Operator.
        op: ReduceOp,
    },
    /// See [`Backend::all_to_all`](crate::Backend::all_to_all).
    AllToAll {
        /// Block `q` goes to rank `q`.
        input: BufferRef<'a>,
        /// Block `q` comes from rank `q`.
        output: BufferMut<'a>,
    },
    /// See [`Backend::send`](crate::Backend::send).
    Send {
        /// The message.
        buf: BufferRef<'a>,
        /// Destination rank.
        peer: usize,
        /// Tag the receiver must expect.
        tag: u32,
    },
    /// See [`Backend::recv`](crate::Backend::recv).
    Recv {
        /// Where the message lands.
        buf: BufferMut<'a>,
        /// Source rank.
        peer: usize,
        /// Tag the message must carry.
        tag: u32,
    },
}

impl Request<'_> {
    /// Which collective this is.
    pub fn kind(&self) -> CollectiveKind {
        match self {
            Request::AllReduce { .. } => CollectiveKind::AllReduce,
            Request::Broadcast { .. } => CollectiveKind::Broadcast,
            Request::Barrier => CollectiveKind::Barrier,
            Request::Reduce { .. } => CollectiveKind::Reduce,
            Request::AllGather { .. } => CollectiveKind::AllGather,
            Request::ReduceScatter { .. } => CollectiveKind::ReduceScatter,
            Request::AllToAll { .. } => CollectiveKind::AllToAll,
            Request::Send { .. } | Request::Recv { .. } => CollectiveKind::SendRecv,
        }
    }

    /// The counter that numbers it.
    pub fn sequence(&self) -> Sequence {
        match self {
            Request::Send { peer, .. } => Sequence::SentTo(*peer),
            Request::Recv { peer, .. } => Sequence::ReceivedFrom(*peer),
            _ => Sequence::Collective,
        }
    }

    /// The peer a point-to-point call involves (`None`: every rank).
    pub fn peer(&self) -> Option<usize> {
        match self {
            Request::Send { peer, .. } | Request::Recv { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// Whether the call carries no elements (a barrier always counts as carrying some).
    /// For the gather/scatter-shaped calls this is the input's emptiness, which after
    /// [`Request::validate`] is the output's too.
    pub fn is_empty(&self) -> bool {
        match self {
            Request::Barrier => false,
            Request::AllReduce { buf, .. }
            | Request::Broadcast { buf, .. }
            | Request::Reduce { buf, .. }
            | Request::Recv { buf, .. } => buf.is_empty(),
            Request::Send { buf, .. } => buf.is_empty(),
            Request::AllGather { input, .. }
            | Request::ReduceScatter { input, .. }
            | Request::AllToAll { input, .. } => input.is_empty(),
        }
    }

    /// Checks the arguments, with the same message for the same misuse under every
    /// backend.
    pub fn validate(&self, rank: usize, world_size: usize) -> Result<(), Error> {
        match self {
            Request::AllReduce { buf, op } => validate_reduce(buf.dtype(), *op),
            Request::Broadcast { root, .. } => validate_root(*root, world_size),
            Request::Barrier => Ok(()),
            Request::Reduce { buf, op, root } => {
                validate_root(*root, world_size)?;
                validate_reduce(buf.dtype(), *op)
            }
            Request::AllGather { input, output } => validate_blocks(
                "all_gather",
                input.dtype(),
                output.dtype(),
                input.len(),
                output.len(),
                world_size,
            ),
            Request::ReduceScatter { input, output, op } => {
                validate_blocks(
                    "reduce_scatter",
                    output.dtype(),
                    input.dtype(),
                    output.len(),
                    input.len(),
                    world_size,
                )?;
                validate_reduce(input.dtype(), *op)
            }
            Request::AllToAll { input, output } => {
                if input.len() != output.len() || input.len() % world_size != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "all_to_all: input ({}) and output ({}) must have the same length, a multiple of world_size ({world_size})",
                        input.len(),
                        output.len()
                    )));
                }
                validate_blocks(
                    "all_to_all",
                    input.dtype(),
                    output.dtype(),
                    0,
                    0,
                    world_size,
                )
            }
            Request::Send { peer, .. } => validate_peer(*peer, rank, world_size, "send to"),
            Request::Recv { peer, .. } => validate_peer(*peer, rank, world_size, "receive from"),
        }
    }

    /// The description every rank must agree on, numbered `seq`.
    pub fn describe(&self, seq: u64) -> OpDesc {
        let kind = self.kind();
        match self {
            Request::AllReduce { buf, op } => OpDesc::all_reduce(seq, buf.dtype(), buf.len(), *op),
            Request::Broadcast { buf, root } => {
                OpDesc::broadcast(seq, buf.dtype(), buf.len(), *root)
            }
            Request::Barrier => OpDesc::barrier(seq),
            Request::Reduce { buf, op, root } => {
                OpDesc::new(seq, kind, buf.dtype(), buf.len(), Some(*op), Some(*root))
            }
            Request::AllGather { output, .. } => {
                OpDesc::new(seq, kind, output.dtype(), output.len(), None, None)
            }
            Request::ReduceScatter { input, op, .. } => {
                OpDesc::new(seq, kind, input.dtype(), input.len(), Some(*op), None)
            }
            Request::AllToAll { input, .. } => {
                OpDesc::new(seq, kind, input.dtype(), input.len(), None, None)
            }
            Request::Send { buf, tag, .. } => OpDesc::send_recv(seq, buf.dtype(), buf.len(), *tag),
            Request::Recv { buf, tag, .. } => OpDesc::send_recv(seq, buf.dtype(), buf.len(), *tag),
        }
    }
}

/// Checks that `peer` names another rank of the group.
pub fn validate_peer(peer: usize, rank: usize, world_size: usize, what: &str) -> Result<(), Error> {
    validate_root(peer, world_size)?;
    if peer == rank {
        return Err(Error::InvalidArgument(format!(
            "rank {rank}: cannot {what} itself"
        )));
    }
    Ok(())
}
