//! The `*_async` collectives: each moves its buffer into a job on the group's background
//! worker and returns a [`Work`] at once.

use ringccl_collectives::{validate_reduce, BufferMut, Element, ReduceOp};

use crate::{Error, ProcessGroup, Work};

impl ProcessGroup {
    /// Starts an all-reduce in the background and returns at once. The buffer moves into
    /// the returned [`Work`] and comes back from [`Work::wait`].
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let work = pg.all_reduce_async(vec![1.0f32; 4], ringccl::ReduceOp::Sum)?;
    /// // ... compute while the all-reduce runs ...
    /// let grads = work.wait()?;
    /// assert_eq!(grads, vec![1.0; 4]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all_reduce_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>, Error> {
        validate_reduce(T::DTYPE, op)?;
        self.queue("all_reduce", move |b, d| {
            b.all_reduce(BufferMut::from_slice(&mut buf), op, d)
                .map(|()| buf)
        })
    }

    /// Starts a broadcast in the background; see [`ProcessGroup::all_reduce_async`].
    pub fn broadcast_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        root: usize,
    ) -> Result<Work<Vec<T>>, Error> {
        self.queue("broadcast", move |b, d| {
            b.broadcast(BufferMut::from_slice(&mut buf), root, d)
                .map(|()| buf)
        })
    }

    /// Starts a barrier in the background.
    pub fn barrier_async(&self) -> Result<Work<()>, Error> {
        self.queue("barrier", |b, d| b.barrier(d))
    }
}
