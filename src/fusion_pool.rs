//! The fusion buffers [`ProcessGroup::all_reduce_bucketed`](crate::ProcessGroup::all_reduce_bucketed)
//! recycles between calls: [`SharedBuffer`]s, in shared memory where the group's ranks
//! are processes of one host (so that their all-reduce runs in place), on the heap
//! otherwise.

use std::any::Any;
use std::sync::Mutex;

use ringccl_collectives::Element;
use ringccl_transports::shm::SharedBuffer;

/// How many fused buckets [`ProcessGroup::all_reduce_bucketed`] keeps on the wire while
/// it packs the next one.
pub(crate) const BUCKETS_IN_FLIGHT: usize = 2;

/// Fusion buffers kept between calls of `all_reduce_bucketed`, so that a training loop
/// does not allocate (and page-fault in) fresh buckets every step.
#[derive(Default)]
pub(crate) struct FusionPool {
    /// Each entry is a `Vec<SharedBuffer<T>>` for some element type `T`.
    by_type: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl FusionPool {
    pub(crate) fn take<T: Element>(&self) -> Vec<SharedBuffer<T>> {
        let Ok(mut pool) = self.by_type.lock() else {
            return Vec::new();
        };
        let found = pool
            .iter()
            .position(|entry| entry.is::<Vec<SharedBuffer<T>>>());
        found
            .map(|i| pool.swap_remove(i))
            .and_then(|entry| entry.downcast::<Vec<SharedBuffer<T>>>().ok())
            .map_or_else(Vec::new, |buffers| *buffers)
    }

    pub(crate) fn put<T: Element>(&self, mut buffers: Vec<SharedBuffer<T>>) {
        buffers.truncate(BUCKETS_IN_FLIGHT + 1);
        if let Ok(mut pool) = self.by_type.lock() {
            pool.push(Box::new(buffers));
        }
    }
}
