//! The blocking collectives: each runs on the calling thread, on the caller's borrowed
//! buffers, once every operation issued before it has finished.

use std::time::Duration;

use ringccl_collectives::{BufferMut, BufferRef, Element, ReduceOp};

use crate::{Error, ProcessGroup};

impl ProcessGroup {
    /// Reduces `buf` element-wise across all ranks with `op`; every rank ends with the
    /// bit-identical result. `Avg` works on float types only.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), Error> {
        self.in_order("all_reduce", |b, d| {
            b.all_reduce(BufferMut::from_slice(buf), op, d)
        })
    }

    /// Copies rank `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), Error> {
        self.in_order("broadcast", |b, d| {
            b.broadcast(BufferMut::from_slice(buf), root, d)
        })
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&self) -> Result<(), Error> {
        self.in_order("barrier", |b, d| b.barrier(d))
    }

    /// [`ProcessGroup::all_reduce`] with its own deadline (the group's, from
    /// `InitOptions::timeout`, applies to every other call).
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut x = [1.0f32];
    /// pg.all_reduce_with_timeout(&mut x, ringccl::ReduceOp::Sum, std::time::Duration::from_secs(5))?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all_reduce_with_timeout<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.in_order_within("all_reduce", timeout, |b, d| {
            b.all_reduce(BufferMut::from_slice(buf), op, d)
        })
    }

    /// [`ProcessGroup::broadcast`] with its own deadline.
    pub fn broadcast_with_timeout<T: Element>(
        &self,
        buf: &mut [T],
        root: usize,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.in_order_within("broadcast", timeout, |b, d| {
            b.broadcast(BufferMut::from_slice(buf), root, d)
        })
    }

    /// [`ProcessGroup::barrier`] with its own deadline.
    pub fn barrier_with_timeout(&self, timeout: Duration) -> Result<(), Error> {
        self.in_order_within("barrier", timeout, |b, d| b.barrier(d))
    }

    /// Reduces `buf` across all ranks into rank `root`'s `buf`. The other ranks' `buf`
    /// contents are unspecified afterwards (they hold partial results).
    pub fn reduce<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), Error> {
        self.in_order("reduce", |b, d| {
            b.reduce(BufferMut::from_slice(buf), op, root, d)
        })
    }

    /// Concatenates every rank's `input`, in rank order, into every rank's `output`
    /// (`output.len() == world_size * input.len()`).
    pub fn all_gather<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        self.in_order("all_gather", |b, d| {
            b.all_gather(
                BufferRef::from_slice(input),
                BufferMut::from_slice(output),
                d,
            )
        })
    }

    /// Reduces `input` (`world_size` equal blocks) across ranks: rank `r`'s `output`
    /// receives the reduction of everyone's block `r`
    /// (`input.len() == world_size * output.len()`).
    pub fn reduce_scatter<T: Element>(
        &self,
        input: &[T],
        output: &mut [T],
        op: ReduceOp,
    ) -> Result<(), Error> {
        self.in_order("reduce_scatter", |b, d| {
            b.reduce_scatter(
                BufferRef::from_slice(input),
                BufferMut::from_slice(output),
                op,
                d,
            )
        })
    }

    /// Exchanges blocks: block `q` of this rank's `input` becomes block `rank` of rank
    /// `q`'s `output`. Both buffers hold `world_size` equal blocks.
    pub fn all_to_all<T: Element>(&self, input: &[T], output: &mut [T]) -> Result<(), Error> {
        self.in_order("all_to_all", |b, d| {
            b.all_to_all(
                BufferRef::from_slice(input),
                BufferMut::from_slice(output),
                d,
            )
        })
    }

    /// Sends `buf` to rank `dst`. Rank `dst` must call [`ProcessGroup::recv`] with this
    /// rank, the same tag, length and type; messages between two ranks are received in
    /// the order they were sent (a different tag or size is reported as an error).
    pub fn send<T: Element>(&self, buf: &[T], dst: usize, tag: u32) -> Result<(), Error> {
        self.in_order("send", |b, d| {
            b.send(BufferRef::from_slice(buf), dst, tag, d)
        })
    }

    /// Receives into `buf` the next message from rank `src`, which must carry `tag`.
    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize, tag: u32) -> Result<(), Error> {
        self.in_order("recv", |b, d| {
            b.recv(BufferMut::from_slice(buf), src, tag, d)
        })
    }
}
