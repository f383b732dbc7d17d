//! Every call into libnccl (and the two library probes) that needs `unsafe`, each behind
//! a safe function. Nothing else in the crate holds a raw NCCL handle or device pointer;
//! CUDA memory and streams are managed through cudarc's safe driver API.

// Raw NCCL calls and library probes through cudarc's FFI bindings.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use cudarc::nccl::sys;
use ringccl_collectives::{DType, ReduceOp};

/// Whether libcuda can be loaded (cudarc panics on first use when it cannot).
pub(crate) fn cuda_driver_loadable() -> bool {
    // SAFETY: only dlopens the candidate file names and closes them again; no symbol of
    // the library is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether libnccl can be loaded (cudarc panics on first use when it cannot).
pub(crate) fn nccl_loadable() -> bool {
    // SAFETY: as for `cuda_driver_loadable`.
    unsafe { sys::is_culib_present() }
}

/// A failure code returned by NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NcclCode(sys::ncclResult_t);

impl NcclCode {
    /// `ncclInvalidArgument`, for arguments rejected before reaching NCCL.
    pub(crate) const INVALID_ARGUMENT: NcclCode = NcclCode(sys::ncclResult_t::ncclInvalidArgument);

    /// The code's name and NCCL's one-line description of it.
    pub(crate) fn describe(self) -> String {
        // SAFETY: ncclGetErrorString accepts any code and returns a pointer to a static,
        // NUL-terminated string (or null, which `text_of` handles).
        let text = unsafe { text_of(sys::ncclGetErrorString(self.0)) };
        format!("{:?}: {text}", self.0)
    }

    /// Whether the failure came from a peer or the network rather than this process.
    pub(crate) fn is_remote(self) -> bool {
        matches!(
            self.0,
            sys::ncclResult_t::ncclRemoteError | sys::ncclResult_t::ncclSystemError
        )
    }
}

/// Where an NCCL call stands: a non-blocking communicator may return before the work
/// is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Accepted (enqueued on the stream, or the communicator is ready).
    Done,
    /// Still being processed: poll [`RawComm::async_status`].
    Pending,
}

fn check(result: sys::ncclResult_t) -> Result<Progress, NcclCode> {
    match result {
        sys::ncclResult_t::ncclSuccess => Ok(Progress::Done),
        sys::ncclResult_t::ncclInProgress => Ok(Progress::Pending),
        other => Err(NcclCode(other)),
    }
}

