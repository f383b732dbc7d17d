//! DDP on gradients in GPU memory: buckets are `CudaSlice<T>` on the device, filled by
//! kernels on the trainer's stream and reduced by the group while backward goes on.
//!
//! The rules are the host DDP's, from the same [`Reducer`]: torch's bucket caps and
//! order, division by the world size before the all-reduce, `no_sync`, unused
//! parameters, the one-time rebuild, and the fp16/bf16 compression hooks (narrowed and
//! widened on the device). Under `"nccl"` a bucket goes to NCCL as it is, on NCCL's
//! stream, ordered after the trainer's stream by an event, and the trainer's stream is
//! ordered after NCCL's at the end of the step: the host never waits for the GPU, and
//! the group's worker watches each call against its deadline. Under `"gloo"` a bucket
//! is staged through host memory, so one trainer runs on either backend.

mod kernels;

/// A bucket's all-reduce is done, for this DDP, once NCCL has it on its stream: the
/// trainer's stream is ordered after NCCL's, and the group's worker watches the call
/// against its deadline, so `finish` never waits for the GPU on the host.
const STREAM_ORDERED: Completion = Completion::Enqueued;

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use ringccl_ddp::{
    check_same_config, check_same_params, DdpConfig, DdpError, FinishPlan, GradElement, OldLayout,
    ParamSpec, Reducer,
};
use ringccl_nccl::cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, DeviceSlice,
};
use ringccl_nccl::DeviceElement;

use crate::device::{After, Completion};
use crate::half::{bf16, f16};
use crate::{Error, ProcessGroup, ReduceOp, Work};
use kernels::{KernelError, Kernels};

/// Gradient element types device DDP handles: `f32`, `f64`, `f16` and `bf16`, with the
/// host DDP's arithmetic (`f16`/`bf16` computed in f32 and rounded back after each
/// operation).
pub trait DeviceGrad: GradElement + DeviceElement {
    /// The suffix of the type's kernels in their C source.
    const C_TYPE: &'static str;
    /// The type the kernels divide in.
    type Divisor: DeviceRepr + Copy;
    /// `n` as the divisor of the average.
    fn divisor(n: usize) -> Self::Divisor;
}

macro_rules! device_grad {
    ($ty:ty, $c:literal, $divisor:ty) => {
        impl DeviceGrad for $ty {
            const C_TYPE: &'static str = $c;
            type Divisor = $divisor;
            fn divisor(n: usize) -> $divisor {
                n as $divisor
            }
        }
    };
}

device_grad!(f32, "float", f32);
device_grad!(f64, "double", f64);
device_grad!(f16, "f16", f32);
device_grad!(bf16, "bf16", f32);

/// How a full device bucket is reduced (the device side of
/// [`ddp::CommHook`](crate::ddp::CommHook)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceCommHook {
    /// One all-reduce (sum) of the bucket in its own type (torch's default).
    #[default]
    AllReduce,
    /// Rounded to f16 on the device, all-reduced in f16, widened back (torch's
    /// `fp16_compress_hook`): half the bytes.
    Fp16Compress,
    /// The same with bf16 (torch's `bf16_compress_hook`).
    Bf16Compress,
}

/// A bucket's reduction in flight.
enum InFlight<T: DeviceGrad> {
    /// The bucket itself.
    Full(Work<CudaSlice<T>>),
    /// Its f16 copy (the bucket stays here, to be widened into).
    F16(Work<CudaSlice<f16>>),
    /// Its bf16 copy.
    Bf16(Work<CudaSlice<bf16>>),
}

struct DeviceBucket<T: DeviceGrad> {
    /// `None` while the bucket itself is being reduced.
    data: Option<CudaSlice<T>>,
    in_flight: Option<InFlight<T>>,
    /// The compression hooks' 16-bit copies, kept from one step to the next.
    spare_f16: Option<CudaSlice<f16>>,
    spare_bf16: Option<CudaSlice<bf16>>,
}

impl<T: DeviceGrad> DeviceBucket<T> {
    fn new(data: CudaSlice<T>) -> DeviceBucket<T> {
        DeviceBucket {
            data: Some(data),
            in_flight: None,
            spare_f16: None,
            spare_bf16: None,
        }
    }
}

/// The 16-bit types a compression hook reduces in, and where a bucket keeps its copy.
trait Narrow: DeviceElement {
    fn spare<T: DeviceGrad>(bucket: &mut DeviceBucket<T>) -> &mut Option<CudaSlice<Self>>;
}

impl Narrow for f16 {
    fn spare<T: DeviceGrad>(bucket: &mut DeviceBucket<T>) -> &mut Option<CudaSlice<f16>> {
        &mut bucket.spare_f16
    }
}

impl Narrow for bf16 {
    fn spare<T: DeviceGrad>(bucket: &mut DeviceBucket<T>) -> &mut Option<CudaSlice<bf16>> {
        &mut bucket.spare_bf16
    }
}

