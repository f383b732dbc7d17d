//! DDP on gradients in GPU memory: [`DeviceSpace`], where buckets are `CudaSlice<T>` on
//! the device, filled by kernels on the trainer's stream and reduced by the group while
//! backward goes on; [`DeviceDdp`] is [`Ddp`] over it.
//!
//! The rules are host DDP's, from the same [`Ddp`]: torch's bucket caps and order,
//! division by the world size before the all-reduce, `no_sync`, unused parameters, the
//! one-time rebuild, and the fp16/bf16 compression hooks (narrowed and widened on the
//! device). Under `"nccl"` a bucket goes to NCCL as it is, on NCCL's stream, ordered
//! after the trainer's stream by an event, and the trainer's stream is ordered after
//! NCCL's at the end of the step: the host never waits for the GPU, and the group's
//! worker watches each call against its deadline. Under `"gloo"` a bucket is staged
//! through host memory, so one trainer runs on either backend. The group's side of this
//! is [`DeviceCommunicator`], which `ringccl::ProcessGroup` implements.

mod kernels;

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, DeviceSlice,
    ValidAsZeroBits,
};
use ringccl_collectives::half::{bf16, f16};
use ringccl_collectives::{DType, Error};

use crate::communicator::{then, Communicator, Pending};
use crate::config::{DdpConfig, ParamSpec};
use crate::ddp::{check_dtypes, specs, Ddp, NoSync};
use crate::element::GradElement;
use crate::hooks::{AllReduceHook, Bf16CompressHook, Fp16CompressHook};
use crate::space::CommHook;
use crate::space::GradSpace;
use crate::DdpError;
use kernels::{KernelError, Kernels};

/// Data-parallel gradient averaging on GPU memory, PyTorch DDP's way: [`Ddp`] with its
/// buckets on the device, the same methods as
/// [`DistributedDataParallel`](crate::DistributedDataParallel) with device buffers for
/// gradients and views.
///
/// Each step: as backward produces each gradient (a device buffer), hand it over with
/// [`mark_grad_ready`](Ddp::mark_grad_ready) (copied into its bucket on the trainer's
/// stream, divided by the world size), or write it straight into its bucket through
/// [`grad_view_mut`](Ddp::grad_view_mut) with [`DdpConfig::gradient_as_bucket_view`]; a
/// full bucket starts reducing at once, in bucket order, while backward goes on.
/// [`finish`](Ddp::finish) orders the trainer's stream after the buckets (under `"nccl"`
/// without waiting for the GPU on the host, except where torch waits too: the first
/// step's one-time rebuild at a world size above one, and every synchronised step under
/// `find_unused_parameters`, whose used-parameter sum is a host call);
/// [`grad`](Ddp::grad) then views each averaged gradient, and
/// [`synchronize`](Ddp::synchronize) waits for them on the host when the host needs
/// them. No gradient passes through host memory under `"nccl"`.
///
/// Errors are [`DdpError`]s, with host DDP's rules; a failed CUDA call
/// ([`DdpError::Device`]) poisons the instance.
///
/// ```no_run
/// use ringccl::cudarc::driver::CudaContext;
/// use ringccl::ddp::DdpConfig;
/// use ringccl::DeviceDdp;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pg = ringccl::init_process_group("nccl", ringccl::InitOptions::from_env()?)?;
/// let device = pg.cuda_device().unwrap_or(0);
/// let stream = CudaContext::new(device)?.new_stream()?;
/// let mut ddp = DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 1024), ("b", 16)], DdpConfig::default())?;
/// let (gw, gb) = (stream.alloc_zeros::<f32>(1024)?, stream.alloc_zeros::<f32>(16)?);
/// ddp.mark_grad_ready(1, &gb.slice(..))?; // backward: last layer first
/// ddp.mark_grad_ready(0, &gw.slice(..))?;
/// ddp.finish()?;
/// let averaged = ddp.grad(0)?; // a view of the bucket, on the device
/// let on_host = stream.clone_dtoh(&averaged)?;
/// # let _ = on_host;
/// # Ok(())
/// # }
/// ```
pub type DeviceDdp<T> = Ddp<T, DeviceSpace>;

/// Synchronisation is off while this lives (see [`Ddp::no_sync`]); it derefs to the DDP.
pub type DeviceNoSync<'d, T> = NoSync<'d, T, DeviceSpace>;

