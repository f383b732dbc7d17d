//! Can NCCL run here? Loading checks, the device count and the version floor, without
//! touching the network.

use crate::DeviceError;
use cudarc::driver::CudaContext;

use super::ffi;
use super::libraries::{check_driver_library, check_nccl_library};

/// The oldest NCCL this backend drives (non-blocking communicators, `ncclCommFinalize`,
/// `ncclGetLastError`, bf16 and `ncclAvg` are all older).
pub(super) const MIN_NCCL_VERSION: i32 = 21800;

fn unavailable(reason: String) -> DeviceError {
    DeviceError::Unavailable { reason }
}

/// The number of CUDA devices this process sees, or an error that says why there are
/// none (no driver library, a failing driver, no device). Never panics.
pub fn cuda_device_count() -> Result<usize, DeviceError> {
    check_driver_library().map_err(unavailable)?;
    let count = CudaContext::device_count()
        .map_err(|e| unavailable(format!("the CUDA driver loaded but failed: {e}")))?;
    match usize::try_from(count) {
        Ok(count) if count > 0 => Ok(count),
        _ => Err(unavailable(
            "the CUDA driver loaded but sees no device (check nvidia-smi and \
             CUDA_VISIBLE_DEVICES)"
                .into(),
        )),
    }
}

/// See [`NcclBackend::probe`](super::NcclBackend::probe).
pub(super) fn probe() -> Result<usize, DeviceError> {
    let count = cuda_device_count()?;
    check_nccl_library().map_err(unavailable)?;
    let version = ffi::nccl_version()
        .map_err(|code| unavailable(format!("ncclGetVersion failed: {}", code.describe())))?;
    if version < MIN_NCCL_VERSION {
        return Err(unavailable(format!(
            "NCCL {} is loaded but ringccl needs NCCL 2.18 or newer; put a newer \
             libnccl first on LD_LIBRARY_PATH",
            version_text(version)
        )));
    }
    Ok(count)
}

/// NCCL's version code as `major.minor.patch`.
fn version_text(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_as_dotted_versions() {
        assert_eq!(version_text(22803), "2.28.3");
        assert_eq!(version_text(MIN_NCCL_VERSION), "2.18.0");
    }
}