/// Data-parallel gradient averaging on GPU memory, PyTorch DDP's way; the device twin
/// of [`ddp::DistributedDataParallel`](crate::ddp::DistributedDataParallel).
///
/// Each step: as backward produces each gradient (a device buffer), hand it over with
/// [`mark_grad_ready`](Self::mark_grad_ready) (copied into its bucket on the trainer's
/// stream, divided by the world size), or write it straight into its bucket through
/// [`grad_view_mut`](Self::grad_view_mut) with
/// [`DdpConfig::gradient_as_bucket_view`]; a full bucket starts reducing at once, in
/// bucket order, while backward goes on. [`finish`](Self::finish) orders the trainer's
/// stream after the buckets (under `"nccl"` without waiting for the GPU on the host);
/// [`grad`](Self::grad) then views each averaged gradient, and
/// [`synchronize`](Self::synchronize) waits for them on the host when the host needs
/// them. No gradient passes through host memory under `"nccl"`.
///
/// Errors follow host DDP's rules ([`ddp::DdpError`](crate::ddp::DdpError) says which
/// error does what): one refused before anything changed (`Error::InvalidArgument`, or
/// `DdpError::InvalidArgument` inside [`Error::Ddp`]: an index out of range, a wrong
/// length or device, `grad` before `finish`) leaves the instance usable; an
/// inconsistent step (`GradReadyTwice`, `StepNotFinished`, `MissingGrads`), a failed
/// reduction and a failed CUDA call ([`Error::Device`]) poison it, and every later call
/// that returns a `Result` returns `DdpError::Broken`, naming the first error.
///
/// ```no_run
/// use ringccl::cudarc::driver::CudaContext;
/// use ringccl::ddp::DdpConfig;
/// use ringccl::DeviceDdp;
/// # fn main() -> Result<(), ringccl::Error> {
/// let pg = ringccl::init_process_group("nccl", ringccl::InitOptions::from_env()?)?;
/// let device = pg.cuda_device().unwrap_or(0);
/// let stream = CudaContext::new(device).and_then(|c| c.new_stream()).map_err(|e| ringccl::Error::InvalidArgument(e.to_string()))?;
/// let mut ddp = DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 1024), ("b", 16)], DdpConfig::default())?;
/// let (gw, gb) = (stream.alloc_zeros::<f32>(1024).unwrap(), stream.alloc_zeros::<f32>(16).unwrap());
/// ddp.mark_grad_ready(1, &gb.slice(..))?; // backward: last layer first
/// ddp.mark_grad_ready(0, &gw.slice(..))?;
/// ddp.finish()?;
/// let averaged = ddp.grad(0)?; // a view of the bucket, on the device
/// # let _ = averaged;
/// # Ok(())
/// # }
/// ```
pub struct DeviceDdp<T: DeviceGrad> {
    pg: ProcessGroup,
    reducer: Reducer,
    /// The trainer's stream: gradients are written and read there.
    stream: Arc<CudaStream>,
    kernels: Kernels,
    hook: DeviceCommHook,
    buckets: Vec<DeviceBucket<T>>,
    /// Under `"gloo"`: the stream the buckets' staging copies run on (one for the DDP's
    /// life: making a stream per bucket could synchronize the whole context).
    staging: Option<Arc<CudaStream>>,
}