/// Gradient element types device DDP handles: `f32`, `f64`, `f16` and `bf16`, with the
/// host DDP's arithmetic (`f16`/`bf16` computed in f32 and rounded back after each
/// operation).
pub trait DeviceGrad: GradElement + DeviceRepr + ValidAsZeroBits {
    /// The suffix of the type's kernels in their C source.
    const C_TYPE: &'static str;
    /// The type the kernels divide in.
    type Divisor: DeviceRepr + Copy;
    /// `n` as the divisor of the average.
    fn divisor(n: usize) -> Self::Divisor;
    /// Wraps a typed device buffer for the type-erased [`DeviceCommunicator`].
    fn wrap_device(buf: CudaSlice<Self>) -> DeviceBuf;
    /// Unwraps it again; `Err` hands back a buffer of another type.
    fn unwrap_device(buf: DeviceBuf) -> Result<CudaSlice<Self>, DeviceBuf>;
    /// Wraps a borrowed device buffer.
    fn wrap_device_mut(buf: &mut CudaSlice<Self>) -> DeviceBufMut<'_>;
}

macro_rules! device_grad {
    ($ty:ty, $c:literal, $divisor:ty, $variant:ident) => {
        impl DeviceGrad for $ty {
            const C_TYPE: &'static str = $c;
            type Divisor = $divisor;
            fn divisor(n: usize) -> $divisor {
                n as $divisor
            }
            fn wrap_device(buf: CudaSlice<Self>) -> DeviceBuf {
                DeviceBuf::$variant(buf)
            }
            fn unwrap_device(buf: DeviceBuf) -> Result<CudaSlice<Self>, DeviceBuf> {
                match buf {
                    DeviceBuf::$variant(buf) => Ok(buf),
                    other => Err(other),
                }
            }
            fn wrap_device_mut(buf: &mut CudaSlice<Self>) -> DeviceBufMut<'_> {
                DeviceBufMut::$variant(buf)
            }
        }
    };
}

device_grad!(f32, "float", f32, F32);
device_grad!(f64, "double", f64, F64);
device_grad!(f16, "f16", f32, F16);
device_grad!(bf16, "bf16", f32, BF16);

/// A device buffer of one of the gradient types, moved into an all-reduce.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceBuf {
    /// `f32` values.
    F32(CudaSlice<f32>),
    /// `f64` values.
    F64(CudaSlice<f64>),
    /// `f16` values.
    F16(CudaSlice<f16>),
    /// `bf16` values.
    BF16(CudaSlice<bf16>),
}

impl DeviceBuf {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceBuf::F32(_) => DType::F32,
            DeviceBuf::F64(_) => DType::F64,
            DeviceBuf::F16(_) => DType::F16,
            DeviceBuf::BF16(_) => DType::BF16,
        }
    }
}

