//! How a device call is ordered against the rest of the GPU's work: what NCCL's stream
//! waits for before the call, and what waits for the call after it.
//!
//! cudarc's own tracking (the read and write events it records per `CudaSlice`) is not
//! enough to rely on: it is off for a buffer whose `CudaContext` handle never made a
//! stream (`CudaContext::new(d)?.default_stream()`), and it knows nothing of work
//! written through other libraries. So every device call orders itself explicitly.

use cudarc::driver::{CudaEvent, CudaStream, DriverError};

/// What a device call is ordered after, and what is ordered after it.
#[derive(Clone, Copy, Debug)]
pub enum StreamOrder<'e> {
    /// PyTorch's rule: the call runs after everything queued on each buffer's stream
    /// when it is made, and work queued on those streams afterwards runs after the call
    /// (also for a call the host waits for, so that a buffer released after a failed
    /// call is not freed under NCCL).
    BufferStreams,
    /// After `event` only, an event the caller recorded where the data was ready; nothing
    /// is ordered after the call except what waits on NCCL's stream
    /// ([`NcclBackend::stream`](crate::NcclBackend::stream)), which the caller joins when
    /// it needs the result. For calls made behind the producer's later work, as DDP's
    /// buckets are (backward goes on queueing kernels on the buffer's stream).
    After(&'e CudaEvent),
}

impl StreamOrder<'_> {
    /// Makes `nccl` (NCCL's stream) wait for the call's inputs, on `buffers`' streams.
    pub(crate) fn before(
        &self,
        nccl: &CudaStream,
        buffers: &[&CudaStream],
    ) -> Result<(), DriverError> {
        match self {
            StreamOrder::BufferStreams => {
                others(nccl, buffers).try_for_each(|stream| nccl.join(stream))
            }
            StreamOrder::After(event) => nccl.wait(event),
        }
    }

    /// Makes `buffers`' streams wait for `done`, the call's completion on `nccl`.
    pub(crate) fn after(
        &self,
        done: &CudaEvent,
        nccl: &CudaStream,
        buffers: &[&CudaStream],
    ) -> Result<(), DriverError> {
        match self {
            StreamOrder::BufferStreams => {
                others(nccl, buffers).try_for_each(|stream| stream.wait(done))
            }
            StreamOrder::After(_) => Ok(()),
        }
    }
}

/// The buffers' streams other than NCCL's, each once.
fn others<'s>(
    nccl: &'s CudaStream,
    buffers: &'s [&'s CudaStream],
) -> impl Iterator<Item = &'s CudaStream> + 's {
    buffers.iter().enumerate().filter_map(move |(i, &stream)| {
        let seen = buffers[..i].iter().any(|s| same(s, stream));
        (!seen && !same(stream, nccl)).then_some(stream)
    })
}

/// Whether two handles are the same CUDA stream.
fn same(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream()
}
