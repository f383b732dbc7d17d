//! `ProcessGroup` as the [`Communicator`](ringccl_ddp::Communicator) of the DDP layer.

use ringccl_collectives::{BufferMut, Error, ReduceOp};
use ringccl_ddp::{Communicator, GradBuf, Pending, Wait};

use crate::{ProcessGroup, Work};

/// A queued all-reduce whose result is re-wrapped as a [`GradBuf`].
struct Rewrap<T> {
    work: Work<Vec<T>>,
    wrap: fn(Vec<T>) -> GradBuf,
}

impl<T: Send> Wait<GradBuf> for Rewrap<T> {
    fn wait(self: Box<Self>) -> Result<GradBuf, Error> {
        self.work.wait().map(self.wrap)
    }
}

impl Communicator for ProcessGroup {
    fn rank(&self) -> usize {
        ProcessGroup::rank(self)
    }

    fn world_size(&self) -> usize {
        ProcessGroup::world_size(self)
    }

    fn all_reduce_sum_async(&self, buf: GradBuf) -> Result<Pending<GradBuf>, Error> {
        fn start<T: ringccl_collectives::Element>(
            pg: &ProcessGroup,
            values: Vec<T>,
            wrap: fn(Vec<T>) -> GradBuf,
        ) -> Result<Pending<GradBuf>, Error> {
            let work = pg.all_reduce_async(values, ReduceOp::Sum)?;
            Ok(Box::new(Rewrap { work, wrap }))
        }
        match buf {
            GradBuf::F32(v) => start(self, v, GradBuf::F32),
            GradBuf::F64(v) => start(self, v, GradBuf::F64),
            GradBuf::F16(v) => start(self, v, GradBuf::F16),
            GradBuf::BF16(v) => start(self, v, GradBuf::BF16),
            other => Err(Error::InvalidArgument(format!(
                "no all-reduce for gradient buffers of {}",
                other.dtype()
            ))),
        }
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), Error> {
        self.in_order(|backend, deadline| backend.broadcast(buf, root, deadline))
    }

    fn all_gather_i64(&self, input: &[i64], output: &mut [i64]) -> Result<(), Error> {
        self.all_gather(input, output)
    }
}