/// A borrowed device buffer of one of the gradient types (a parameter to broadcast).
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceBufMut<'a> {
    /// `f32` values.
    F32(&'a mut CudaSlice<f32>),
    /// `f64` values.
    F64(&'a mut CudaSlice<f64>),
    /// `f16` values.
    F16(&'a mut CudaSlice<f16>),
    /// `bf16` values.
    BF16(&'a mut CudaSlice<bf16>),
}

/// The device collectives device DDP needs from a group, beyond [`Communicator`];
/// `ringccl::ProcessGroup` implements it under either backend (`"nccl"` on the GPU,
/// `"gloo"` staged through host memory).
pub trait DeviceCommunicator: Communicator {
    /// The stream the group runs its device calls on, when it runs them on the GPU
    /// (NCCL's); `None` when it stages them through host memory.
    fn device_stream(&self) -> Option<Arc<CudaStream>>;

    /// Starts summing `buf` across ranks, in issue order with the group's other calls,
    /// after `after` (an event on the stream that produced `buf`). Under `"nccl"` the
    /// result is ready once NCCL has the call on its stream (work on a stream that waits
    /// on [`device_stream`](Self::device_stream) is ordered after it) and the group
    /// watches it against its deadline; when staged, the copies run on `staging` (a
    /// stream kept by the caller) after the event, and the result is the finished sum.
    fn all_reduce_device_sum(
        &self,
        buf: DeviceBuf,
        after: CudaEvent,
        staging: Option<Arc<CudaStream>>,
    ) -> Result<Pending<DeviceBuf>, Error>;

    /// Copies rank `root`'s `buf` to every rank.
    fn broadcast_device_buf(&self, buf: DeviceBufMut<'_>, root: usize) -> Result<(), Error>;

    /// Waits on the host until every device call handed to the GPU without waiting has
    /// finished, each within its deadline; one that failed is the error.
    fn synchronize_device(&self) -> Result<(), Error>;
}

/// A bucket in GPU memory: the gradients, and the compression hooks' 16-bit copies,
/// kept from one step to the next.
#[derive(Debug)]
pub struct DeviceBucket<T: DeviceRepr> {
    data: CudaSlice<T>,
    spare_f16: Option<CudaSlice<f16>>,
    spare_bf16: Option<CudaSlice<bf16>>,
}

impl<T: DeviceRepr> DeviceBucket<T> {
    /// The gradients, one parameter after the other.
    pub fn data(&self) -> &CudaSlice<T> {
        &self.data
    }

    /// The gradients, writable (a hook reduces them in place).
    pub fn data_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.data
    }
}

/// GPU memory for DDP's buckets, on the trainer's stream: what [`DeviceDdp`] keeps its
/// buckets in, and what a [`CommHook`] over it is handed with each bucket.
pub struct DeviceSpace {
    comm: Arc<dyn DeviceCommunicator>,
    rank: usize,
    /// The trainer's stream: gradients are written and read there.
    stream: Arc<CudaStream>,
    /// The group's device stream (NCCL's), which the trainer's stream joins after the
    /// buckets' reductions; `None` under `"gloo"`.
    group_stream: Option<Arc<CudaStream>>,
    /// Under `"gloo"`: the stream the buckets' staging copies run on (one for the DDP's
    /// life: making a stream per bucket could synchronize the whole context).
    staging: Option<Arc<CudaStream>>,
    kernels: Arc<Kernels>,
}

impl fmt::Debug for DeviceSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSpace")
            .field("device", &self.stream.context().ordinal())
            .field("staged", &self.staging.is_some())
            .finish_non_exhaustive()
    }
}

/// The error of a failed CUDA step of device DDP on `rank`.
fn device_error(rank: usize, what: &str) -> impl FnOnce(KernelError) -> DdpError + '_ {
    move |e| DdpError::Device {
        rank,
        what: what.to_string(),
        call: match e {
            KernelError::NoNvrtc => "loading libnvrtc".into(),
            KernelError::Compile(_) => "nvrtcCompileProgram".into(),
            KernelError::Driver(_) => "a CUDA driver call".into(),
        },
        reason: e.to_string(),
    }
}

impl DeviceSpace {
    /// The space on `stream`'s device, after checking that it is the group's (under
    /// `"nccl"`), with its kernels compiled (NVRTC).
    fn new(comm: Arc<dyn DeviceCommunicator>, stream: &Arc<CudaStream>) -> Result<Self, DdpError> {
        let rank = comm.rank();
        let group_stream = comm.device_stream();
        let mine = stream.context().ordinal();
        if let Some(group) = &group_stream {
            let device = group.context().ordinal();
            if device != mine {
                return Err(DdpError::InvalidArgument(format!(
                    "rank {rank}: DeviceDdp's stream is on cuda:{mine} but the group's NCCL \
                     communicator is on cuda:{device}; create the stream on the group's \
                     device (ProcessGroup::cuda_device)"
                )));
            }
        }
        let kernels = Kernels::load(stream).map_err(device_error(rank, "compiling its kernels"))?;
        let staging = match group_stream {
            Some(_) => None,
            None => Some(stream.context().new_stream().map_err(|e| {
                device_error(rank, "creating the staging stream")(KernelError::from(e))
            })?),
        };
        Ok(DeviceSpace {
            comm,
            rank,
            stream: Arc::clone(stream),
            group_stream,
            staging,
            kernels: Arc::new(kernels),
        })
    }