impl<T: DeviceGrad> DeviceDdp<T> {
    /// Registers `params` (in model order) for gradients on `stream`'s device (under
    /// `"nccl"`, the group's device) and checks, collectively, that every rank
    /// registered the same ones. Compiles the few element-wise kernels it needs (NVRTC).
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
    pub fn new(
        pg: &ProcessGroup,
        stream: &Arc<CudaStream>,
        params: &[ParamSpec],
        config: DdpConfig,
    ) -> Result<DeviceDdp<T>, Error> {
        if let Some((i, p)) = params.iter().enumerate().find(|(_, p)| p.dtype != T::DTYPE) {
            return Err(Error::InvalidArgument(format!(
                "rank {}: parameter #{i} {:?} is {} but this DeviceDdp averages {} gradients; \
                 use one instance per gradient type",
                pg.rank(),
                p.name,
                p.dtype,
                T::DTYPE
            )));
        }
        if let Some(device) = pg.cuda_device() {
            if device != stream.context().ordinal() {
                return Err(Error::InvalidArgument(format!(
                    "rank {}: DeviceDdp's stream is on cuda:{} but the group's NCCL \
                     communicator is on cuda:{device}; create the stream on the group's \
                     device (ProcessGroup::cuda_device)",
                    pg.rank(),
                    stream.context().ordinal()
                )));
            }
        }
        // This rank's own set-up first: a rank that cannot compile the kernels or allocate
        // its buckets fails before the collective check, not after its peers passed it.
        let rank = pg.rank();
        let kernels = Kernels::load(stream).map_err(kernel_failed(rank, "DeviceDdp::new"))?;
        let staging = match pg.nccl_stream() {
            Some(_) => None,
            None => Some(stream.context().new_stream().map_err(|e| {
                kernel_failed(rank, "creating the staging stream")(KernelError::from(e))
            })?),
        };
        let mut ddp = DeviceDdp {
            pg: pg.clone(),
            reducer: Reducer::new(rank, params, config),
            stream: Arc::clone(stream),
            kernels,
            hook: DeviceCommHook::AllReduce,
            buckets: Vec::new(),
            staging,
        };
        ddp.buckets = ddp.allocate_layout(None)?;
        check_same_params(pg, params)?;
        check_same_config(pg, ddp.reducer.config())?;
        Ok(ddp)
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
    pub fn with_params<N: Into<String>>(
        pg: &ProcessGroup,
        stream: &Arc<CudaStream>,
        params: impl IntoIterator<Item = (N, usize)>,
        config: DdpConfig,
    ) -> Result<DeviceDdp<T>, Error> {
        let specs: Vec<ParamSpec> = params
            .into_iter()
            .map(|(name, numel)| ParamSpec::new(name, numel, T::DTYPE))
            .collect();
        DeviceDdp::new(pg, stream, &specs, config)
    }

    /// Replaces the communication hook (default [`DeviceCommHook::AllReduce`]). Every
    /// rank must use the same hook.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # use ringccl::ddp::DdpConfig;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 8)], DdpConfig::default())?;
    /// ddp.register_comm_hook(ringccl::DeviceCommHook::Bf16Compress);
    /// # Ok(())
    /// # }
    /// ```
    pub fn register_comm_hook(&mut self, hook: DeviceCommHook) {
        self.hook = hook;
    }

    /// The registered parameters.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let ddp = ringccl::DeviceDdp::<f64>::with_params(&pg, &stream, [("w", 8)], Default::default())?;
    /// assert_eq!(ddp.params()[0].numel, 8);
    /// # Ok(())
    /// # }
    /// ```
    pub fn params(&self) -> &[ParamSpec] {
        self.reducer.params()
    }

    /// The current buckets, as parameter indices, in launch order.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("a", 2), ("b", 1)], Default::default())?;
    /// assert_eq!(ddp.bucket_layout(), vec![vec![1, 0]]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn bucket_layout(&self) -> Vec<Vec<usize>> {
        self.reducer.bucket_layout()
    }

