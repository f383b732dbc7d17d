//! The fusion buffers [`ProcessGroup::all_reduce_bucketed`](crate::ProcessGroup::all_reduce_bucketed)
//! recycles between calls.

use std::any::Any;
use std::sync::Mutex;

use ringccl_collectives::Element;

/// How many fused buckets [`ProcessGroup::all_reduce_bucketed`] keeps on the wire while
/// it packs the next one.
pub(crate) const BUCKETS_IN_FLIGHT: usize = 2;

/// Fusion buffers kept between calls of `all_reduce_bucketed`, so that a training loop
/// does not allocate (and page-fault in) fresh buckets every step.
#[derive(Default)]
pub(crate) struct FusionPool {
    /// Each entry is a `Vec<Vec<T>>` for some element type `T`.
    by_type: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl FusionPool {
    pub(crate) fn take<T: Element>(&self) -> Vec<Vec<T>> {
        let Ok(mut pool) = self.by_type.lock() else {
            return Vec::new();
        };
        let found = pool.iter().position(|entry| entry.is::<Vec<Vec<T>>>());
        found
            .map(|i| pool.swap_remove(i))
            .and_then(|entry| entry.downcast::<Vec<Vec<T>>>().ok())
            .map_or_else(Vec::new, |buffers| *buffers)
    }

    pub(crate) fn put<T: Element>(&self, mut buffers: Vec<Vec<T>>) {
        buffers.truncate(BUCKETS_IN_FLIGHT + 1);
        if let Ok(mut pool) = self.by_type.lock() {
            pool.push(Box::new(buffers));
        }
    }
}
