//! Where DDP's buckets live: the few operations that differ between gradients in host
//! memory and gradients in GPU memory. Everything else (the reducer's bookkeeping, the
//! step, the errors, the hooks' contract) is [`Ddp`](crate::Ddp)'s, once.

use std::fmt;

use ringccl_collectives::{BufferMut, Error};

use crate::bucket_comm::BucketComm;
use crate::communicator::{BucketLabel, Communicator, Pending};
use crate::element::GradElement;
use crate::DdpError;

/// The memory a [`Ddp`](crate::Ddp) keeps its buckets in: [`HostSpace`] (`Vec<T>`), or,
/// with the `device` feature, `DeviceSpace` (`CudaSlice<T>` on a GPU).
///
/// A bucket is one flat buffer holding its parameters' gradients one after the other;
/// DDP decides what goes where and when, the space only moves the values. Every
/// operation that can fail returns the error as DDP reports it (naming the rank and
/// what was being done), and DDP poisons itself with it.
pub trait GradSpace<T: GradElement>: Send + Sized + fmt::Debug + 'static {
    /// One bucket's buffer.
    type Bucket: Send + 'static;
    /// A gradient as the trainer hands it over (`[T]` on the host).
    type Grad<'g>: ?Sized;
    /// A view of a gradient in its bucket (`&[T]` on the host).
    type View<'b>
    where
        Self: 'b;
    /// A writable view of a gradient in its bucket (`&mut [T]` on the host).
    type ViewMut<'b>
    where
        Self: 'b;
    /// A parameter as [`broadcast_parameters`](crate::Ddp::broadcast_parameters) takes
    /// it (`[T]` on the host).
    type Param: ?Sized;
    /// What a [`CommHook`] over this space is handed with each bucket: the group (on the
    /// host, `dyn Communicator`, its all-reduces labelled with the bucket).
    type Comm<'c>: ?Sized
    where
        Self: 'c;

    /// A zeroed bucket of `len` elements.
    fn alloc(&self, len: usize) -> Result<Self::Bucket, DdpError>;

    /// Whether `bucket` is what a bucket of `len` elements allocates (a hook must hand
    /// back what it was given).
    fn holds(bucket: &Self::Bucket, len: usize) -> bool;

    /// The number of elements of a gradient.
    fn grad_len(grad: &Self::Grad<'_>) -> usize;

    /// The number of elements of a parameter.
    fn param_len(param: &Self::Param) -> usize;

    /// Refuses a gradient this space cannot take (on the device: one on another GPU),
    /// before anything changes. The host takes every gradient.
    fn check_grad(&self, index: usize, grad: &Self::Grad<'_>) -> Result<(), DdpError> {
        let _ = (index, grad);
        Ok(())
    }

    /// Writes `grad` at `at` in `bucket`, divided by `n` (not when `n` is 1), added to
    /// what is there when `accumulate`.
    fn store(
        &self,
        bucket: &mut Self::Bucket,
        at: usize,
        grad: &Self::Grad<'_>,
        n: usize,
        accumulate: bool,
    ) -> Result<(), DdpError>;

    /// Divides every element of `bucket` by `n`.
    fn divide(&self, bucket: &mut Self::Bucket, n: usize) -> Result<(), DdpError>;

    /// Zeroes `len` elements at `at`.
    fn zero(&self, bucket: &mut Self::Bucket, at: usize, len: usize) -> Result<(), DdpError>;

    /// Copies `len` elements from `src` at `src_at` to `dst` at `dst_at` (a new bucket
    /// layout keeping the gradients of the old one).
    fn copy(
        &self,
        src: &Self::Bucket,
        src_at: usize,
        dst: &mut Self::Bucket,
        dst_at: usize,
        len: usize,
    ) -> Result<(), DdpError>;

    /// The `len` elements at `at`.
    fn view(bucket: &Self::Bucket, at: usize, len: usize) -> Self::View<'_>;

    /// The `len` elements at `at`, writable.
    fn view_mut(bucket: &mut Self::Bucket, at: usize, len: usize) -> Self::ViewMut<'_>;

    /// Starts reducing bucket `label` through `hook`.
    fn start(
        &self,
        hook: &dyn CommHook<T, Self>,
        comm: &dyn Communicator,
        label: BucketLabel,
        bucket: Self::Bucket,
    ) -> Result<Pending<Self::Bucket>, Error>;

    /// Every bucket in flight has landed: orders what reads them after their reductions
    /// (on the device, the trainer's stream after the group's). Nothing on the host.
    fn landed(&self) -> Result<(), DdpError> {
        Ok(())
    }

    /// Copies rank 0's `params` to every rank (their lengths are checked), in
    /// broadcasts of about `fuse_bytes` where the space fuses them.
    fn broadcast(
        &self,
        comm: &dyn Communicator,
        params: &mut [&mut Self::Param],
        fuse_bytes: usize,
    ) -> Result<(), Error>;

    /// Waits on the host until the step's reductions have finished where they run. On
    /// the host they have when `finish` returns.
    fn synchronize(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// Buckets in host memory (`Vec<T>`): [`DistributedDataParallel`](crate::DistributedDataParallel).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostSpace;

impl<T: GradElement> GradSpace<T> for HostSpace {
    type Bucket = Vec<T>;
    type Grad<'g> = [T];
    type View<'b> = &'b [T];
    type ViewMut<'b> = &'b mut [T];
    type Param = [T];
    type Comm<'c> = dyn Communicator + 'c;

    fn alloc(&self, len: usize) -> Result<Vec<T>, DdpError> {
        Ok(vec![T::default(); len])
    }

    fn holds(bucket: &Vec<T>, len: usize) -> bool {
        bucket.len() == len
    }

    fn grad_len(grad: &[T]) -> usize {
        grad.len()
    }

    fn param_len(param: &[T]) -> usize {
        param.len()
    }

    fn store(
        &self,
        bucket: &mut Vec<T>,
        at: usize,
        grad: &[T],
        n: usize,
        accumulate: bool,
    ) -> Result<(), DdpError> {
        let slot = &mut bucket[at..at + grad.len()];
        match (accumulate, n != 1) {
            (false, true) => slot
                .iter_mut()
                .zip(grad)
                .for_each(|(d, &g)| *d = g.div_count(n)),
            (false, false) => slot.copy_from_slice(grad),
            (true, true) => slot
                .iter_mut()
                .zip(grad)
                .for_each(|(d, &g)| *d = d.add(g.div_count(n))),
            (true, false) => slot.iter_mut().zip(grad).for_each(|(d, &g)| *d = d.add(g)),
        }
        Ok(())
    }

    fn divide(&self, bucket: &mut Vec<T>, n: usize) -> Result<(), DdpError> {
        bucket.iter_mut().for_each(|x| *x = x.div_count(n));
        Ok(())
    }

    fn zero(&self, bucket: &mut Vec<T>, at: usize, len: usize) -> Result<(), DdpError> {
        bucket[at..at + len].fill(T::default());
        Ok(())
    }

    fn copy(
        &self,
        src: &Vec<T>,
        src_at: usize,
        dst: &mut Vec<T>,
        dst_at: usize,
        len: usize,
    ) -> Result<(), DdpError> {
        dst[dst_at..dst_at + len].copy_from_slice(&src[src_at..src_at + len]);
        Ok(())
    }

    fn view(bucket: &Vec<T>, at: usize, len: usize) -> &[T] {
        &bucket[at..at + len]
    }

    fn view_mut(bucket: &mut Vec<T>, at: usize, len: usize) -> &mut [T] {
        &mut bucket[at..at + len]
    }

    fn start(
        &self,
        hook: &dyn CommHook<T, HostSpace>,
        comm: &dyn Communicator,
        label: BucketLabel,
        bucket: Vec<T>,
    ) -> Result<Pending<Vec<T>>, Error> {
        hook.start(&BucketComm { comm, label }, bucket)
    }

    /// One broadcast per `fuse_bytes` of parameters, not one per tensor.
    fn broadcast(
        &self,
        comm: &dyn Communicator,
        params: &mut [&mut [T]],
        fuse_bytes: usize,
    ) -> Result<(), Error> {
        let cap = (fuse_bytes / T::DTYPE.size()).max(1);
        let mut start = 0;
        while start < params.len() {
            let mut end = start;
            let mut len = 0;
            while end < params.len() && (end == start || len + params[end].len() <= cap) {
                len += params[end].len();
                end += 1;
            }
            let mut fused: Vec<T> = Vec::with_capacity(len);
            for p in &params[start..end] {
                fused.extend_from_slice(p);
            }
            comm.broadcast(BufferMut::from_slice(&mut fused), 0)?;
            let mut at = 0;
            for p in &mut params[start..end] {
                let n = p.len();
                p.copy_from_slice(&fused[at..at + n]);
                at += n;
            }
            start = end;
        }
        Ok(())
    }
}

/// Reduces one bucket across ranks, in the memory space `S` the buckets live in (the
/// host's by default: `bucket` is a `Vec<T>` and `comm` the group as a
/// [`Communicator`]).
///
/// DDP hands a hook each bucket once all its gradients are ready, **already divided by
/// the world size**, in bucket order on every rank. The hook starts the reduction and
/// returns a [`Pending`] whose result is the bucket's sum over ranks (the average of
/// the original gradients), of the same length. The built-in hooks
/// ([`AllReduceHook`](crate::AllReduceHook), [`Fp16CompressHook`](crate::Fp16CompressHook),
/// [`Bf16CompressHook`](crate::Bf16CompressHook)) work in every space.
pub trait CommHook<T: GradElement, S: GradSpace<T> = HostSpace>: Send + Sync + fmt::Debug {
    /// Starts reducing `bucket`.
    fn start(&self, comm: &S::Comm<'_>, bucket: S::Bucket) -> Result<Pending<S::Bucket>, Error>;
}