    /// Steps finished so far.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], Default::default())?;
    /// assert_eq!(ddp.steps(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn steps(&self) -> u64 {
        self.reducer.step()
    }

    /// Turns synchronisation off (gradient accumulation, torch's `no_sync`) or back on;
    /// see [`ddp::DistributedDataParallel::set_no_sync`](crate::ddp::DistributedDataParallel::set_no_sync).
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], Default::default())?;
    /// let g = stream.clone_htod(&[1.0f32, 2.0])?;
    /// ddp.set_no_sync(true);
    /// ddp.mark_grad_ready(0, &g.slice(..))?; // accumulated, not communicated
    /// ddp.set_no_sync(false);
    /// ddp.mark_grad_ready(0, &g.slice(..))?; // synchronised: the sum of both
    /// ddp.finish()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_no_sync(&mut self, off: bool) {
        self.reducer.set_no_sync(off);
    }

    /// Gradient accumulation, torch's `with ddp.no_sync():`: synchronisation is off until
    /// the returned guard is dropped, which also closes the pass (no `finish` needed).
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], Default::default())?;
    /// let g = stream.clone_htod(&[1.0f32, 2.0])?;
    /// ddp.no_sync().mark_grad_ready(0, &g.slice(..))?; // accumulated, not communicated
    /// ddp.mark_grad_ready(0, &g.slice(..))?; // synchronised: the sum of both
    /// ddp.finish()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn no_sync(&mut self) -> DeviceNoSync<'_, T> {
        self.reducer.set_no_sync(true);
        DeviceNoSync { ddp: self }
    }

    /// The reducer's [`check_usable`](Reducer::check_usable), as the facade's error.
    fn check_usable(&self) -> Result<(), Error> {
        Ok(self.reducer.check_usable()?)
    }

    /// Poisons the instance (the first error is the one every later call names).
    fn fail(&self, error: Error) -> Error {
        self.reducer.poison(&error);
        error
    }

    /// The reducer's [`refused_or_poisoned`](Reducer::refused_or_poisoned), as the
    /// facade's error.
    fn refused_or_failed(&self, error: DdpError) -> Error {
        self.reducer.refused_or_poisoned(error).into()
    }

    /// A failed CUDA call breaks the DDP (its buckets are in an unknown state).
    fn device_failed(&self, what: &str) -> impl FnOnce(KernelError) -> Error + '_ {
        let rank = self.pg.rank();
        let what = what.to_string();
        move |e| {
            let error = kernel_failed(rank, &what)(e);
            self.fail(error)
        }
    }

    /// Hands DDP the gradient of parameter `index` for this step, a device buffer on
    /// this DDP's device: it is copied into its bucket on the trainer's stream, divided
    /// by the world size (added to what `no_sync` passes accumulated). The copy is
    /// ordered after the work already on the stream; `grad` may be reused at once.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], Default::default())?;
    /// let g = stream.clone_htod(&[1.0f32, 2.0])?;
    /// ddp.mark_grad_ready(0, &g.slice(..))?;
    /// ddp.finish()?;
    /// assert_eq!(stream.clone_dtoh(&ddp.grad(0)?)?, [1.0, 2.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn mark_grad_ready(&mut self, index: usize, grad: &CudaView<'_, T>) -> Result<(), Error> {
        self.check_usable()?;
        let (mine, theirs) = (
            self.stream.context().ordinal(),
            grad.stream().context().ordinal(),
        );
        if mine != theirs {
            return Err(Error::InvalidArgument(format!(
                "rank {}: the gradient of parameter #{index} is on cuda:{theirs} but this \
                 DeviceDdp's buckets are on cuda:{mine}",
                self.pg.rank()
            )));
        }
        let checked = self.reducer.check_mark(index, Some(grad.len()));
        checked.map_err(|e| self.refused_or_failed(e))?;
        let n = if self.reducer.config().gradient_as_bucket_view_on() {
            1 // divided once per bucket, at launch
        } else {
            self.pg.world_size()
        };
        let accumulate = self.reducer.accumulates(index);
        let Some((b, at, _)) = self.reducer.slot(index) else {
            return Err(self.internal("a checked gradient has no slot"));
        };
        let stream = Arc::clone(&self.stream);
        let Some(data) = self.buckets.get_mut(b).and_then(|b| b.data.as_mut()) else {
            return Err(self.internal("bucket in flight while a gradient was written"));
        };
        let mut slot = data.slice_mut(at..at + grad.len());
        let stored = self.kernels.store(&stream, &mut slot, grad, n, accumulate);
        stored.map_err(self.device_failed("copying a gradient into its bucket"))?;
        self.mark(index)
    }

    /// With [`DdpConfig::gradient_as_bucket_view`]: the place in its bucket where the
    /// gradient of parameter `index` lives, for backward to write into (on this DDP's
    /// stream); then call [`mark_grad_ready_in_view`](Self::mark_grad_ready_in_view).
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # use ringccl::ddp::DdpConfig;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let config = DdpConfig::default().gradient_as_bucket_view(true);
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], config)?;
    /// stream.memcpy_htod(&[3.0f32, 4.0], &mut ddp.grad_view_mut(0)?)?; // backward writes here
    /// ddp.mark_grad_ready_in_view(0)?;
    /// ddp.finish()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn grad_view_mut(&mut self, index: usize) -> Result<CudaViewMut<'_, T>, Error> {
        self.check_usable()?;
        let rank = self.pg.rank();
        if !self.reducer.config().gradient_as_bucket_view_on() {
            return Err(Error::InvalidArgument(format!(
                "rank {rank}: grad_view_mut({index}) needs \
                 DdpConfig::gradient_as_bucket_view(true)"
            )));
        }
        let (b, at, numel) = self.place(index)?;
        match self.buckets.get_mut(b) {
            Some(DeviceBucket {
                data: Some(data),
                in_flight: None,
                ..
            }) => Ok(data.slice_mut(at..at + numel)),
            _ => Err(Error::InvalidArgument(format!(
                "rank {rank}: grad_view_mut({index}): parameter #{index}'s bucket is being \
                 all-reduced; its view is available again after finish()"
            ))),
        }
    }

    /// With [`DdpConfig::gradient_as_bucket_view`]: the gradient of parameter `index`
    /// has been written into its view (the writes are on this DDP's stream, or ordered
    /// before it).
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # use ringccl::ddp::DdpConfig;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// # let config = DdpConfig::default().gradient_as_bucket_view(true);
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], config)?;
    /// ddp.mark_grad_ready_in_view(0)?;
    /// ddp.finish()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn mark_grad_ready_in_view(&mut self, index: usize) -> Result<(), Error> {
        self.check_usable()?;
        if !self.reducer.config().gradient_as_bucket_view_on() {
            return Err(Error::InvalidArgument(
                "mark_grad_ready_in_view needs DdpConfig::gradient_as_bucket_view(true)".into(),
            ));
        }
        let checked = self.reducer.check_mark(index, None);
        checked.map_err(|e| self.refused_or_failed(e))?;
        self.mark(index)
    }

    /// Parameter `index`'s (bucket, offset, length), or the error naming it.
    fn place(&self, index: usize) -> Result<(usize, usize, usize), Error> {
        self.reducer.slot(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "rank {}: there is no parameter #{index} ({} parameters registered)",
                self.pg.rank(),
                self.reducer.params().len()
            ))
        })
    }

    fn mark(&mut self, index: usize) -> Result<(), Error> {
        let launch = match self.reducer.mark(index) {
            Ok(launch) => launch,
            Err(e) => return Err(self.internal_from(e)),
        };
        for b in launch {
            self.launch(b)?;
        }
        Ok(())
    }

    /// Starts bucket `b`'s reduction: the division (bucket-view mode), the hook's
    /// narrowing, and the all-reduce, ordered after the trainer's stream. On an error
    /// the DDP is broken (and says so from then on).
    fn launch(&mut self, b: usize) -> Result<(), Error> {
        let n = self.pg.world_size();
        let stream = Arc::clone(&self.stream);
        let Some(mut data) = self
            .buckets
            .get_mut(b)
            .and_then(|bucket| bucket.data.take())
        else {
            return Err(self.internal("a bucket was launched twice"));
        };
        if self.reducer.config().gradient_as_bucket_view_on() && n > 1 {
            let divided = self.kernels.divide(&stream, &mut data.slice_mut(..), n);
            divided.map_err(self.device_failed("dividing a bucket by the world size"))?;
        }
        let started = match self.hook {
            DeviceCommHook::AllReduce => self
                .trainer_event()
                .and_then(|after| {
                    self.pg.all_reduce_device_async_after(
                        data,
                        ReduceOp::Sum,
                        after,
                        STREAM_ORDERED,
                    )
                })
                .map(InFlight::Full),
            DeviceCommHook::Fp16Compress => self.start_narrowed::<f16>(b, data, InFlight::F16),
            DeviceCommHook::Bf16Compress => self.start_narrowed::<bf16>(b, data, InFlight::Bf16),
        };
        let in_flight = started.map_err(|e| self.fail(e))?;
        self.buckets[b].in_flight = Some(in_flight);
        Ok(())
    }

    /// The compression hooks' start: bucket `b`'s `data` stays in place, its 16-bit copy
    /// (`N`, f16 or bf16) is all-reduced.
    fn start_narrowed<N: Narrow>(
        &mut self,
        b: usize,
        data: CudaSlice<T>,
        in_flight: fn(Work<CudaSlice<N>>) -> InFlight<T>,
    ) -> Result<InFlight<T>, Error> {
        let spare = N::spare(&mut self.buckets[b]).take();
        let narrow = self.narrowed::<N>(&data, spare);
        self.buckets[b].data = Some(data);
        let after = self.trainer_event()?;
        let work =
            self.pg
                .all_reduce_device_async_after(narrow?, ReduceOp::Sum, after, STREAM_ORDERED)?;
        Ok(in_flight(work))
    }

    /// A 16-bit copy of `data` (`N` is f16 or bf16), made on the trainer's stream, in
    /// last step's copy (`spare`) when there is one of the right length.
    fn narrowed<N: Narrow>(
        &self,
        data: &CudaSlice<T>,
        spare: Option<CudaSlice<N>>,
    ) -> Result<CudaSlice<N>, Error> {
        let stream = &self.stream;
        let len = data.len();
        let buffer = match spare {
            Some(spare) if spare.len() == len => Ok(spare),
            // Zeroed once, on allocation; the kernel then writes every element.
            _ => stream.alloc_zeros::<N>(len).map_err(KernelError::from),
        };
        buffer
            .and_then(|mut narrow| {
                self.kernels
                    .narrow(stream, &mut narrow, data, N::DTYPE == crate::DType::BF16)
                    .map(|()| narrow)
            })
            .map_err(kernel_failed(
                self.pg.rank(),
                "narrowing a bucket for the compression hook",
            ))
    }

    /// An event after everything already queued on the trainer's stream (the bucket's
    /// gradients): NCCL's stream waits on it just before the bucket's call; under
    /// `"gloo"` the staging stream does, so that the worker waits for the bucket and not
    /// for the rest of backward queued since.
    fn trainer_event(&self) -> Result<Option<After>, Error> {
        self.stream
            .record_event(None)
            .map(|event| {
                Some(After {
                    event,
                    staging: self.staging.clone(),
                })
            })
            .map_err(|e| kernel_failed(self.pg.rank(), "recording the bucket's event")(e.into()))
    }

    /// Ends the step: starts what is left and orders the trainer's stream after every
    /// bucket's reduction; [`grad`](Self::grad) then views the averaged gradients (work
    /// on the trainer's stream sees them reduced). Under `"nccl"` the host does not wait
    /// for the GPU: the reductions keep the deadline they were issued with, watched by
    /// the group's worker, and one that fails or outruns it breaks the group, and the
    /// next call (or [`synchronize`](Self::synchronize)) returns the error, naming the
    /// operation. The exceptions wait for the step's reductions, as torch does: the
    /// first step's `finish` at a world size above one (the one-time rebuild broadcasts
    /// rank 0's bucket order on the host), and every synchronised `finish` under
    /// `find_unused_parameters` (the group's sum of the used-parameter map is a host
    /// call). Under
    /// `"gloo"` it returns once the buckets are reduced. Under `no_sync` it only closes
    /// the step.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 1), ("b", 1)], Default::default())?;
    /// let g = stream.clone_htod(&[1.0f32])?;
    /// ddp.mark_grad_ready(1, &g.slice(..))?;
    /// assert!(ddp.finish().is_err()); // "w" never got a gradient
    /// # Ok(())
    /// # }
    /// ```
    pub fn finish(&mut self) -> Result<(), Error> {
        self.check_usable()?;
        match self.reducer.begin_finish() {
            FinishPlan::AlreadyClosed => return Ok(()),
            FinishPlan::Missing(error) => {
                // Buckets already started must still complete on every rank.
                let _ = self.wait_all();
                return Err(self.fail(error.into()));
            }
            FinishPlan::Reduce { zero, launch } => {
                for i in zero {
                    let Some((b, at, numel)) = self.reducer.slot(i) else {
                        continue;
                    };
                    let stream = Arc::clone(&self.stream);
                    if let Some(data) = self.buckets.get_mut(b).and_then(|b| b.data.as_mut()) {
                        let zeroed = stream.memset_zeros(&mut data.slice_mut(at..at + numel));
                        zeroed.map_err(KernelError::from).map_err(
                            self.device_failed("zeroing an unused parameter's gradient"),
                        )?;
                    }
                }
                for b in launch {
                    self.launch(b)?;
                }
            }
        }
        // Under find_unused_parameters every rank sums which parameters it used, after
        // the step's buckets, as host DDP does (on the host: under NCCL this waits for
        // the step's reductions, as torch's check of its used map does).
        let used = match self.reducer.take_used_map() {
            Some(map) => match self.pg.all_reduce_async(map, ReduceOp::Sum) {
                Ok(work) => Some(work),
                Err(e) => {
                    let _ = self.wait_all();
                    return Err(self.fail(e));
                }
            },
            None => None,
        };
        self.wait_all()?;
        if let Some(work) = used {
            let counts = work.wait().map_err(|e| self.fail(e))?;
            if let Err(e) = self.reducer.note_used(&counts) {
                return Err(self.internal_from(e));
            }
        }
        if self.reducer.end_finish() {
            self.rebuild()?;
        }
        Ok(())
    }

    /// The parameters no rank produced a gradient for in the last synchronised step,
    /// under `DdpConfig::find_unused_parameters` (empty otherwise); see
    /// [`DistributedDataParallel::unused_everywhere`](crate::ddp::DistributedDataParallel::unused_everywhere).
    /// Their [`grad`](Self::grad) reads zero; torch leaves their gradient untouched, so
    /// an optimizer that must match torch skips them.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let config = ringccl::ddp::DdpConfig::default().find_unused_parameters(true);
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 1), ("head", 1)], config)?;
    /// let g = stream.clone_htod(&[0.5f32])?;
    /// ddp.mark_grad_ready(0, &g.slice(..))?; // "head" sat this step out
    /// ddp.finish()?;
    /// assert_eq!(ddp.unused_everywhere(), [1]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn unused_everywhere(&self) -> &[usize] {
        self.reducer.unused_everywhere()
    }

    /// Waits on the host until this step's reductions have finished on the GPU, each
    /// within the deadline it was issued with (see
    /// [`ProcessGroup::synchronize_device`]): for a host copy of the gradients, a
    /// checkpoint, or a timing. A reduction that failed is the error, and breaks the DDP.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("nccl", ringccl::InitOptions::from_env()?)?;
    /// # let stream = CudaContext::new(pg.cuda_device().unwrap_or(0))?.new_stream()?;
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 4)], Default::default())?;
    /// let g = stream.clone_htod(&[1.0f32; 4])?;
    /// ddp.mark_grad_ready(0, &g.slice(..))?;
    /// ddp.finish()?; // returns without waiting for NCCL
    /// ddp.synchronize()?; // the reduction has finished, or this says why not
    /// # Ok(())
    /// # }
    /// ```
    pub fn synchronize(&mut self) -> Result<(), Error> {
        self.check_usable()?;
        self.pg.synchronize_device().map_err(|e| self.fail(e))
    }

    fn wait_all(&mut self) -> Result<(), Error> {
        let mut first: Option<Error> = None;
        let stream = Arc::clone(&self.stream);
        // Whether the trainer's stream already waits for everything NCCL was given: a
        // widening joins NCCL's stream before it runs, so only whole buckets need the
        // join at the end.
        let mut joined = true;
        for b in 0..self.buckets.len() {
            let Some(in_flight) = self.buckets[b].in_flight.take() else {
                continue;
            };
            let landed = match in_flight {
                InFlight::Full(work) => work.wait().map(|data| {
                    self.buckets[b].data = Some(data);
                    joined = false;
                }),
                InFlight::F16(work) => work.wait().and_then(|narrow| self.widen(b, narrow)),
                InFlight::Bf16(work) => work.wait().and_then(|narrow| self.widen(b, narrow)),
            };
            if let Err(e) = landed {
                first.get_or_insert(e);
            }
        }
        self.reducer.landed();
        if first.is_none() && !joined {
            if let Some(nccl) = self.pg.nccl_stream() {
                // The trainer's stream reads the buckets after NCCL wrote them.
                if let Err(e) = stream.join(&nccl) {
                    first = Some(kernel_failed(self.pg.rank(), "DeviceDdp::finish")(e.into()));
                }
            }
        }
        match first {
            Some(e) => Err(self.fail(e)),
            None => Ok(()),
        }
    }

    /// Widens a reduced 16-bit copy back into bucket `b`, and keeps the copy for the
    /// next step (stream-ordered: the next narrowing runs on the same stream after this).
    fn widen<N: Narrow>(&mut self, b: usize, narrow: CudaSlice<N>) -> Result<(), Error> {
        let stream = Arc::clone(&self.stream);
        let rank = self.pg.rank();
        if let Some(nccl) = self.pg.nccl_stream() {
            stream
                .join(&nccl)
                .map_err(|e| kernel_failed(rank, "DeviceDdp::finish")(e.into()))?;
        }
        let bucket = &mut self.buckets[b];
        let Some(data) = bucket.data.as_mut() else {
            return Err(DdpError::Internal(format!(
                "rank {rank}: a compressed bucket lost its buffer"
            ))
            .into());
        };
        self.kernels
            .widen(&stream, data, &narrow, N::DTYPE == crate::DType::BF16)
            .map_err(kernel_failed(rank, "widening a compressed bucket"))?;
        *N::spare(bucket) = Some(narrow);
        Ok(())
    }

    /// A zeroed bucket per bucket of the reducer's layout, holding the gradients of the
    /// `old` layout (if any).
    fn allocate_layout(
        &self,
        old: Option<(&[DeviceBucket<T>], &OldLayout)>,
    ) -> Result<Vec<DeviceBucket<T>>, Error> {
        let failed = |what: &'static str| {
            let rank = self.pg.rank();
            move |e: ringccl_nccl::cudarc::driver::DriverError| kernel_failed(rank, what)(e.into())
        };
        let stream = &self.stream;
        let mut buckets = Vec::with_capacity(self.reducer.buckets().len());
        for plan in self.reducer.buckets() {
            let data = stream
                .alloc_zeros::<T>(plan.len.max(1))
                .map_err(failed("allocating a DDP bucket"))?;
            buckets.push(DeviceBucket::new(data));
        }
        if let Some((old_buckets, (_, old_slots))) = old {
            for (p, &(ob, oo)) in old_slots.iter().enumerate() {
                let Some((nb, no, numel)) = self.reducer.slot(p) else {
                    continue;
                };
                let src = old_buckets.get(ob).and_then(|b| b.data.as_ref());
                let dst = buckets.get_mut(nb).and_then(|b| b.data.as_mut());
                if let (Some(src), Some(dst)) = (src, dst) {
                    stream
                        .memcpy_dtod(
                            &src.slice(oo..oo + numel),
                            &mut dst.slice_mut(no..no + numel),
                        )
                        .map_err(failed("moving gradients to new buckets"))?;
                }
            }
        }
        Ok(buckets)
    }

    /// The one-time rebuild: rank 0's arrival order becomes every rank's bucket order.
    /// The new buckets replace the old ones only once they hold the gradients; any
    /// failure breaks the DDP.
    fn rebuild(&mut self) -> Result<(), Error> {
        let mut order = self.reducer.rebuild_order();
        // Every rank lays its buckets out in rank 0's order. The broadcast is a host
        // collective, which under NCCL first waits for the calls on the GPU; a group of
        // one has nothing to agree on and skips it.
        if self.pg.world_size() > 1 {
            let sent = self.pg.broadcast(&mut order, 0);
            sent.map_err(|e| self.fail(e))?;
        }
        let old = match self.reducer.lay_out_in(&order) {
            Ok(old) => old,
            Err(e) => return Err(self.internal_from(e)),
        };
        let buckets = self.allocate_layout(Some((&self.buckets, &old)));
        self.buckets = buckets.map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// The averaged gradient of parameter `index`: a view of its bucket on the device,
    /// ordered after the reduction on this DDP's stream. Readable from the end of a
    /// synchronised step's [`finish`](Self::finish) until the next gradient is marked;
    /// at any other time (before `finish`, after passes under `no_sync`, before the
    /// first step) an error that says why and leaves the instance usable, as
    /// [`ddp::DistributedDataParallel::grad`](crate::ddp::DistributedDataParallel::grad).
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let mut ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], Default::default())?;
    /// let g = stream.clone_htod(&[1.0f32, 2.0])?;
    /// ddp.mark_grad_ready(0, &g.slice(..))?;
    /// assert!(ddp.grad(0).is_err()); // before finish(): not an average yet
    /// ddp.finish()?;
    /// let on_host = stream.clone_dtoh(&ddp.grad(0)?)?;
    /// assert!(ddp.grad(1).is_err()); // only one parameter
    /// # Ok(())
    /// # }
    /// ```
    pub fn grad(&self, index: usize) -> Result<CudaView<'_, T>, Error> {
        self.check_usable()?;
        self.reducer.check_averaged(index)?;
        let (b, at, numel) = self.place(index)?;
        match self.buckets.get(b) {
            Some(DeviceBucket {
                data: Some(data),
                in_flight: None,
                ..
            }) => Ok(data.slice(at..at + numel)),
            // Averaged buckets have all landed; this is a bookkeeping fault.
            _ => Err(self.internal(&format!(
                "grad({index}): the bucket of an averaged gradient is missing"
            ))),
        }
    }

    /// Copies rank 0's parameter values into every rank's `params` (device buffers, in
    /// registration order), so that all replicas start identical.
    ///
    /// ```no_run
    /// # use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let stream = CudaContext::new(0)?.new_stream()?;
    /// let ddp = ringccl::DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 2)], Default::default())?;
    /// let mut w = stream.clone_htod(&[0.1f32, 0.2])?;
    /// ddp.broadcast_parameters(&mut [&mut w])?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn broadcast_parameters(&self, params: &mut [&mut CudaSlice<T>]) -> Result<(), Error> {
        self.check_usable()?;
        let specs = self.reducer.params();
        if params.len() != specs.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {}: broadcast_parameters got {} tensors for {} registered parameters; \
                 pass one buffer per parameter, in registration order",
                self.pg.rank(),
                params.len(),
                specs.len()
            )));
        }
        // Every length first, so that a wrong one fails before any broadcast.
        for (i, (p, spec)) in params.iter().zip(specs).enumerate() {
            if p.len() != spec.numel {
                return Err(Error::InvalidArgument(format!(
                    "rank {}: broadcast_parameters: parameter #{i} {:?} has {} elements, \
                     registered with {}",
                    self.pg.rank(),
                    spec.name,
                    p.len(),
                    spec.numel
                )));
            }
        }
        for p in params.iter_mut() {
            let sent = self.pg.broadcast_device(p, 0);
            sent.map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// A reducer error where none can be (its checks already passed): a fault, which
    /// poisons the instance.
    fn internal_from(&self, error: DdpError) -> Error {
        let what = match error {
            DdpError::InvalidArgument(what) => what,
            other => other.to_string(),
        };
        let error = DdpError::Internal(what);
        self.fail(error.into())
    }

    fn internal(&self, what: &str) -> Error {
        let error = DdpError::Internal(format!("rank {}: {what}", self.pg.rank()));
        self.fail(error.into())
    }
}

