//! What `--coll` selects: one collective, or one of the ways of all-reducing many tensors.

use ringccl::{CollectiveKind, Error};

/// What `--coll` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BenchOp {
    /// One call of a collective per iteration, named as `CollectiveKind` names it.
    Collective(CollectiveKind),
    /// `all_reduce_bucketed`: `--tensors` tensors through fusion buffers of `--bucket`.
    Bucketed,
    /// `all_reduce_separate`: the same tensors, one `all_reduce` each.
    Separate,
    /// `all_reduce_async`: a background all-reduce overlapped with compute.
    Async,
}

impl BenchOp {
    /// Parses a `--coll` name.
    pub(crate) fn parse(name: &str) -> Result<BenchOp, String> {
        match name {
            "all_reduce_bucketed" => Ok(BenchOp::Bucketed),
            "all_reduce_separate" => Ok(BenchOp::Separate),
            "all_reduce_async" => Ok(BenchOp::Async),
            // Point-to-point messages are not a collective every rank can time.
            _ => CollectiveKind::from_name(name)
                .filter(|&kind| kind != CollectiveKind::SendRecv)
                .map(BenchOp::Collective)
                .ok_or_else(|| format!("unknown --coll {name:?}")),
        }
    }

    /// The `--coll` name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BenchOp::Collective(kind) => kind.name(),
            BenchOp::Bucketed => "all_reduce_bucketed",
            BenchOp::Separate => "all_reduce_separate",
            BenchOp::Async => "all_reduce_async",
        }
    }

    /// The collective each call runs: an all-reduce, for the many-tensor ways.
    pub(crate) fn kind(self) -> CollectiveKind {
        match self {
            BenchOp::Collective(kind) => kind,
            BenchOp::Bucketed | BenchOp::Separate | BenchOp::Async => CollectiveKind::AllReduce,
        }
    }

    /// nccl-tests' bus-bandwidth factor.
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self.kind() {
            CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollectiveKind::AllGather
            | CollectiveKind::ReduceScatter
            | CollectiveKind::AllToAll => (n - 1.0) / n,
            CollectiveKind::Barrier => 0.0,
            _ => 1.0, // broadcast, reduce
        }
    }

    /// Whether it takes a reduction operator (`-o`).
    pub(crate) fn reduces(self) -> bool {
        matches!(
            self.kind(),
            CollectiveKind::AllReduce | CollectiveKind::Reduce | CollectiveKind::ReduceScatter
        )
    }

    /// Whether it has a root (always rank 0 here).
    pub(crate) fn has_root(self) -> bool {
        matches!(
            self.kind(),
            CollectiveKind::Broadcast | CollectiveKind::Reduce
        )
    }

    /// Whether its buffers are `world_size` equal blocks.
    pub(crate) fn in_blocks(self) -> bool {
        matches!(
            self.kind(),
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll
        )
    }
}

/// The error for a collective that [`BenchOp::parse`] never selects (send/recv).
pub(crate) fn not_measured(kind: CollectiveKind) -> Error {
    Error::InvalidArgument(format!("ringccl-bench does not measure {}", kind.name()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_coll_name_round_trips_and_send_recv_is_refused() {
        // Imported here: the `allreduce` bench compiles this module without a test harness.
        use super::BenchOp;
        for name in [
            "all_reduce",
            "broadcast",
            "barrier",
            "reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "all_reduce_bucketed",
            "all_reduce_separate",
            "all_reduce_async",
        ] {
            assert_eq!(BenchOp::parse(name).map(BenchOp::name), Ok(name));
        }
        assert!(BenchOp::parse("send/recv").is_err());
        assert!(BenchOp::parse("allreduce").is_err());
    }
}