    /// The trainer's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Starts summing `buf` across ranks, ordered after everything already queued on the
    /// trainer's stream (the bucket's gradients): under `"nccl"` NCCL's stream waits on
    /// that event just before the call; under `"gloo"` the staging stream does, so that
    /// the group waits for the bucket and not for the rest of backward queued since.
    pub fn all_reduce<N: DeviceGrad>(
        &self,
        buf: CudaSlice<N>,
    ) -> Result<Pending<CudaSlice<N>>, Error> {
        let after = self.stream.record_event(None).map_err(|e| {
            device_error(self.rank, "recording the bucket's event")(e.into()).into_runtime()
        })?;
        let pending =
            self.comm
                .all_reduce_device_sum(N::wrap_device(buf), after, self.staging.clone())?;
        Ok(then(pending, |buf| {
            N::unwrap_device(buf).map_err(|other| {
                Error::InvalidArgument(format!(
                    "the device all-reduce returned {} values, expected {}",
                    other.dtype(),
                    N::DTYPE
                ))
            })
        }))
    }

    /// The trainer's stream waits for the group's (the buckets' reductions).
    fn join_group(&self, rank: usize, stream: &CudaStream) -> Result<(), DdpError> {
        match &self.group_stream {
            Some(group) => stream.join(group).map_err(|e| {
                device_error(rank, "ordering the trainer's stream after the buckets")(e.into())
            }),
            None => Ok(()),
        }
    }
}

impl<T: DeviceGrad> GradSpace<T> for DeviceSpace {
    type Bucket = DeviceBucket<T>;
    type Grad<'g> = CudaView<'g, T>;
    type View<'b> = CudaView<'b, T>;
    type ViewMut<'b> = CudaViewMut<'b, T>;
    type Param = CudaSlice<T>;
    type Comm<'c> = DeviceSpace;

    fn alloc(&self, len: usize) -> Result<DeviceBucket<T>, DdpError> {
        let data = self.stream.alloc_zeros::<T>(len.max(1));
        let data = data.map_err(|e| device_error(self.rank, "allocating a bucket")(e.into()))?;
        Ok(DeviceBucket {
            data,
            spare_f16: None,
            spare_bf16: None,
        })
    }

    fn holds(bucket: &DeviceBucket<T>, len: usize) -> bool {
        bucket.data.len() == len.max(1)
    }

    fn grad_len(grad: &CudaView<'_, T>) -> usize {
        grad.len()
    }

    fn param_len(param: &CudaSlice<T>) -> usize {
        param.len()
    }

    fn check_grad(&self, index: usize, grad: &CudaView<'_, T>) -> Result<(), DdpError> {
        let mine = self.stream.context().ordinal();
        let theirs = grad.stream().context().ordinal();
        if mine == theirs {
            return Ok(());
        }
        Err(DdpError::InvalidArgument(format!(
            "rank {}: the gradient of parameter #{index} is on cuda:{theirs} but this \
             DeviceDdp's buckets are on cuda:{mine}; hand it over from cuda:{mine}",
            self.rank
        )))
    }

    fn store(
        &self,
        bucket: &mut DeviceBucket<T>,
        at: usize,
        grad: &CudaView<'_, T>,
        n: usize,
        accumulate: bool,
    ) -> Result<(), DdpError> {
        let mut slot = bucket.data.slice_mut(at..at + grad.len());
        let stored = self
            .kernels
            .store(&self.stream, &mut slot, grad, n, accumulate);
        stored.map_err(device_error(
            self.rank,
            "copying a gradient into its bucket",
        ))
    }

    fn divide(&self, bucket: &mut DeviceBucket<T>, n: usize) -> Result<(), DdpError> {
        let divided = self
            .kernels
            .divide(&self.stream, &mut bucket.data.slice_mut(..), n);
        divided.map_err(device_error(
            self.rank,
            "dividing a bucket by the world size",
        ))
    }

    fn zero(&self, bucket: &mut DeviceBucket<T>, at: usize, len: usize) -> Result<(), DdpError> {
        let zeroed = self
            .stream
            .memset_zeros(&mut bucket.data.slice_mut(at..at + len));
        zeroed.map_err(|e| {
            device_error(self.rank, "zeroing an unused parameter's gradient")(e.into())
        })
    }

    fn copy(
        &self,
        src: &DeviceBucket<T>,
        src_at: usize,
        dst: &mut DeviceBucket<T>,
        dst_at: usize,
        len: usize,
    ) -> Result<(), DdpError> {
        let copied = self.stream.memcpy_dtod(
            &src.data.slice(src_at..src_at + len),
            &mut dst.data.slice_mut(dst_at..dst_at + len),
        );
        copied.map_err(|e| device_error(self.rank, "moving gradients to new buckets")(e.into()))
    }