/// Synchronisation is off while this lives (see [`DeviceDdp::no_sync`]); it derefs to
/// the DDP.
#[derive(Debug)]
pub struct DeviceNoSync<'d, T: DeviceGrad> {
    ddp: &'d mut DeviceDdp<T>,
}

impl<T: DeviceGrad> Deref for DeviceNoSync<'_, T> {
    type Target = DeviceDdp<T>;
    fn deref(&self) -> &DeviceDdp<T> {
        self.ddp
    }
}

impl<T: DeviceGrad> DerefMut for DeviceNoSync<'_, T> {
    fn deref_mut(&mut self) -> &mut DeviceDdp<T> {
        self.ddp
    }
}

impl<T: DeviceGrad> Drop for DeviceNoSync<'_, T> {
    fn drop(&mut self) {
        self.ddp.set_no_sync(false);
    }
}

impl<T: DeviceGrad> fmt::Debug for DeviceDdp<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceDdp")
            .field("rank", &self.pg.rank())
            .field("params", &self.reducer.params().len())
            .field("buckets", &self.buckets.len())
            .field("step", &self.reducer.step())
            .field("hook", &self.hook)
            .finish_non_exhaustive()
    }
}

/// The error of a failed CUDA step of device DDP.
fn kernel_failed(rank: usize, what: &str) -> impl FnOnce(KernelError) -> Error + '_ {
    move |e| Error::Device {
        rank,
        op: format!("DeviceDdp: {what}"),
        call: match e {
            KernelError::NoNvrtc => "loading libnvrtc".into(),
            KernelError::Compile(_) => "nvrtcCompileProgram".into(),
            KernelError::Driver(_) => "a CUDA driver call".into(),
        },
        reason: e.to_string(),
    }
}
