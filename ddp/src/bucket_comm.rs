//! The communicator a hook sees for one bucket: the group's, with its all-reduces
//! labelled with the bucket, so that the timeline can show them on DDP's row whatever
//! the hook does (plain, fp16, bf16, a user's own).

use std::sync::Arc;

use ringccl_collectives::{BufferMut, Error};
use ringccl_observe::timeline::TraceFile;

use crate::communicator::{BucketLabel, Communicator, GradBuf, Pending};

/// See the module documentation.
pub(crate) struct BucketComm<'a> {
    pub(crate) comm: &'a dyn Communicator,
    pub(crate) label: BucketLabel,
}

impl Communicator for BucketComm<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce_sum_async(&self, buf: GradBuf) -> Result<Pending<GradBuf>, Error> {
        self.comm.all_reduce_bucket_async(buf, self.label)
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), Error> {
        self.comm.broadcast(buf, root)
    }

    fn all_gather_i64(&self, input: &[i64], output: &mut [i64]) -> Result<(), Error> {
        self.comm.all_gather_i64(input, output)
    }

    fn trace_file(&self) -> Option<Arc<TraceFile>> {
        self.comm.trace_file()
    }

    fn all_reduce_bucket_async(
        &self,
        buf: GradBuf,
        label: BucketLabel,
    ) -> Result<Pending<GradBuf>, Error> {
        self.comm.all_reduce_bucket_async(buf, label)
    }
}
