//! The built-in communication hooks ([`CommHook`]s): how a full bucket is reduced across
//! ranks.

use ringccl_collectives::half::{bf16, f16};
use ringccl_collectives::Error;

use crate::communicator::{then, Communicator, Pending};
use crate::element::GradElement;
use crate::space::CommHook;

/// The default: one all-reduce (sum) of the bucket in its own type.
#[derive(Clone, Copy, Debug, Default)]
pub struct AllReduceHook;

impl<T: GradElement> CommHook<T> for AllReduceHook {
    fn start(&self, comm: &dyn Communicator, bucket: Vec<T>) -> Result<Pending<Vec<T>>, Error> {
        let pending = comm.all_reduce_sum_async(T::wrap(bucket))?;
        Ok(then(pending, |buf| {
            T::unwrap(buf).map_err(|other| {
                Error::InvalidArgument(format!(
                    "the all-reduce returned {} values, expected {}",
                    other.dtype(),
                    T::DTYPE
                ))
            })
        }))
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
                let pending =
                    <AllReduceHook as CommHook<$narrow>>::start(&AllReduceHook, comm, narrow)?;
                let mut into = bucket;
                Ok(then(pending, move |narrow| {
                    for (out, x) in into.iter_mut().zip(narrow) {
                        *out = T::from_f32(x.to_f32());
                    }
                    Ok(into)
                }))
            }
        }
    };
}

compress_hook!(Fp16CompressHook, f16);
compress_hook!(Bf16CompressHook, bf16);