    fn view(bucket: &DeviceBucket<T>, at: usize, len: usize) -> CudaView<'_, T> {
        bucket.data.slice(at..at + len)
    }

    fn view_mut(bucket: &mut DeviceBucket<T>, at: usize, len: usize) -> CudaViewMut<'_, T> {
        bucket.data.slice_mut(at..at + len)
    }

    fn start(
        &self,
        hook: &dyn CommHook<T, DeviceSpace>,
        _comm: &dyn Communicator,
        _label: crate::BucketLabel,
        bucket: DeviceBucket<T>,
    ) -> Result<Pending<DeviceBucket<T>>, Error> {
        hook.start(self, bucket)
    }

    fn landed(&self) -> Result<(), DdpError> {
        self.join_group(self.rank, &self.stream)
    }

    /// One broadcast per parameter (device buffers are not fused).
    fn broadcast(
        &self,
        _comm: &dyn Communicator,
        params: &mut [&mut CudaSlice<T>],
        _fuse_bytes: usize,
    ) -> Result<(), Error> {
        for p in params.iter_mut() {
            self.comm.broadcast_device_buf(T::wrap_device_mut(p), 0)?;
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), Error> {
        self.comm.synchronize_device()
    }
}

impl<T: DeviceGrad> CommHook<T, DeviceSpace> for AllReduceHook {
    fn start(
        &self,
        space: &DeviceSpace,
        bucket: DeviceBucket<T>,
    ) -> Result<Pending<DeviceBucket<T>>, Error> {
        let DeviceBucket {
            data,
            spare_f16,
            spare_bf16,
        } = bucket;
        let pending = space.all_reduce(data)?;
        Ok(then(pending, move |data| {
            Ok(DeviceBucket {
                data,
                spare_f16,
                spare_bf16,
            })
        }))
    }
}

/// The 16-bit types a compression hook reduces in, and where a bucket keeps its copy.
trait Narrow: DeviceGrad {
    fn spare<T: DeviceRepr>(bucket: &mut DeviceBucket<T>) -> &mut Option<CudaSlice<Self>>;
}

impl Narrow for f16 {
    fn spare<T: DeviceRepr>(bucket: &mut DeviceBucket<T>) -> &mut Option<CudaSlice<f16>> {
        &mut bucket.spare_f16
    }
}

impl Narrow for bf16 {
    fn spare<T: DeviceRepr>(bucket: &mut DeviceBucket<T>) -> &mut Option<CudaSlice<bf16>> {
        &mut bucket.spare_bf16
    }
}

/// The compression hooks on the device: the bucket's 16-bit copy (`N`, made on the
/// trainer's stream, in last step's copy when there is one) is all-reduced, then
/// widened back into the bucket on the trainer's stream, after the group's, and kept
/// for the next step (stream-ordered: the next narrowing runs after this).
fn start_narrowed<T: DeviceGrad, N: Narrow>(
    space: &DeviceSpace,
    mut bucket: DeviceBucket<T>,
) -> Result<Pending<DeviceBucket<T>>, Error> {
    let rank = space.rank;
    let bf16 = N::DTYPE == DType::BF16;
    let len = bucket.data.len();
    let narrow = match N::spare(&mut bucket).take() {
        Some(spare) if spare.len() == len => Ok(spare),
        // Zeroed once, on allocation; the kernel then writes every element.
        _ => space
            .stream
            .alloc_zeros::<N>(len)
            .map_err(KernelError::from),
    }
    .and_then(|mut narrow| {
        let narrowed = space
            .kernels
            .narrow(&space.stream, &mut narrow, &bucket.data, bf16);
        narrowed.map(|()| narrow)
    })
    .map_err(|e| {
        device_error(rank, "narrowing a bucket for the compression hook")(e).into_runtime()
    })?;
    let pending = space.all_reduce(narrow)?;
    let (stream, kernels) = (Arc::clone(&space.stream), Arc::clone(&space.kernels));
    let group = space.group_stream.clone();
    Ok(then(pending, move |narrow: CudaSlice<N>| {
        let widened = match &group {
            Some(group) => stream.join(group).map_err(KernelError::from),
            None => Ok(()),
        }
        .and_then(|()| kernels.widen(&stream, &mut bucket.data, &narrow, bf16));
        widened
            .map_err(|e| device_error(rank, "widening a compressed bucket")(e).into_runtime())?;
        *N::spare(&mut bucket) = Some(narrow);
        Ok(bucket)
    }))
}

