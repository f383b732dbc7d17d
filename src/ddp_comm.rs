//! `ProcessGroup` as the [`Communicator`](ringccl_ddp::Communicator) of the DDP layer,
//! which speaks the runtime's error: facade errors convert losslessly both ways.

use ringccl_collectives::{BufferMut, Error as RuntimeError, ReduceOp};
use ringccl_ddp::{Communicator, GradBuf, Pending, Wait};

use crate::{ProcessGroup, Work};

/// A queued all-reduce whose result is re-wrapped as a [`GradBuf`].
struct Rewrap<T> {
    work: Work<Vec<T>>,
    wrap: fn(Vec<T>) -> GradBuf,
}

impl<T: Send> Wait<GradBuf> for Rewrap<T> {
    fn wait(self: Box<Self>) -> Result<GradBuf, RuntimeError> {
        Ok((self.wrap)(self.work.wait()?))
    }
}

impl Communicator for ProcessGroup {
    fn rank(&self) -> usize {
        ProcessGroup::rank(self)
    }

    fn world_size(&self) -> usize {
        ProcessGroup::world_size(self)
    }

    fn all_reduce_sum_async(&self, buf: GradBuf) -> Result<Pending<GradBuf>, RuntimeError> {
        fn start<T: ringccl_collectives::Element>(
            pg: &ProcessGroup,
            values: Vec<T>,
            wrap: fn(Vec<T>) -> GradBuf,
        ) -> Result<Pending<GradBuf>, RuntimeError> {
            let work = pg.all_reduce_async(values, ReduceOp::Sum)?;
            Ok(Box::new(Rewrap { work, wrap }))
        }
        match buf {
            GradBuf::F32(v) => start(self, v, GradBuf::F32),
            GradBuf::F64(v) => start(self, v, GradBuf::F64),
            GradBuf::F16(v) => start(self, v, GradBuf::F16),
            GradBuf::BF16(v) => start(self, v, GradBuf::BF16),
            other => Err(RuntimeError::InvalidArgument(format!(
                "no all-reduce for gradient buffers of {}",
                other.dtype()
            ))),
        }
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), RuntimeError> {
        Ok(self.in_order("broadcast", |backend, deadline| {
            backend.broadcast(buf, root, deadline)
        })?)
    }

    fn all_gather_i64(&self, input: &[i64], output: &mut [i64]) -> Result<(), RuntimeError> {
        Ok(self.all_gather(input, output)?)
    }
}
