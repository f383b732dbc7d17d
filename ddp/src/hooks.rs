//! Communication hooks: how a full bucket is reduced across ranks.

use std::fmt;
use std::marker::PhantomData;

use ringccl_collectives::half::{bf16, f16};
use ringccl_collectives::Error;

use crate::communicator::{Communicator, GradBuf, Pending, Wait};
use crate::element::GradElement;

/// Reduces one bucket across ranks.
///
/// DDP hands a hook each bucket once all its gradients are ready, **already divided by
/// the world size**, in bucket order on every rank. The hook starts the reduction and
/// returns a [`Pending`] whose result is the bucket's sum over ranks (the average of
/// the original gradients), of the same length.
pub trait CommHook<T: GradElement>: Send + Sync + fmt::Debug {
    /// Starts reducing `bucket`.
    fn start(&self, comm: &dyn Communicator, bucket: Vec<T>) -> Result<Pending<Vec<T>>, Error>;
}

/// The default: one all-reduce (sum) of the bucket in its own type.
#[derive(Clone, Copy, Debug, Default)]
pub struct AllReduceHook;

impl<T: GradElement> CommHook<T> for AllReduceHook {
    fn start(&self, comm: &dyn Communicator, bucket: Vec<T>) -> Result<Pending<Vec<T>>, Error> {
        let pending = comm.all_reduce_sum_async(T::wrap(bucket))?;
        Ok(Box::new(Unwrapping::<T> {
            pending,
            _t: PhantomData,
        }))
    }
}

struct Unwrapping<T> {
    pending: Pending<GradBuf>,
    _t: PhantomData<fn() -> T>,
}

impl<T: GradElement> Wait<Vec<T>> for Unwrapping<T> {
    fn wait(self: Box<Self>) -> Result<Vec<T>, Error> {
        let buf = self.pending.wait()?;
        T::unwrap(buf).map_err(|other| {
            Error::InvalidArgument(format!(
                "the all-reduce returned {} values, expected {}",
                other.dtype(),
                T::DTYPE
            ))
        })
    }
}

/// Halves the bytes on the wire: the bucket is rounded to `f16`, all-reduced in `f16`,
/// and widened back (torch's `fp16_compress_hook`). Values beyond f16's range (±65504)
/// become infinite; prefer [`Bf16CompressHook`] for gradients that can be large.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp16CompressHook;

/// Like [`Fp16CompressHook`] with `bf16`: f32's range, 8 bits of precision
/// (torch's `bf16_compress_hook`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Bf16CompressHook;

macro_rules! compress_hook {
    ($hook:ty, $narrow:ty) => {
        impl<T: GradElement> CommHook<T> for $hook {
            fn start(
                &self,
                comm: &dyn Communicator,
                bucket: Vec<T>,
            ) -> Result<Pending<Vec<T>>, Error> {
                let narrow: Vec<$narrow> = bucket
                    .iter()
                    .map(|&x| <$narrow>::from_f32(x.to_f32()))
                    .collect();
                let pending = AllReduceHook.start(comm, narrow)?;
                Ok(Box::new(Widening::<$narrow, T> {
                    pending,
                    into: bucket,
                }))
            }
        }
    };
}

compress_hook!(Fp16CompressHook, f16);
compress_hook!(Bf16CompressHook, bf16);

/// Waits for a narrowed all-reduce and widens the result into the original buffer.
struct Widening<N, T> {
    pending: Pending<Vec<N>>,
    into: Vec<T>,
}

impl<N: GradElement, T: GradElement> Wait<Vec<T>> for Widening<N, T> {
    fn wait(self: Box<Self>) -> Result<Vec<T>, Error> {
        let Widening { pending, mut into } = *self;
        let narrow = pending.wait()?;
        for (out, x) in into.iter_mut().zip(narrow) {
            *out = T::from_f32(x.to_f32());
        }
        Ok(into)
    }
}