impl<T: DeviceGrad> CommHook<T, DeviceSpace> for Fp16CompressHook {
    fn start(
        &self,
        space: &DeviceSpace,
        bucket: DeviceBucket<T>,
    ) -> Result<Pending<DeviceBucket<T>>, Error> {
        start_narrowed::<T, f16>(space, bucket)
    }
}

impl<T: DeviceGrad> CommHook<T, DeviceSpace> for Bf16CompressHook {
    fn start(
        &self,
        space: &DeviceSpace,
        bucket: DeviceBucket<T>,
    ) -> Result<Pending<DeviceBucket<T>>, Error> {
        start_narrowed::<T, bf16>(space, bucket)
    }
}

/// The built-in hooks by name, for trainers that choose one at run time; it works over
/// host buckets too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceCommHook {
    /// One all-reduce (sum) of the bucket in its own type ([`AllReduceHook`], torch's
    /// default).
    #[default]
    AllReduce,
    /// Rounded to f16, all-reduced in f16, widened back ([`Fp16CompressHook`], torch's
    /// `fp16_compress_hook`): half the bytes.
    Fp16Compress,
    /// The same with bf16 ([`Bf16CompressHook`], torch's `bf16_compress_hook`).
    Bf16Compress,
}

impl<T: GradElement, S: GradSpace<T>> CommHook<T, S> for DeviceCommHook
where
    AllReduceHook: CommHook<T, S>,
    Fp16CompressHook: CommHook<T, S>,
    Bf16CompressHook: CommHook<T, S>,
{
    fn start(&self, comm: &S::Comm<'_>, bucket: S::Bucket) -> Result<Pending<S::Bucket>, Error> {
        match self {
            DeviceCommHook::AllReduce => AllReduceHook.start(comm, bucket),
            DeviceCommHook::Fp16Compress => Fp16CompressHook.start(comm, bucket),
            DeviceCommHook::Bf16Compress => Bf16CompressHook.start(comm, bucket),
        }
    }
}

impl<T: DeviceGrad> Ddp<T, DeviceSpace> {
    /// Registers `params` (in model order) for gradients on `stream`'s device (under
    /// `"nccl"`, the group's device) and checks, collectively, that every rank
    /// registered the same ones and the same settings. Compiles the few element-wise
    /// kernels it needs (NVRTC) and allocates its buckets first, so that a rank that
    /// cannot fails before the collective checks.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let stream = CudaContext::new(0)?.new_stream()?;
    /// let specs = [ParamSpec::new("w", 8, ringccl::DType::F32)];
    /// let ddp = ringccl::DeviceDdp::<f32>::new(&pg, &stream, &specs, DdpConfig::default())?;
    /// assert_eq!(ddp.bucket_layout(), vec![vec![0]]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn new<C: DeviceCommunicator + Clone + 'static>(
        comm: &C,
        stream: &Arc<CudaStream>,
        params: &[ParamSpec],
        config: DdpConfig,
    ) -> Result<Self, DdpError> {
        check_dtypes::<T>(comm.rank(), params)?;
        let space = DeviceSpace::new(Arc::new(comm.clone()), stream)?;
        Ddp::build(
            Arc::new(comm.clone()),
            space,
            params,
            config,
            Box::new(AllReduceHook),
        )
    }

    /// [`new`](Self::new) with the parameters given as `(name, number of elements)`.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # use ringccl::ddp::DdpConfig;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 8), ("b", 2)], DdpConfig::default())?;
    /// assert_eq!(ddp.params().len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_params<C: DeviceCommunicator + Clone + 'static, N: Into<String>>(
        comm: &C,
        stream: &Arc<CudaStream>,
        params: impl IntoIterator<Item = (N, usize)>,
        config: DdpConfig,
    ) -> Result<Self, DdpError> {
        Self::new(comm, stream, &specs::<T, N>(params), config)
    }
}
