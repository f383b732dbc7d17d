//! What `--coll` selects: a collective, or one of the ways of all-reducing many tensors.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Coll {
    AllReduce,
    Broadcast,
    Barrier,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Bucketed,
    Separate,
    Async,
}

impl Coll {
    pub(crate) fn parse(name: &str) -> Result<Coll, String> {
        Ok(match name {
            "all_reduce" => Coll::AllReduce,
            "broadcast" => Coll::Broadcast,
            "barrier" => Coll::Barrier,
            "reduce" => Coll::Reduce,
            "all_gather" => Coll::AllGather,
            "reduce_scatter" => Coll::ReduceScatter,
            "all_to_all" => Coll::AllToAll,
            "all_reduce_bucketed" => Coll::Bucketed,
            "all_reduce_separate" => Coll::Separate,
            "all_reduce_async" => Coll::Async,
            other => return Err(format!("unknown --coll {other:?}")),
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Broadcast => "broadcast",
            Coll::Barrier => "barrier",
            Coll::Reduce => "reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
            Coll::Bucketed => "all_reduce_bucketed",
            Coll::Separate => "all_reduce_separate",
            Coll::Async => "all_reduce_async",
        }
    }

    /// nccl-tests' bus-bandwidth factor.
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce | Coll::Bucketed | Coll::Separate | Coll::Async => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce => 1.0,
            Coll::Barrier => 0.0,
        }
    }

    pub(crate) fn reduces(self) -> bool {
        !matches!(
            self,
            Coll::Broadcast | Coll::Barrier | Coll::AllGather | Coll::AllToAll
        )
    }
}
