//! The host engine's last few schedules, kept for the calls that repeat them.
//!
//! A schedule depends only on the collective, its root or peer, the element count and
//! size, and the engine's rank, group size and chunk size, which never change. Training
//! loops, metrics and barriers repeat the same few calls: building their schedule anew
//! each time (a few small allocations) was a measurable part of an 8 B call.

use std::sync::Arc;

use crate::schedule::Schedule;

/// How many schedules are kept.
const KEPT: usize = 8;

/// Which schedule builder, with the arguments the engine does not fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScheduleKey {
    RecursiveDoublingAllReduce {
        count: usize,
        elem_size: usize,
    },
    RingAllReduce {
        count: usize,
        elem_size: usize,
    },
    HalvingDoublingAllReduce {
        count: usize,
        elem_size: usize,
    },
    HierarchicalAllReduce {
        count: usize,
        elem_size: usize,
    },
    TreeBroadcast {
        root: usize,
        count: usize,
        elem_size: usize,
    },
    ChainBroadcast {
        root: usize,
        count: usize,
        elem_size: usize,
    },
    Barrier,
    GatherReleaseBarrier,
    HierarchicalBroadcast {
        root: usize,
        count: usize,
        elem_size: usize,
        pipelined: bool,
    },
    HierarchicalBarrier,
    RingReduce {
        root: usize,
        count: usize,
        elem_size: usize,
    },
    AllGather {
        count: usize,
        elem_size: usize,
    },
    ReduceScatter {
        count: usize,
        elem_size: usize,
    },
    AllToAll {
        count: usize,
        elem_size: usize,
    },
    Send {
        peer: usize,
        count: usize,
        elem_size: usize,
    },
    Recv {
        peer: usize,
        count: usize,
        elem_size: usize,
    },
}

/// See the module documentation: the [`KEPT`] most recently used schedules.
#[derive(Debug, Default)]
pub(crate) struct ScheduleCache {
    /// Most recently used last.
    kept: Vec<(ScheduleKey, Arc<Schedule>)>,
}

impl ScheduleCache {
    /// The schedule for `key`, built by `build` unless it is kept.
    pub(crate) fn get(
        &mut self,
        key: ScheduleKey,
        build: impl FnOnce() -> Schedule,
    ) -> Arc<Schedule> {
        if let Some(at) = self.kept.iter().rposition(|(k, _)| *k == key) {
            let last = self.kept.len() - 1;
            if at != last {
                let entry = self.kept.remove(at);
                self.kept.push(entry);
            }
            return Arc::clone(&self.kept[last].1);
        }
        if self.kept.len() == KEPT {
            self.kept.remove(0);
        }
        let schedule = Arc::new(build());
        self.kept.push((key, Arc::clone(&schedule)));
        schedule
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::dissemination_barrier;

    #[test]
    fn a_kept_schedule_is_reused_and_the_least_recently_used_goes_first() {
        let mut cache = ScheduleCache::default();
        let key = |count| ScheduleKey::AllGather {
            count,
            elem_size: 4,
        };
        let mut built = 0;
        let mut get = |cache: &mut ScheduleCache, k| {
            cache.get(k, || {
                built += 1;
                dissemination_barrier(0, 4)
            })
        };
        let first = get(&mut cache, key(0));
        let again = get(&mut cache, key(0));
        assert!(Arc::ptr_eq(&first, &again));
        for count in 1..KEPT {
            get(&mut cache, key(count));
        }
        get(&mut cache, key(0)); // used again: now the most recent
        get(&mut cache, key(100)); // evicts key(1), the least recently used
        get(&mut cache, key(0));
        get(&mut cache, key(1));
        assert_eq!(built, KEPT + 2, "key(0) stayed; key(1) was built again");
        assert_eq!(cache.kept.len(), KEPT);
    }
}
