//! `ProcessGroup` as the [`Communicator`](ringccl_ddp::Communicator) of the DDP layer,
//! which speaks the runtime's error: facade errors convert losslessly both ways.

use std::sync::Arc;
use std::time::Instant;

use ringccl_collectives::{BufferMut, Element, Error as RuntimeError, ReduceOp};
use ringccl_ddp::{BucketLabel, Communicator, GradBuf, Pending, Wait};
use ringccl_observe::timeline::{BucketArgs, Span, SpanArgs, Timeline, TraceFile};

use crate::{ProcessGroup, Work};

/// A queued all-reduce whose result is re-wrapped as the DDP layer's type-erased buffer
/// (a [`GradBuf`], or a device buffer).
struct Rewrap<V, B> {
    work: Work<V>,
    wrap: fn(V) -> B,
}

impl<V: Send, B> Wait<B> for Rewrap<V, B> {
    fn wait(self: Box<Self>) -> Result<B, RuntimeError> {
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

    fn trace_file(&self) -> Option<Arc<TraceFile>> {
        ProcessGroup::trace_file(self).cloned()
    }

    /// With a trace, the bucket's all-reduce is also a span on the `ddp` row, from the
    /// moment it starts on the background worker to its end.
    fn all_reduce_bucket_async(
        &self,
        buf: GradBuf,
        label: BucketLabel,
    ) -> Result<Pending<GradBuf>, RuntimeError> {
        let Some(file) = ProcessGroup::trace_file(self) else {
            return self.all_reduce_sum_async(buf);
        };
        let row = file.row("ddp");
        match buf {
            GradBuf::F32(v) => traced_bucket(self, v, GradBuf::F32, label, row),
            GradBuf::F64(v) => traced_bucket(self, v, GradBuf::F64, label, row),
            GradBuf::F16(v) => traced_bucket(self, v, GradBuf::F16, label, row),
            GradBuf::BF16(v) => traced_bucket(self, v, GradBuf::BF16, label, row),
            other => self.all_reduce_sum_async(other),
        }
    }
}

/// Queues the all-reduce of bucket `label` and records its span on `row` when it ends.
fn traced_bucket<T: Element>(
    pg: &ProcessGroup,
    mut values: Vec<T>,
    wrap: fn(Vec<T>) -> GradBuf,
    label: BucketLabel,
    row: Timeline,
) -> Result<Pending<GradBuf>, RuntimeError> {
    let queued = Instant::now();
    let work = pg.queue("all_reduce", move |backend, deadline| {
        let started = Instant::now();
        let result =
            backend.all_reduce(BufferMut::from_slice(&mut values), ReduceOp::Sum, deadline);
        let args = BucketArgs {
            bucket: label.bucket,
            step: label.step,
            count: values.len(),
            bytes: (values.len() * T::DTYPE.size()) as u64,
            waited: started.saturating_duration_since(queued),
        };
        let name = format!("bucket {}", label.bucket);
        row.record(Span::new(
            name,
            started,
            Instant::now(),
            SpanArgs::Bucket(args),
        ));
        result.map(|()| values)
    })?;
    Ok(Box::new(Rewrap { work, wrap }))
}

/// Device DDP's collectives: under `"nccl"` on NCCL's stream, stream-ordered (a bucket's
/// reduction is ready once NCCL has it, and the group's worker watches it against its
/// deadline); under `"gloo"` staged through host memory.
#[cfg(feature = "nccl")]
mod device {
    use std::sync::Arc;

    use ringccl_collectives::{Error as RuntimeError, ReduceOp};
    use ringccl_ddp::{DeviceBuf, DeviceBufMut, DeviceCommunicator, Pending};
    use ringccl_nccl::cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
    use ringccl_nccl::DeviceElement;

    use super::Rewrap;
    use crate::device::{After, Completion};
    use crate::ProcessGroup;

    impl DeviceCommunicator for ProcessGroup {
        fn device_stream(&self) -> Option<Arc<CudaStream>> {
            self.nccl_stream()
        }

        fn all_reduce_device_sum(
            &self,
            buf: DeviceBuf,
            after: CudaEvent,
            staging: Option<Arc<CudaStream>>,
        ) -> Result<Pending<DeviceBuf>, RuntimeError> {
            fn start<T: DeviceElement>(
                pg: &ProcessGroup,
                values: CudaSlice<T>,
                wrap: fn(CudaSlice<T>) -> DeviceBuf,
                after: After,
            ) -> Result<Pending<DeviceBuf>, RuntimeError> {
                let work = pg.all_reduce_device_async_after(
                    values,
                    ReduceOp::Sum,
                    Some(after),
                    Completion::Enqueued,
                )?;
                Ok(Box::new(Rewrap { work, wrap }))
            }
            let after = After {
                event: after,
                staging,
            };
            match buf {
                DeviceBuf::F32(v) => start(self, v, DeviceBuf::F32, after),
                DeviceBuf::F64(v) => start(self, v, DeviceBuf::F64, after),
                DeviceBuf::F16(v) => start(self, v, DeviceBuf::F16, after),
                DeviceBuf::BF16(v) => start(self, v, DeviceBuf::BF16, after),
                other => Err(RuntimeError::InvalidArgument(format!(
                    "rank {}: no device all-reduce for gradient buffers of {}",
                    self.rank(),
                    other.dtype()
                ))),
            }
        }

        fn broadcast_device_buf(
            &self,
            buf: DeviceBufMut<'_>,
            root: usize,
        ) -> Result<(), RuntimeError> {
            let sent = match buf {
                DeviceBufMut::F32(v) => ProcessGroup::broadcast_device(self, v, root),
                DeviceBufMut::F64(v) => ProcessGroup::broadcast_device(self, v, root),
                DeviceBufMut::F16(v) => ProcessGroup::broadcast_device(self, v, root),
                DeviceBufMut::BF16(v) => ProcessGroup::broadcast_device(self, v, root),
                _ => Err(crate::Error::InvalidArgument(format!(
                    "rank {}: no device broadcast for this gradient buffer type",
                    self.rank()
                ))),
            };
            Ok(sent?)
        }

        fn synchronize_device(&self) -> Result<(), RuntimeError> {
            Ok(ProcessGroup::synchronize_device(self)?)
        }
    }
}
