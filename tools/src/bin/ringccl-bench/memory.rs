//! `--memory`: whether the buffers live in host memory (the heap, or shared buffers) or
//! GPU memory.

use ringccl::ProcessGroup;

use super::args::Args;
use super::bench_op::BenchOp;
#[cfg(feature = "nccl")]
use super::device;

/// Where device buffers live (a CUDA stream), when the benchmark uses them.
#[cfg(feature = "nccl")]
pub(crate) type DeviceStream = std::sync::Arc<ringccl::cudarc::driver::CudaStream>;
/// Without the `nccl` feature there are no device buffers.
#[cfg(not(feature = "nccl"))]
pub(crate) enum DeviceStream {}

/// The stream for `--memory device` (or `auto` under nccl), or `None` for host buffers.
pub(crate) fn device_stream(
    args: &Args,
    pg: &ProcessGroup,
    coll: BenchOp,
) -> Result<Option<DeviceStream>, String> {
    let wanted = match args.memory.as_str() {
        "host" | "shared" => false,
        "device" => true,
        // Collectives without a device method are measured on host buffers.
        "auto" => pg.backend() == "nccl" && cfg!(feature = "nccl") && device_capable(coll),
        other => {
            return Err(format!(
                "unknown --memory {other:?}: use host, shared, device or auto"
            ))
        }
    };
    if !wanted {
        return Ok(None);
    }
    if !device_capable(coll) {
        return Err(format!(
            "--memory device does not support --coll {}",
            coll.name()
        ));
    }
    #[cfg(feature = "nccl")]
    return device::stream_for(pg).map(Some).map_err(|e| e.to_string());
    #[cfg(not(feature = "nccl"))]
    Err("--memory device needs ringccl built with its `nccl` feature".into())
}

/// Whether `coll` has a device-buffer method to measure.
fn device_capable(coll: BenchOp) -> bool {
    #[cfg(feature = "nccl")]
    return device::supports(coll);
    #[cfg(not(feature = "nccl"))]
    {
        let _ = coll;
        false
    }
}
