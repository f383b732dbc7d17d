//! A call as its peers see it.

use std::fmt;

use crate::{OpDesc, Sequence};

/// One rank's running call as its peers see it: the description every rank checks, and
/// the counter that numbered it (which says, for a point-to-point call, whether it sends
/// or receives and with whom).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDesc {
    /// What the call is.
    pub op: OpDesc,
    /// How it was numbered.
    pub sequence: Sequence,
}

impl fmt::Display for CallDesc {
    /// `op #7 all_reduce(sum, 8 x f32)`, `recv(from rank 1, msg #3, tag=0, 8 x f32)`,
    /// `send(to rank 0, msg #1, tag=5, 1024 x u8)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (verb, dir, peer) = match self.sequence {
            Sequence::Collective => return self.op.fmt(f),
            Sequence::SentTo(peer) => ("send", "to", peer),
            Sequence::ReceivedFrom(peer) => ("recv", "from", peer),
        };
        write!(f, "{verb}({dir} rank {peer}, msg #{}", self.op.seq)?;
        if let Some(tag) = self.op.root {
            write!(f, ", tag={tag}")?;
        }
        match self.op.dtype {
            Some(dtype) => write!(f, ", {} x {dtype})", self.op.count),
            None => write!(f, ", {} elements)", self.op.count),
        }
    }
}