/// Copies a C string NCCL owns into a `String` ("" for null).
///
/// # Safety
/// `text` is null or points to a NUL-terminated string that stays valid for the call.
unsafe fn text_of(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// The loaded library's version as NCCL encodes it (2.28.3 is 22803).
pub(crate) fn nccl_version() -> Result<i32, NcclCode> {
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid, writable c_int for the duration of the call.
    check(unsafe { sys::ncclGetVersion(&mut version) })?;
    Ok(version)
}

/// Length of an NCCL unique id.
pub(crate) const UNIQUE_ID_LEN: usize = 128;

/// Makes the id every rank of a new communicator must share (rank 0 calls this and sends
/// the bytes through the rendezvous store).
pub(crate) fn new_unique_id() -> Result<[u8; UNIQUE_ID_LEN], NcclCode> {
    let mut id = sys::ncclUniqueId {
        internal: [0; UNIQUE_ID_LEN],
    };
    // SAFETY: `id` is a valid, writable ncclUniqueId for the duration of the call.
    check(unsafe { sys::ncclGetUniqueId(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

/// The configuration of a non-blocking communicator: calls return `ncclInProgress`
/// instead of blocking, so the caller can enforce a deadline and abort.
fn non_blocking_config() -> sys::ncclConfig_t {
    // NCCL_CONFIG_UNDEF_INT: "let NCCL choose".
    const UNDEF: c_int = c_int::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // NCCL_VERSION(2, 28, 0): the layout of this struct (cudarc's nccl-02028).
        version: 22800,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    }
}

/// A device memory range, borrowed for one NCCL call; created from a cudarc slice, so it
/// is always a live allocation. Dropping it records the access on the stream (cudarc's
/// event tracking), which orders later users of the slice after the NCCL call.
pub(crate) struct DeviceRegion<'a> {
    ptr: u64,
    bytes: usize,
    _sync: SyncOnDrop<'a>,
}

impl<'a> DeviceRegion<'a> {
    /// A region NCCL will only read.
    pub(crate) fn reading<T, S: DevicePtr<T>>(slice: &'a S, stream: &'a CudaStream) -> Self {
        let bytes = slice.num_bytes();
        let (ptr, sync) = slice.device_ptr(stream);
        DeviceRegion {
            ptr,
            bytes,
            _sync: sync,
        }
    }

    /// A region NCCL may write.
    pub(crate) fn writing<T, S: DevicePtrMut<T>>(slice: &'a mut S, stream: &'a CudaStream) -> Self {
        let bytes = slice.num_bytes();
        let (ptr, sync) = slice.device_ptr_mut(stream);
        DeviceRegion {
            ptr,
            bytes,
            _sync: sync,
        }
    }

    /// The pointer, once `count` elements of `dtype` are known to fit.
    fn fitting(&self, count: usize, dtype: DType) -> Result<u64, NcclCode> {
        self.fitting_at(0, count, dtype)
    }

    /// The pointer to element `at`, once elements `at..at + count` are known to fit.
    fn fitting_at(&self, at: usize, count: usize, dtype: DType) -> Result<u64, NcclCode> {
        let size = dtype.size();
        match (at.checked_add(count), at.checked_mul(size)) {
            (Some(end), Some(offset)) if end.checked_mul(size).is_some_and(|e| e <= self.bytes) => {
                Ok(self.ptr + offset as u64)
            }
            _ => Err(NcclCode::INVALID_ARGUMENT),
        }
    }
}

/// One NCCL call on device regions. Counts are in elements.
pub(crate) enum Call<'r, 'a> {
    /// In-place all-reduce of `count` elements.
    AllReduce {
        buf: &'r DeviceRegion<'a>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    },
    /// In-place broadcast from `root`.
    Broadcast {
        buf: &'r DeviceRegion<'a>,
        count: usize,
        dtype: DType,
        root: usize,
    },
    /// In-place reduce into `root`.
    Reduce {
        buf: &'r DeviceRegion<'a>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    },
    /// `count` elements from every rank, concatenated into `output`.
    AllGather {
        input: &'r DeviceRegion<'a>,
        output: &'r DeviceRegion<'a>,
        count: usize,
        dtype: DType,
    },
    /// `output` (`count` elements) receives the reduction of block `rank` of `input`.
    ReduceScatter {
        input: &'r DeviceRegion<'a>,
        output: &'r DeviceRegion<'a>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    },
    /// Point-to-point send of `count` elements starting at element `at` (inside a
    /// group, or alone).
    Send {
        buf: &'r DeviceRegion<'a>,
        at: usize,
        count: usize,
        dtype: DType,
        peer: usize,
    },
    /// Point-to-point receive into `count` elements starting at element `at`.
    Recv {
        buf: &'r DeviceRegion<'a>,
        at: usize,
        count: usize,
        dtype: DType,
        peer: usize,
    },
}

fn nccl_dtype(dtype: DType) -> Result<sys::ncclDataType_t, NcclCode> {
    use sys::ncclDataType_t as N;
    Ok(match dtype {
        DType::U8 => N::ncclUint8,
        DType::I8 => N::ncclInt8,
        DType::I32 => N::ncclInt32,
        DType::I64 => N::ncclInt64,
        DType::F16 => N::ncclFloat16,
        DType::BF16 => N::ncclBfloat16,
        DType::F32 => N::ncclFloat32,
        DType::F64 => N::ncclFloat64,
        _ => return Err(NcclCode::INVALID_ARGUMENT),
    })
}

fn nccl_op(op: ReduceOp) -> Result<sys::ncclRedOp_t, NcclCode> {
    use sys::ncclRedOp_t as N;
    Ok(match op {
        ReduceOp::Sum => N::ncclSum,
        ReduceOp::Product => N::ncclProd,
        ReduceOp::Min => N::ncclMin,
        ReduceOp::Max => N::ncclMax,
        ReduceOp::Avg => N::ncclAvg,
        _ => return Err(NcclCode::INVALID_ARGUMENT),
    })
}

/// Starts a group of calls that NCCL launches together at [`group_end`].
pub(crate) fn group_start() -> Result<Progress, NcclCode> {
    // SAFETY: no arguments; only changes this thread's NCCL grouping state.
    check(unsafe { sys::ncclGroupStart() })
}

/// Launches the calls made since [`group_start`].
pub(crate) fn group_end() -> Result<Progress, NcclCode> {
    // SAFETY: no arguments; the grouped calls' regions are borrowed by the caller.
    check(unsafe { sys::ncclGroupEnd() })
}

/// The longest [`RawComm::abort`] waits for `ncclCommAbort`.
pub(crate) const ABORT_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An NCCL communicator handle. Not `Sync`: the owner serialises every call on it. On
/// drop it is aborted (never a panic); [`RawComm::finalize_and_destroy`] is the orderly
/// way out.
pub(crate) struct RawComm {
    handle: sys::ncclComm_t,
    world_size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, provided calls on it do not
// overlap; `RawComm` is not `Sync` and its methods take `&self`/`self` from one owner.
unsafe impl Send for RawComm {}

impl RawComm {
    /// Starts joining a non-blocking communicator of `world_size` ranks as `rank`, on the
    /// CUDA device current on this thread. It may not be ready yet: poll
    /// [`RawComm::async_status`] until it is `Done`.
    pub(crate) fn start_init(
        world_size: usize,
        rank: usize,
        id: &[u8; UNIQUE_ID_LEN],
    ) -> Result<RawComm, NcclCode> {
        let (Ok(world), Ok(me)) = (c_int::try_from(world_size), c_int::try_from(rank)) else {
            return Err(NcclCode::INVALID_ARGUMENT);
        };
        let mut config = non_blocking_config();
        let mut handle: sys::ncclComm_t = ptr::null_mut();
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as c_char),
        };
        // SAFETY: `handle` and `config` are valid for writes and reads for the duration
        // of the call; the id is passed by value. NCCL keeps no pointer to `config`.
        let result =
            unsafe { sys::ncclCommInitRankConfig(&mut handle, world, id, me, &mut config) };
        let comm = (!handle.is_null()).then_some(RawComm { handle, world_size });
        match (check(result), comm) {
            (Ok(_), Some(comm)) => Ok(comm),
            (Ok(_), None) => Err(NcclCode(sys::ncclResult_t::ncclInternalError)),
            // Dropping `comm` (if NCCL made one) aborts it.
            (Err(code), _) => Err(code),
        }
    }

    /// `Done` when the communicator has no call in progress, `Pending` while one is still
    /// being processed, or the error that broke it.
    pub(crate) fn async_status(&self) -> Result<Progress, NcclCode> {
        let mut status = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `handle` is a live communicator (only `abort`/`destroy` end it, and
        // they consume `self`); `status` is writable.
        check(unsafe { sys::ncclCommGetAsyncError(self.handle, &mut status) })?;
        check(status)
    }

    /// NCCL's last error message for this communicator ("" if none).
    pub(crate) fn last_error(&self) -> String {
        // SAFETY: `handle` is live; the returned string is owned by NCCL and copied at once.
        unsafe { text_of(sys::ncclGetLastError(self.handle)) }
    }

    /// Enqueues `call` on `stream` (which must belong to this communicator's device).
    pub(crate) fn enqueue(
        &self,
        call: &Call<'_, '_>,
        stream: &CudaStream,
    ) -> Result<Progress, NcclCode> {
        let s = stream.cu_stream() as sys::cudaStream_t;
        let comm = self.handle;
        let peer_of = |p: usize| c_int::try_from(p).map_err(|_| NcclCode::INVALID_ARGUMENT);
        let result = match *call {
            Call::AllReduce {
                buf,
                count,
                dtype,
                op,
            } => {
                let p = buf.fitting(count, dtype)? as *mut c_void;
                // SAFETY: `p` is a live device allocation of at least `count` elements
                // (checked by `fitting`), borrowed until the region is dropped, which
                // records the access on `stream`; in-place is allowed by NCCL.
                unsafe {
                    sys::ncclAllReduce(p, p, count, nccl_dtype(dtype)?, nccl_op(op)?, comm, s)
                }
            }
            Call::Broadcast {
                buf,
                count,
                dtype,
                root,
            } => {
                let p = buf.fitting(count, dtype)? as *mut c_void;
                // SAFETY: as for AllReduce.
                unsafe {
                    sys::ncclBroadcast(p, p, count, nccl_dtype(dtype)?, peer_of(root)?, comm, s)
                }
            }
            Call::Reduce {
                buf,
                count,
                dtype,
                op,
                root,
            } => {
                let p = buf.fitting(count, dtype)? as *mut c_void;
                // SAFETY: as for AllReduce.
                unsafe {
                    sys::ncclReduce(
                        p,
                        p,
                        count,
                        nccl_dtype(dtype)?,
                        nccl_op(op)?,
                        peer_of(root)?,
                        comm,
                        s,
                    )
                }
            }
            Call::AllGather {
                input,
                output,
                count,
                dtype,
            } => {
                let src = input.fitting(count, dtype)? as *const c_void;
                let dst = output.fitting(
                    count
                        .checked_mul(self.world_size)
                        .ok_or(NcclCode::INVALID_ARGUMENT)?,
                    dtype,
                )? as *mut c_void;
                // SAFETY: both are live allocations of the sizes NCCL will touch (checked
                // above), borrowed until the regions are dropped.
                unsafe { sys::ncclAllGather(src, dst, count, nccl_dtype(dtype)?, comm, s) }
            }
            Call::ReduceScatter {
                input,
                output,
                count,
                dtype,
                op,
            } => {
                let src = input.fitting(
                    count
                        .checked_mul(self.world_size)
                        .ok_or(NcclCode::INVALID_ARGUMENT)?,
                    dtype,
                )? as *const c_void;
                let dst = output.fitting(count, dtype)? as *mut c_void;
                // SAFETY: as for AllGather.
                unsafe {
                    sys::ncclReduceScatter(
                        src,
                        dst,
                        count,
                        nccl_dtype(dtype)?,
                        nccl_op(op)?,
                        comm,
                        s,
                    )
                }
            }
            Call::Send {
                buf,
                at,
                count,
                dtype,
                peer,
            } => {
                let p = buf.fitting_at(at, count, dtype)? as *const c_void;
                // SAFETY: as for AllReduce.
                unsafe { sys::ncclSend(p, count, nccl_dtype(dtype)?, peer_of(peer)?, comm, s) }
            }
            Call::Recv {
                buf,
                at,
                count,
                dtype,
                peer,
            } => {
                let p = buf.fitting_at(at, count, dtype)? as *mut c_void;
                // SAFETY: as for AllReduce.
                unsafe { sys::ncclRecv(p, count, nccl_dtype(dtype)?, peer_of(peer)?, comm, s) }
            }
        };
        check(result)
    }

    /// Starts flushing the communicator's outstanding work; poll [`RawComm::async_status`]
    /// until `Done`, then call [`RawComm::destroy`].
    pub(crate) fn start_finalize(&self) -> Result<Progress, NcclCode> {
        // SAFETY: `handle` is live.
        check(unsafe { sys::ncclCommFinalize(self.handle) })
    }

    /// Frees a finalized communicator.
    pub(crate) fn destroy(mut self) -> Result<(), NcclCode> {
        let handle = std::mem::replace(&mut self.handle, ptr::null_mut());
        // SAFETY: `handle` is live and, being taken out of `self`, is never used again.
        check(unsafe { sys::ncclCommDestroy(handle) }).map(drop)
    }

    /// Stops every operation of the communicator, wherever it is, and frees it. The way
    /// out after a deadline or a peer failure.
    ///
    /// `ncclCommAbort` can itself block (on a wedged GPU or a network NCCL still waits
    /// on), so it runs on a helper thread and this returns after at most [`ABORT_LIMIT`];
    /// a call still running then is left to finish on its own, with a warning.
    pub(crate) fn abort(self) {
        let world_size = self.world_size;
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("ringccl-nccl-abort".into())
            .spawn(move || {
                let mut comm = self;
                comm.abort_in_place();
                let _ = done.send(());
            });
        match spawned {
            Ok(_) => {
                if finished.recv_timeout(ABORT_LIMIT).is_err() {
                    tracing::warn!(
                        world_size,
                        limit = ?ABORT_LIMIT,
                        "ncclCommAbort did not return in time; leaving it to finish on a helper thread"
                    );
                }
            }
            Err(e) => {
                // No thread to spare: the communicator moved into the failed closure and
                // was dropped there, which aborts it on this thread.
                tracing::warn!(error = %e, "could not start a thread for ncclCommAbort");
            }
        }
    }

    fn abort_in_place(&mut self) {
        let handle = std::mem::replace(&mut self.handle, ptr::null_mut());
        if !handle.is_null() {
            // SAFETY: `handle` is live and, being taken out of `self`, is never used
            // again. Errors are ignored: there is nothing left to do with the handle.
            let _ = unsafe { sys::ncclCommAbort(handle) };
        }
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        self.abort_in_place();
    }
}
