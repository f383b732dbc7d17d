//! Host buffers under NCCL: device memory they pass through, kept between calls.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DriverError};
use ringccl_collectives::Error;

use super::ffi::DeviceRegion;
use super::poller::Cx;

/// Device memory that host buffers pass through, kept between calls.
#[derive(Default)]
pub(super) struct Staging {
    pub(super) input: Option<CudaSlice<u8>>,
    pub(super) output: Option<CudaSlice<u8>>,
}

/// Device memory of at least `bytes` in `slot` (grown when too small), as a view of
/// exactly `bytes`.
pub(super) fn staged<'s>(
    slot: &'s mut Option<CudaSlice<u8>>,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<CudaViewMut<'s, u8>, DriverError> {
    let buffer = match slot.take() {
        Some(buffer) if buffer.len() >= bytes => buffer,
        too_small => {
            drop(too_small); // free it before allocating the bigger one
            stream.alloc_zeros::<u8>(bytes.max(1))?
        }
    };
    Ok(slot.insert(buffer).slice_mut(0..bytes))
}

/// [`staged`] with the call's error shape.
pub(super) fn scratch<'s>(
    cx: &Cx<'_>,
    slot: &'s mut Option<CudaSlice<u8>>,
    bytes: usize,
) -> Result<CudaViewMut<'s, u8>, Error> {
    staged(slot, cx.stream, bytes).map_err(cx.driver("allocating staging memory"))
}

/// Copies `host` into the staging slot (on the communicator's stream).
pub(super) fn upload<'s>(
    cx: &Cx<'_>,
    slot: &'s mut Option<CudaSlice<u8>>,
    host: &[u8],
) -> Result<CudaViewMut<'s, u8>, Error> {
    let mut device = scratch(cx, slot, host.len())?;
    cx.stream
        .memcpy_htod(host, &mut device)
        .map_err(cx.driver("copying the buffer to the GPU"))?;
    Ok(device)
}

/// Copies the staged result back into `host`.
pub(super) fn download(
    cx: &Cx<'_>,
    device: &CudaViewMut<'_, u8>,
    host: &mut [u8],
) -> Result<(), Error> {
    cx.stream
        .memcpy_dtoh(device, host)
        .map_err(cx.driver("copying the result from the GPU"))?;
    cx.stream
        .synchronize()
        .map_err(cx.driver("waiting for the copy from the GPU"))
}

/// Runs a one-buffer call on a host buffer staged in `slot`: `host` is copied in when
/// `copy_in` (else the device copy is scratch), `launch` runs on the device copy, and the
/// result is copied back into `host` when `copy_out`.
pub(super) fn in_place(
    cx: &Cx<'_>,
    slot: &mut Option<CudaSlice<u8>>,
    host: &mut [u8],
    copy_in: bool,
    copy_out: bool,
    launch: impl FnOnce(&DeviceRegion<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut device = if copy_in {
        upload(cx, slot, host)?
    } else {
        scratch(cx, slot, host.len())?
    };
    launch(&DeviceRegion::writing(&mut device, cx.stream))?;
    if copy_out {
        download(cx, &device, host)?;
    }
    Ok(())
}

/// Stages `input` and an output of `output.len()` bytes through device memory: copies
/// the input in, hands both regions to `launch`, copies the output back.
pub(super) fn through_staging(
    cx: &Cx<'_>,
    staging: &mut Staging,
    input: &[u8],
    output: &mut [u8],
    launch: impl FnOnce(&DeviceRegion<'_>, &DeviceRegion<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut device_in = upload(cx, &mut staging.input, input)?;
    let mut device_out = scratch(cx, &mut staging.output, output.len())?;
    {
        let input = DeviceRegion::writing(&mut device_in, cx.stream);
        let output = DeviceRegion::writing(&mut device_out, cx.stream);
        launch(&input, &output)?;
    }
    download(cx, &device_out, output)
}
