//! A description of one collective call, as carried in every frame header and named in
//! every error.

use std::fmt;

use crate::{DType, ReduceOp};

/// Which collective a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CollectiveKind {
    /// All-reduce.
    AllReduce,
    /// Broadcast from a root.
    Broadcast,
    /// Barrier.
    Barrier,
    /// Reduce to a root.
    Reduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// All-to-all.
    AllToAll,
    /// Point-to-point send/receive; `root` carries the tag and the sequence number counts
    /// the messages of one direction of one pair of ranks.
    SendRecv,
}

impl CollectiveKind {
    const ALL: [CollectiveKind; 8] = [
        CollectiveKind::AllReduce,
        CollectiveKind::Broadcast,
        CollectiveKind::Barrier,
        CollectiveKind::Reduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllToAll,
        CollectiveKind::SendRecv,
    ];

    /// The name torch.distributed users know (`all_reduce`, `broadcast`, `barrier`).
    pub const fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::Reduce => "reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::SendRecv => "send/recv",
        }
    }

    /// Inverse of [`CollectiveKind::name`].
    pub fn from_name(name: &str) -> Option<CollectiveKind> {
        CollectiveKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
    }

    /// Stable one-byte code used on the wire.
    pub const fn code(self) -> u8 {
        match self {
            CollectiveKind::AllReduce => 0,
            CollectiveKind::Broadcast => 1,
            CollectiveKind::Barrier => 2,
            CollectiveKind::Reduce => 3,
            CollectiveKind::AllGather => 4,
            CollectiveKind::ReduceScatter => 5,
            CollectiveKind::AllToAll => 6,
            CollectiveKind::SendRecv => 7,
        }
    }

    /// Inverse of [`CollectiveKind::code`].
    pub fn from_code(code: u8) -> Option<CollectiveKind> {
        CollectiveKind::ALL.get(usize::from(code)).copied()
    }
}

/// One collective call: its sequence number in the group and everything every rank must
/// agree on (kind, element type, count, operator, root).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpDesc {
    /// Position of this call among the group's collectives, counted from 1.
    pub seq: u64,
    /// Which collective.
    pub kind: CollectiveKind,
    /// Element type, for collectives that carry data.
    pub dtype: Option<DType>,
    /// Number of elements in the caller's buffer.
    pub count: u64,
    /// Reduction operator, for reducing collectives.
    pub op: Option<ReduceOp>,
    /// Root rank, for rooted collectives.
    pub root: Option<u32>,
}

impl OpDesc {
    /// An all-reduce of `count` elements.
    pub fn all_reduce(seq: u64, dtype: DType, count: usize, op: ReduceOp) -> OpDesc {
        OpDesc {
            seq,
            kind: CollectiveKind::AllReduce,
            dtype: Some(dtype),
            count: count as u64,
            op: Some(op),
            root: None,
        }
    }

    /// A broadcast of `count` elements from `root`.
    pub fn broadcast(seq: u64, dtype: DType, count: usize, root: usize) -> OpDesc {
        OpDesc {
            seq,
            kind: CollectiveKind::Broadcast,
            dtype: Some(dtype),
            count: count as u64,
            op: None,
            root: Some(root as u32),
        }
    }

    /// Any data-carrying collective: `kind` over `count` elements of `dtype`, with an
    /// optional operator and root.
    pub fn new(
        seq: u64,
        kind: CollectiveKind,
        dtype: DType,
        count: usize,
        op: Option<ReduceOp>,
        root: Option<usize>,
    ) -> OpDesc {
        OpDesc {
            seq,
            kind,
            dtype: Some(dtype),
            count: count as u64,
            op,
            root: root.map(|r| r as u32),
        }
    }

    /// A point-to-point message of `count` elements carrying `tag`; `seq` counts the
    /// messages of one direction of one pair of ranks.
    pub fn send_recv(seq: u64, dtype: DType, count: usize, tag: u32) -> OpDesc {
        OpDesc {
            seq,
            kind: CollectiveKind::SendRecv,
            dtype: Some(dtype),
            count: count as u64,
            op: None,
            root: Some(tag),
        }
    }

    /// A barrier.
    pub fn barrier(seq: u64) -> OpDesc {
        OpDesc {
            seq,
            kind: CollectiveKind::Barrier,
            dtype: None,
            count: 0,
            op: None,
            root: None,
        }
    }
}

impl fmt::Display for OpDesc {
    /// `op #17 broadcast(root=0, 1024 x f32)`, `op #3 all_reduce(sum, 8 x f16)`, `op #5 barrier`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op #{} {}", self.seq, self.kind.name())?;
        if self.kind == CollectiveKind::Barrier {
            return Ok(());
        }
        f.write_str("(")?;
        if let Some(op) = self.op {
            write!(f, "{op}, ")?;
        }
        if let Some(root) = self.root {
            let label = if self.kind == CollectiveKind::SendRecv {
                "tag"
            } else {
                "root"
            };
            write!(f, "{label}={root}, ")?;
        }
        match self.dtype {
            Some(dtype) => write!(f, "{} x {dtype})", self.count),
            None => write!(f, "{} elements)", self.count),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_everything_a_user_needs() {
        assert_eq!(
            OpDesc::broadcast(17, DType::F32, 1024, 0).to_string(),
            "op #17 broadcast(root=0, 1024 x f32)"
        );
        assert_eq!(
            OpDesc::all_reduce(17, DType::F32, 1024, ReduceOp::Sum).to_string(),
            "op #17 all_reduce(sum, 1024 x f32)"
        );
        assert_eq!(OpDesc::barrier(4).to_string(), "op #4 barrier");
        for kind in CollectiveKind::ALL {
            assert_eq!(CollectiveKind::from_code(kind.code()), Some(kind));
            assert_eq!(CollectiveKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(CollectiveKind::from_name("allreduce"), None);
    }
}
