//! DDP itself, once for every memory space: gradients into buckets, buckets onto the
//! wire while backward runs. Where the buckets live is the [`GradSpace`]'s business.

use std::fmt;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

use ringccl_collectives::BufferMut;
use ringccl_observe::timeline::{SpanGuard, Timeline};

use crate::communicator::{BucketLabel, Communicator, GradBuf, Pending, ToCommunicator};
use crate::config::{DdpConfig, ParamSpec};
use crate::element::GradElement;
use crate::hooks::AllReduceHook;
use crate::reducer::{is_permutation, FinishPlan, OldLayout, Reducer};
use crate::space::CommHook;
use crate::space::{GradSpace, HostSpace};
use crate::DdpError;

/// Data-parallel gradient averaging, PyTorch DDP's way, for a trainer that owns its own
/// autograd.
///
/// Each step:
/// 1. as backward produces each gradient, call
///    [`mark_grad_ready`](Self::mark_grad_ready)`(index, &grad)` (any order; usually
///    last layer first). The gradient is copied into its bucket already divided by the
///    world size; when a bucket is complete, its all-reduce starts in the background —
///    buckets start strictly in bucket order, the same on every rank — while backward
///    goes on;
/// 2. call [`finish`](Self::finish), which waits for the buckets, then read the averaged
///    gradients with [`grad`](Self::grad) and update the parameters. `grad` before
///    `finish` is an error, never this rank's own gradient passing for the average.
///
/// ```
/// use ringccl::ddp::{DdpConfig, DistributedDataParallel};
/// # fn main() -> Result<(), ringccl::Error> {
/// // Under ringrun: ringccl::InitOptions::from_env()?; here, a group of one rank.
/// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// let params = [("fc.weight", 6), ("fc.bias", 2)];
/// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, params, DdpConfig::default())?;
/// // ... forward, then backward produces the bias gradient first:
/// ddp.mark_grad_ready(1, &[0.5, -0.5])?;
/// ddp.mark_grad_ready(0, &[1.0; 6])?;
/// assert!(ddp.grad(1).is_err()); // not averaged before finish()
/// ddp.finish()?;
/// assert_eq!(ddp.grad(1)?, &[0.5, -0.5]); // averaged over the (one) rank
/// # Ok(())
/// # }
/// ```
///
/// An error either poisons the instance (every later call returns
/// [`DdpError::Broken`], naming it) or leaves it usable; [`DdpError`] lists which.
///
/// It holds its own handle on the group (a clone of the `ProcessGroup`), so it can live
/// in the same struct as the group and the model.
///
/// It is [`Ddp`] over host memory; `ringccl::DeviceDdp` is the same type over GPU
/// memory, with the same methods.
pub type DistributedDataParallel<T> = Ddp<T, HostSpace>;

/// Data-parallel gradient averaging over buckets that live in the memory space `S`:
/// [`HostSpace`] ([`DistributedDataParallel`]) or, with the `device` feature, GPU memory
/// (`DeviceDdp`). One implementation of PyTorch DDP's rules over the [`Reducer`]; the
/// methods and their errors are the same in every space, only the gradient and view
/// types are the space's.
pub struct Ddp<T: GradElement, S: GradSpace<T>> {
    comm: Arc<dyn Communicator>,
    /// The bookkeeping: layout, marks, launches, passes.
    reducer: Reducer,
    /// Where the buckets live, and how values move there.
    space: S,
    hook: Box<dyn CommHook<T, S>>,
    /// The gradients, one flat buffer per bucket of the reducer's layout.
    buckets: Vec<Bucket<S::Bucket>>,
    /// The timeline's `trainer` row, when the communicator traces.
    trainer: Option<Timeline>,
}

struct Bucket<B> {
    /// `None` while its reduction is in flight.
    data: Option<B>,
    in_flight: Option<Pending<B>>,
}

/// Refuses parameters of another element type than `T` (no instance is created).
pub(crate) fn check_dtypes<T: GradElement>(
    rank: usize,
    params: &[ParamSpec],
) -> Result<(), DdpError> {
    match params.iter().enumerate().find(|(_, p)| p.dtype != T::DTYPE) {
        Some((i, p)) => Err(DdpError::InvalidArgument(format!(
            "rank {rank}: parameter #{i} {:?} is {} but this DDP averages {} gradients; \
             use one instance per gradient type",
            p.name,
            p.dtype,
            T::DTYPE
        ))),
        None => Ok(()),
    }
}

/// `(name, number of elements)` pairs as parameters of `T`'s element type.
pub(crate) fn specs<T: GradElement, N: Into<String>>(
    params: impl IntoIterator<Item = (N, usize)>,
) -> Vec<ParamSpec> {
    params
        .into_iter()
        .map(|(name, numel)| ParamSpec::new(name, numel, T::DTYPE))
        .collect()
}

impl<T: GradElement> Ddp<T, HostSpace> {
    /// Registers `params` (in model order) and checks, collectively, that every rank
    /// registered the same ones; a difference is an error naming the first one.
    ///
    /// `comm` is usually `&pg` for a `ringccl::ProcessGroup`, which DDP clones (a cheap
    /// handle on the same group); an `Arc` of a communicator works too.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # use ringccl::DType;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let specs = [ParamSpec::new("w", 3, DType::F32), ParamSpec::new("b", 1, DType::F32)];
    /// let ddp = DistributedDataParallel::<f32>::new(&pg, &specs, DdpConfig::default())?;
    /// assert_eq!(ddp.params().len(), 2);
    /// let wrong = [ParamSpec::new("w", 3, DType::F64)];
    /// assert!(DistributedDataParallel::<f32>::new(&pg, &wrong, DdpConfig::default()).is_err());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn new(
        comm: impl ToCommunicator,
        params: &[ParamSpec],
        config: DdpConfig,
    ) -> Result<Self, DdpError> {
        let comm = comm.to_communicator();
        check_dtypes::<T>(comm.rank(), params)?;
        Ddp::build(comm, HostSpace, params, config, Box::new(AllReduceHook))
    }

    /// [`new`](Self::new) with the parameters given as `(name, number of elements)`:
    /// their element type is `T`'s.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # use ringccl::DType;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let names: Vec<String> = (0..3).map(|l| format!("layer{l}.weight")).collect();
    /// let ddp = DistributedDataParallel::<f64>::with_params(
    ///     &pg,
    ///     names.iter().map(|name| (name.as_str(), 16)),
    ///     DdpConfig::default(),
    /// )?;
    /// assert_eq!(ddp.params()[2].dtype, DType::F64);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn with_params<N: Into<String>>(
        comm: impl ToCommunicator,
        params: impl IntoIterator<Item = (N, usize)>,
        config: DdpConfig,
    ) -> Result<Self, DdpError> {
        DistributedDataParallel::new(comm, &specs::<T, N>(params), config)
    }

    /// Copies every averaged gradient out, in parameter order; readable when
    /// [`grad`](Ddp::grad) is, with its errors.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 2), ("b", 1)], DdpConfig::default())?;
    /// ddp.mark_grad_ready(1, &[3.0])?;
    /// ddp.mark_grad_ready(0, &[1.0, 2.0])?;
    /// ddp.finish()?;
    /// assert_eq!(ddp.grads()?, vec![vec![1.0, 2.0], vec![3.0]]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn grads(&self) -> Result<Vec<Vec<T>>, DdpError> {
        (0..self.reducer.params().len())
            .map(|i| self.grad(i).map(<[T]>::to_vec))
            .collect()
    }
}

impl<T: GradElement, S: GradSpace<T>> Ddp<T, S> {
    /// The instance over `space`, after this rank's own set-up (its buckets) and the
    /// collective checks that every rank registered the same parameters and settings.
    pub(crate) fn build(
        comm: Arc<dyn Communicator>,
        space: S,
        params: &[ParamSpec],
        config: DdpConfig,
        hook: Box<dyn CommHook<T, S>>,
    ) -> Result<Self, DdpError> {
        let mut ddp = Ddp {
            reducer: Reducer::new(comm.rank(), params, config),
            space,
            hook,
            buckets: Vec::new(),
            trainer: comm.trace_file().map(|file| file.row("trainer")),
            comm,
        };
        // This rank's own set-up first: a rank that cannot allocate its buckets fails
        // before the collective checks, not after its peers passed them.
        ddp.buckets = ddp.allocate_layout(None)?;
        check_same_params(&*ddp.comm, params)?;
        check_same_config(&*ddp.comm, ddp.reducer.config())?;
        Ok(ddp)
    }

    /// Replaces the communication hook (default [`AllReduceHook`]). Every rank must use
    /// the same hook.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 4)], DdpConfig::default())?;
    /// ddp.register_comm_hook(Fp16CompressHook); // all-reduce in f16, half the bytes
    /// ddp.mark_grad_ready(0, &[1.0, 2.0, 3.0, 4.0])?;
    /// ddp.finish()?;
    /// assert_eq!(ddp.grad(0)?, &[1.0, 2.0, 3.0, 4.0]); // exact in f16
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn register_comm_hook(&mut self, hook: impl CommHook<T, S> + 'static) {
        self.hook = Box::new(hook);
    }

    /// The registered parameters.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # use ringccl::DType;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let ddp = DistributedDataParallel::<f64>::with_params(&pg, [("w", 2)], DdpConfig::default())?;
    /// assert_eq!(ddp.params()[0], ParamSpec::new("w", 2, DType::F64));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn params(&self) -> &[ParamSpec] {
        self.reducer.params()
    }

    /// The current buckets, as parameter indices, in launch order.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// // 4-byte gradients, first bucket capped at 8 bytes: [c, b] then [a].
    /// let config = DdpConfig::default().first_bucket_bytes(8);
    /// let ddp = DistributedDataParallel::<f32>::with_params(&pg, [("a", 2), ("b", 1), ("c", 1)], config)?;
    /// assert_eq!(ddp.bucket_layout(), vec![vec![2, 1], vec![0]]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn bucket_layout(&self) -> Vec<Vec<usize>> {
        self.reducer.bucket_layout()
    }

    /// Steps finished so far (each `finish` counts, `no_sync` ones included).
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1)], DdpConfig::default())?;
    /// ddp.mark_grad_ready(0, &[1.0])?;
    /// ddp.finish()?;
    /// assert_eq!(ddp.steps(), 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn steps(&self) -> u64 {
        self.reducer.step()
    }

    /// A zeroed buffer per bucket of the reducer's layout, holding the gradients of the
    /// `old` layout (if any) so that [`grad`](Self::grad) keeps answering. The caller
    /// replaces the old buckets only once this succeeded.
    fn allocate_layout(&self, old: Option<&OldLayout>) -> Result<Vec<Bucket<S::Bucket>>, DdpError> {
        let mut buckets = Vec::with_capacity(self.reducer.buckets().len());
        for plan in self.reducer.buckets() {
            buckets.push(Bucket {
                data: Some(self.space.alloc(plan.len)?),
                in_flight: None,
            });
        }
        if let Some((_, old_slots)) = old {
            for (p, &(ob, oo)) in old_slots.iter().enumerate() {
                let Some((nb, no, numel)) = self.reducer.slot(p) else {
                    continue;
                };
                let src = self.buckets.get(ob).and_then(|b| b.data.as_ref());
                let dst = buckets.get_mut(nb).and_then(|b| b.data.as_mut());
                if let (Some(src), Some(dst)) = (src, dst) {
                    self.space.copy(src, oo, dst, no, numel)?;
                }
            }
        }
        Ok(buckets)
    }

    /// Times the trainer's backward pass on the timeline (the `trainer` row of this
    /// rank's Chrome trace, when tracing is on): from now until the returned guard is
    /// dropped. With it, the trace shows the buckets' all-reduces (the `ddp` row)
    /// overlapping the backward pass. Records nothing when tracing is off.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # use ringccl::DType;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let params = [ParamSpec::new("w", 2, DType::F32)];
    /// let mut ddp = DistributedDataParallel::<f32>::new(&pg, &params, DdpConfig::default())?;
    /// let backward = ddp.backward_span();
    /// ddp.mark_grad_ready(0, &[1.0, 2.0])?; // as backward produces it
    /// drop(backward); // the backward pass ends
    /// ddp.finish()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn backward_span(&self) -> SpanGuard {
        self.trainer_span("backward")
    }

    /// Times any part of the training step (`"forward"`, `"optimizer"`) on the timeline's
    /// `trainer` row, like [`backward_span`](Self::backward_span). Spans of that row
    /// should follow each other (or nest), not overlap.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # use ringccl::DType;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// # let params = [ParamSpec::new("w", 2, DType::F32)];
    /// let ddp = DistributedDataParallel::<f32>::new(&pg, &params, DdpConfig::default())?;
    /// let forward = ddp.trainer_span("forward");
    /// assert!(!forward.is_on()); // this communicator does not trace
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn trainer_span(&self, name: &'static str) -> SpanGuard {
        match &self.trainer {
            Some(row) => row.span(name),
            None => SpanGuard::off(),
        }
    }

    /// Turns synchronisation off (`true`) or back on: while off, gradients accumulate in
    /// the buckets (summed over the passes) and nothing is communicated; the first
    /// synchronised pass after that all-reduces the accumulated sum. See
    /// [`no_sync`](Self::no_sync) for the scoped form.
    ///
    /// As in torch, a pass without synchronisation needs no `finish`: marking a gradient
    /// again starts the next pass, and turning synchronisation back on closes the pass.
    /// (Calling `finish` anyway is harmless.)
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1)], DdpConfig::default())?;
    /// ddp.set_no_sync(true);
    /// ddp.mark_grad_ready(0, &[1.0])?; // micro-batch 1
    /// ddp.mark_grad_ready(0, &[2.0])?; // micro-batch 2: a new pass, accumulated
    /// ddp.set_no_sync(false);
    /// ddp.mark_grad_ready(0, &[3.0])?; // the synchronised pass
    /// ddp.finish()?;
    /// assert_eq!(ddp.grad(0)?, &[6.0]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn set_no_sync(&mut self, off: bool) {
        self.reducer.set_no_sync(off);
    }

    /// Gradient accumulation, torch's `with ddp.no_sync():`: synchronisation is off until
    /// the returned guard is dropped, which also closes the pass (no `finish` needed).
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1)], DdpConfig::default())?;
    /// ddp.no_sync().mark_grad_ready(0, &[1.0])?; // accumulated, not communicated
    /// ddp.mark_grad_ready(0, &[2.0])?; // synchronised
    /// ddp.finish()?;
    /// assert_eq!(ddp.grad(0)?, &[3.0]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn no_sync(&mut self) -> NoSync<'_, T, S> {
        self.reducer.set_no_sync(true);
        NoSync { ddp: self }
    }

    /// Hands DDP the gradient of parameter `index` for this step; see the type's docs.
    ///
    /// A wrong index or length is refused ([`InvalidArgument`](DdpError::InvalidArgument))
    /// and leaves the instance usable. A gradient marked twice in one pass
    /// ([`GradReadyTwice`](DdpError::GradReadyTwice)), or one of the next step before
    /// `finish` ([`StepNotFinished`](DdpError::StepNotFinished)), poisons it.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 2), ("b", 1)], DdpConfig::default())?;
    /// ddp.mark_grad_ready(1, &[0.5])?; // backward produces the last layer first
    /// ddp.mark_grad_ready(0, &[1.0, 2.0])?;
    /// assert!(ddp.mark_grad_ready(0, &[1.0]).is_err()); // wrong length
    /// ddp.finish()?;
    /// assert_eq!(ddp.grad(1)?, &[0.5]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn mark_grad_ready(&mut self, index: usize, grad: &S::Grad<'_>) -> Result<(), DdpError> {
        self.reducer.check_usable()?;
        self.space.check_grad(index, grad)?;
        let checked = self.reducer.check_mark(index, Some(S::grad_len(grad)));
        checked.map_err(|e| self.reducer.refused_or_poisoned(e))?;
        let n = if self.reducer.config().gradient_as_bucket_view_on() {
            1 // divided once per bucket, at launch
        } else {
            self.comm.world_size()
        };
        let accumulate = self.reducer.accumulates(index);
        let Some((b, at, _)) = self.reducer.slot(index) else {
            return Err(self.internal("a checked gradient has no slot"));
        };
        let Some(data) = self.buckets.get_mut(b).and_then(|b| b.data.as_mut()) else {
            return Err(self.internal("bucket in flight while a gradient was written"));
        };
        let stored = self.space.store(data, at, grad, n, accumulate);
        stored.map_err(|e| self.fail(e))?;
        self.mark(index)
    }

    /// With [`DdpConfig::gradient_as_bucket_view`]: the place in its bucket where the
    /// gradient of parameter `index` lives. Write (or accumulate) the gradient there, then
    /// call [`mark_grad_ready_in_view`](Self::mark_grad_ready_in_view). It holds the
    /// averaged gradient after `finish`; zero it yourself before accumulating a new one
    /// if your trainer accumulates into gradients.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let config = DdpConfig::default().gradient_as_bucket_view(true);
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 3)], config)?;
    /// ddp.grad_view_mut(0)?.copy_from_slice(&[1.0, 2.0, 3.0]); // backward writes in place
    /// ddp.mark_grad_ready_in_view(0)?;
    /// ddp.finish()?;
    /// assert_eq!(ddp.grad(0)?, &[1.0, 2.0, 3.0]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn grad_view_mut(&mut self, index: usize) -> Result<S::ViewMut<'_>, DdpError> {
        self.reducer.check_usable()?;
        let rank = self.comm.rank();
        if !self.reducer.config().gradient_as_bucket_view_on() {
            return Err(DdpError::InvalidArgument(format!(
                "rank {rank}: grad_view_mut({index}) needs \
                 DdpConfig::gradient_as_bucket_view(true)"
            )));
        }
        let count = self.reducer.params().len();
        let (b, at, numel) = self.reducer.slot(index).ok_or_else(|| {
            DdpError::InvalidArgument(format!(
                "rank {rank}: grad_view_mut({index}): there is no parameter #{index} \
                 ({count} parameters registered)"
            ))
        })?;
        match self.buckets.get_mut(b).and_then(|b| b.data.as_mut()) {
            Some(data) => Ok(S::view_mut(data, at, numel)),
            None => Err(DdpError::InvalidArgument(format!(
                "rank {rank}: grad_view_mut({index}): parameter #{index}'s bucket is being \
                 all-reduced; its view is available again after finish()"
            ))),
        }
    }

    /// With [`DdpConfig::gradient_as_bucket_view`]: the gradient of parameter `index` has
    /// been written into its view.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let config = DdpConfig::default().gradient_as_bucket_view(true);
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1)], config)?;
    /// ddp.grad_view_mut(0)?[0] = 4.0;
    /// ddp.mark_grad_ready_in_view(0)?;
    /// ddp.finish()?;
    /// assert_eq!(ddp.grad(0)?, &[4.0]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn mark_grad_ready_in_view(&mut self, index: usize) -> Result<(), DdpError> {
        self.reducer.check_usable()?;
        if !self.reducer.config().gradient_as_bucket_view_on() {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: mark_grad_ready_in_view({index}) needs \
                 DdpConfig::gradient_as_bucket_view(true)",
                self.comm.rank()
            )));
        }
        let checked = self.reducer.check_mark(index, None);
        checked.map_err(|e| self.reducer.refused_or_poisoned(e))?;
        self.mark(index)
    }

    fn mark(&mut self, index: usize) -> Result<(), DdpError> {
        let launch = match self.reducer.mark(index) {
            Ok(launch) => launch,
            Err(e) => return Err(self.internal_from(e)),
        };
        self.launch(launch)
    }

    /// Starts the buckets the reducer says may start, in order: the division
    /// (bucket-view mode), then the hook. On an error the instance is poisoned.
    fn launch(&mut self, buckets: Range<usize>) -> Result<(), DdpError> {
        let n = self.comm.world_size();
        let divide = self.reducer.config().gradient_as_bucket_view_on() && n > 1;
        for b in buckets {
            let Some(mut data) = self
                .buckets
                .get_mut(b)
                .and_then(|bucket| bucket.data.take())
            else {
                return Err(self.internal("a bucket was launched twice"));
            };
            if divide {
                let divided = self.space.divide(&mut data, n);
                divided.map_err(|e| self.fail(e))?;
            }
            let label = BucketLabel {
                bucket: b,
                step: self.reducer.step(),
            };
            match self.space.start(&*self.hook, &*self.comm, label, data) {
                Ok(pending) => self.buckets[b].in_flight = Some(pending),
                Err(e) => return Err(self.fail(e.into())),
            }
        }
        Ok(())
    }

    /// Ends the step: launches what is left, waits for every bucket, and makes the
    /// averaged gradients readable through [`grad`](Self::grad). Under `no_sync` it only
    /// closes the step (nothing is communicated; gradients keep accumulating).
    ///
    /// Gradients missing (without [`DdpConfig::find_unused_parameters`]) are a
    /// [`MissingGrads`](DdpError::MissingGrads) error, and a failed all-reduce a
    /// [`Comm`](DdpError::Comm) one; both poison the instance.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1), ("b", 1)], DdpConfig::default())?;
    /// ddp.mark_grad_ready(1, &[1.0])?;
    /// assert!(ddp.finish().is_err()); // "w" never got a gradient
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn finish(&mut self) -> Result<(), DdpError> {
        self.reducer.check_usable()?;
        let plan = self.reducer.begin_finish();
        if let FinishPlan::AlreadyClosed = plan {
            return Ok(());
        }
        let _waiting = self.trainer_span("ddp finish");
        match plan {
            FinishPlan::AlreadyClosed => {}
            FinishPlan::Missing(error) => {
                // Buckets already started must still complete on every rank.
                let _ = self.wait_all();
                return Err(self.fail(error));
            }
            FinishPlan::Reduce { zero, launch } => {
                for i in zero {
                    let Some((b, at, numel)) = self.reducer.slot(i) else {
                        continue;
                    };
                    if let Some(data) = self.buckets.get_mut(b).and_then(|b| b.data.as_mut()) {
                        let zeroed = self.space.zero(data, at, numel);
                        zeroed.map_err(|e| self.fail(e))?;
                    }
                }
                self.launch(launch)?;
            }
        }
        // Under find_unused_parameters every rank sums which parameters it used, after
        // the step's buckets (the same order everywhere), as torch's local_used_map.
        let used = match self.reducer.take_used_map() {
            Some(map) => match self.comm.all_reduce_sum_async(GradBuf::F32(map)) {
                Ok(pending) => Some(pending),
                Err(e) => {
                    let _ = self.wait_all();
                    return Err(self.fail(e.into()));
                }
            },
            None => None,
        };
        self.wait_all()?;
        if let Some(pending) = used {
            let summed = pending.wait().map_err(DdpError::from);
            let rank = self.comm.rank();
            let noted = summed.and_then(|counts| match counts {
                GradBuf::F32(counts) => self.reducer.note_used(&counts).map_err(|e| match e {
                    DdpError::InvalidArgument(what) => DdpError::Internal(what),
                    other => other,
                }),
                other => Err(DdpError::Internal(format!(
                    "rank {rank}: the group's used-parameter map came back as {} values, \
                     not f32",
                    other.dtype()
                ))),
            });
            noted.map_err(|e| self.fail(e))?;
        }
        if self.reducer.end_finish() {
            self.rebuild()?;
        }
        Ok(())
    }

    /// The parameters no rank produced a gradient for in the last synchronised step (a
    /// gradient accumulated under `no_sync` since the step before counts as produced),
    /// under [`DdpConfig::find_unused_parameters`] (empty otherwise). torch leaves such a
    /// parameter's gradient untouched (usually `None`, so its optimizer skips it); here
    /// [`grad`](Self::grad) reads zero for it, and an optimizer that must match torch
    /// (momentum, weight decay) skips these.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let config = DdpConfig::default().find_unused_parameters(true);
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1), ("head", 1)], config)?;
    /// ddp.mark_grad_ready(0, &[0.5])?; // "head" sat this step out
    /// ddp.finish()?;
    /// assert_eq!(ddp.unused_everywhere(), [1]);
    /// assert_eq!(ddp.grad(1)?, [0.0]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn unused_everywhere(&self) -> &[usize] {
        self.reducer.unused_everywhere()
    }

    /// Waits for every bucket in flight (all of them, even after a failure: they must
    /// complete on every rank), then orders what reads them after their reductions.
    fn wait_all(&mut self) -> Result<(), DdpError> {
        let rank = self.comm.rank();
        let mut first = None;
        let mut waited = false;
        for (b, (bucket, plan)) in self
            .buckets
            .iter_mut()
            .zip(self.reducer.buckets())
            .enumerate()
        {
            if let Some(pending) = bucket.in_flight.take() {
                waited = true;
                match pending.wait() {
                    Ok(data) if S::holds(&data, plan.len) => bucket.data = Some(data),
                    Ok(_) => {
                        first.get_or_insert(DdpError::Internal(format!(
                            "rank {rank}: the communication hook handed back another buffer \
                             than bucket {b}'s ({} values); a hook must return the bucket \
                             it was given, reduced",
                            plan.len
                        )));
                    }
                    Err(e) => {
                        first.get_or_insert(e.into());
                    }
                }
            }
        }
        self.reducer.landed();
        if first.is_none() && waited {
            first = self.space.landed().err();
        }
        match first {
            Some(e) => Err(self.fail(e)),
            None => Ok(()),
        }
    }

    /// The parameters in bucket order (the buckets' parameters one after the other):
    /// what a checkpoint saves so that a resumed run can lay its buckets out exactly as
    /// the interrupted one had them, with [`restore_bucket_order`](Self::restore_bucket_order).
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let ddp = DistributedDataParallel::<f32>::with_params(
    ///     &pg,
    ///     [("a", 4), ("b", 2), ("c", 8)],
    ///     DdpConfig::default(),
    /// )?;
    /// assert_eq!(ddp.bucket_order(), vec![2, 1, 0]); // reverse registration at first
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn bucket_order(&self) -> Vec<usize> {
        self.bucket_layout().concat()
    }

    /// Lays the buckets out in `order` (from [`bucket_order`](Self::bucket_order) of an
    /// earlier run), in place of the first step's one-time rebuild, which then does not
    /// happen. A run resumed from a checkpoint thus reduces every step's gradients in the
    /// same buckets as the uninterrupted run, which keeps the resumed parameters
    /// bit-identical whatever order the backward pass marks gradients in. Collective:
    /// rank 0's `order` is broadcast and becomes every rank's (the others' is not read:
    /// they may pass an empty slice). Call it between passes (before a pass's first
    /// gradient); rank 0's `order` must name every parameter once, else every rank gets
    /// the same error.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(
    ///     &pg,
    ///     [("a", 4), ("b", 2), ("c", 8)],
    ///     DdpConfig::default(),
    /// )?;
    /// ddp.restore_bucket_order(&[1, 2, 0])?;
    /// assert_eq!(ddp.bucket_order(), vec![1, 2, 0]);
    /// assert!(ddp.restore_bucket_order(&[0, 0, 1]).is_err());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn restore_bucket_order(&mut self, order: &[usize]) -> Result<(), DdpError> {
        self.reducer.check_usable()?;
        if self.reducer.pass_open() || self.reducer.any_in_flight() {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: restore_bucket_order must be called between passes (after \
                 finish()), not while gradients are being marked or reduced",
                self.comm.rank()
            )));
        }
        let n = self.reducer.params().len();
        // Rank 0 sends its order even when it is wrong, so that every rank fails alike.
        let mut wanted: Vec<i64> = match self.comm.rank() {
            0 if order.len() == n => order
                .iter()
                .map(|&i| i64::try_from(i).unwrap_or(-1))
                .collect(),
            _ => vec![-1; n],
        };
        let sent = self.comm.broadcast(BufferMut::from_slice(&mut wanted), 0);
        sent.map_err(|e| self.fail(e.into()))?;
        if !is_permutation(&wanted, n) {
            return Err(DdpError::InvalidArgument(format!(
                "restore_bucket_order: rank 0's order {} does not name each of the {n} \
                 parameters once",
                if self.comm.rank() == 0 {
                    format!("{order:?}")
                } else {
                    "(see its error)".to_string()
                }
            )));
        }
        self.lay_out_in(&wanted)
    }

    /// Lays the buckets out in `order` (a permutation of the parameter indices), keeping
    /// the gradients they hold.
    fn lay_out_in(&mut self, order: &[i64]) -> Result<(), DdpError> {
        let old_layout = match self.reducer.lay_out_in(order) {
            Ok(old) => old,
            Err(e) => return Err(self.internal_from(e)),
        };
        let buckets = self.allocate_layout(Some(&old_layout));
        self.buckets = buckets.map_err(|e| self.fail(e))?;
        Ok(())
    }

    /// The one-time rebuild: rank 0's arrival order, broadcast, becomes every rank's
    /// bucket order. The broadcast is a host collective, which under NCCL first waits
    /// for the calls on the GPU; a group of one has nothing to agree on and skips it.
    fn rebuild(&mut self) -> Result<(), DdpError> {
        let mut order = self.reducer.rebuild_order();
        if self.comm.world_size() > 1 {
            let sent = self.comm.broadcast(BufferMut::from_slice(&mut order), 0);
            sent.map_err(|e| self.fail(e.into()))?;
        }
        if !is_permutation(&order, self.reducer.params().len()) {
            return Err(self.internal(
                "the bucket order broadcast by rank 0 does not name each parameter once",
            ));
        }
        self.lay_out_in(&order)
    }

    /// The averaged gradient of parameter `index` (a view into its bucket; no copy),
    /// readable from the end of a synchronised step's [`finish`](Self::finish) until the
    /// next gradient is marked.
    ///
    /// At any other time it is an [`InvalidArgument`](DdpError::InvalidArgument) error
    /// that says why, never this rank's own gradient passing for the average: before
    /// `finish` (the step's gradients are this rank's own, or on the wire), after passes
    /// under [`no_sync`](Self::no_sync) (the buckets hold this rank's accumulated
    /// gradients until the next synchronised `finish`; torch's `.grad` would show them,
    /// but here they are already divided by the world size), and before the first step.
    /// So is an index out of range. These errors leave the instance usable; a poisoned
    /// instance returns [`Broken`](DdpError::Broken).
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 2)], DdpConfig::default())?;
    /// ddp.mark_grad_ready(0, &[1.0, 2.0])?;
    /// assert!(ddp.grad(0).is_err()); // before finish(): not an average yet
    /// ddp.finish()?;
    /// let mut w = [0.5f32, 0.5];
    /// for (w, g) in w.iter_mut().zip(ddp.grad(0)?) {
    ///     *w -= 0.1 * g;
    /// }
    /// assert_eq!(w, [0.4, 0.3]);
    /// assert!(ddp.grad(1).is_err()); // only one parameter
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn grad(&self, index: usize) -> Result<S::View<'_>, DdpError> {
        self.reducer.check_usable()?;
        self.reducer.check_averaged(index)?;
        let slot = self.reducer.slot(index);
        let data = slot.and_then(|(b, _, _)| self.buckets.get(b)?.data.as_ref());
        match (slot, data) {
            (Some((_, at, numel)), Some(data)) => Ok(S::view(data, at, numel)),
            // Averaged buckets have all landed; this is a bookkeeping fault.
            _ => Err(self.internal(&format!(
                "grad({index}): the bucket of an averaged gradient is missing"
            ))),
        }
    }

    /// Copies rank 0's parameter values into every rank's `params` (in registration
    /// order), so that all replicas start identical.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 2)], DdpConfig::default())?;
    /// let mut w = vec![0.1f32, 0.2];
    /// ddp.broadcast_parameters(&mut [&mut w])?; // every rank now holds rank 0's values
    /// assert!(ddp.broadcast_parameters(&mut []).is_err()); // one slice per parameter
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn broadcast_parameters(&self, params: &mut [&mut S::Param]) -> Result<(), DdpError> {
        self.reducer.check_usable()?;
        let specs = self.reducer.params();
        if params.len() != specs.len() {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: broadcast_parameters got {} tensors for {} registered parameters; \
                 pass one per parameter, in registration order",
                self.comm.rank(),
                params.len(),
                specs.len()
            )));
        }
        for (i, (p, spec)) in params.iter().zip(specs).enumerate() {
            if S::param_len(p) != spec.numel {
                return Err(DdpError::InvalidArgument(format!(
                    "rank {}: broadcast_parameters: parameter #{i} {:?} has {} elements, \
                     registered with {}",
                    self.comm.rank(),
                    spec.name,
                    S::param_len(p),
                    spec.numel
                )));
            }
        }
        let fuse_bytes = self.reducer.config().bucket_cap();
        let sent = self.space.broadcast(&*self.comm, params, fuse_bytes);
        sent.map_err(|e| self.fail(e.into()))
    }

    /// Waits on the host until this step's reductions have finished where they run:
    /// for a host copy of device gradients, a checkpoint, or a timing. On the host they
    /// have when [`finish`](Self::finish) returns, and this returns at once; on the
    /// device (under `"nccl"`, whose `finish` does not wait for the GPU) each within the
    /// deadline it was issued with. A reduction that failed is the error, and poisons
    /// the instance.
    ///
    /// ```
    /// # use ringccl::ddp::*;
    /// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1)], DdpConfig::default())?;
    /// ddp.mark_grad_ready(0, &[1.0])?;
    /// ddp.finish()?;
    /// ddp.synchronize()?; // the same trainer code runs over device buckets
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn synchronize(&mut self) -> Result<(), DdpError> {
        self.reducer.check_usable()?;
        let synced = self.space.synchronize();
        synced.map_err(|e| self.fail(e.into()))
    }

    /// Poisons the instance (the first error is the one every later call names).
    fn fail(&self, error: DdpError) -> DdpError {
        self.reducer.poison(&error);
        error
    }

    /// A reducer error where none can be (its checks already passed): a fault, which
    /// poisons the instance.
    fn internal_from(&self, error: DdpError) -> DdpError {
        let what = match error {
            DdpError::InvalidArgument(what) => what,
            other => other.to_string(),
        };
        let error = DdpError::Internal(what);
        self.fail(error)
    }

    fn internal(&self, what: &str) -> DdpError {
        self.fail(DdpError::Internal(format!(
            "rank {}: {what}",
            self.comm.rank()
        )))
    }
}

impl<T: GradElement, S: GradSpace<T>> fmt::Debug for Ddp<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ddp")
            .field("rank", &self.comm.rank())
            .field("space", &self.space)
            .field("params", &self.reducer.params().len())
            .field("buckets", &self.buckets.len())
            .field("step", &self.reducer.step())
            .field("hook", &self.hook)
            .finish_non_exhaustive()
    }
}

/// Synchronisation is off while this lives (see [`Ddp::no_sync`]); it derefs to the
/// DDP.
#[derive(Debug)]
pub struct NoSync<'d, T: GradElement, S: GradSpace<T> = HostSpace> {
    ddp: &'d mut Ddp<T, S>,
}

impl<T: GradElement, S: GradSpace<T>> Deref for NoSync<'_, T, S> {
    type Target = Ddp<T, S>;
    fn deref(&self) -> &Self::Target {
        self.ddp
    }
}

impl<T: GradElement, S: GradSpace<T>> DerefMut for NoSync<'_, T, S> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.ddp
    }
}

impl<T: GradElement, S: GradSpace<T>> Drop for NoSync<'_, T, S> {
    fn drop(&mut self) {
        self.ddp.set_no_sync(false);
    }
}

/// Every rank compares its parameter list with rank 0's; all ranks learn the first
/// difference any rank found (collective: every rank calls it). DDP does this when it
/// is created; a DDP over other storage (device buckets) calls it too.
///
/// ```
/// # use ringccl::ddp::*;
/// # use ringccl::DType;
/// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// check_same_params(&pg, &[ParamSpec::new("w", 3, DType::F32)])?;
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn check_same_params(comm: &dyn Communicator, params: &[ParamSpec]) -> Result<(), DdpError> {
    let rank = comm.rank();
    let mine = describe(params);
    let mut len = [mine.len() as i64];
    comm.broadcast(BufferMut::from_slice(&mut len), 0)?;
    let mut theirs = vec![0u8; usize::try_from(len[0]).unwrap_or(0)];
    if rank == 0 {
        theirs.copy_from_slice(&mine);
    }
    comm.broadcast(BufferMut::from_slice(&mut theirs), 0)?;
    let rank0 = parse(&theirs);
    // This rank's first differing index (-1: none).
    let first = (0..params.len().max(rank0.len()))
        .find(|&i| params.get(i) != rank0.get(i))
        .map_or(-1, |i| i as i64);
    let mut all = vec![0i64; comm.world_size()];
    comm.all_gather_i64(&[first], &mut all)?;
    let Some((bad_rank, &index)) = all.iter().enumerate().find(|(_, &i)| i >= 0) else {
        return Ok(());
    };
    let show = |p: Option<&ParamSpec>| match p {
        Some(p) => format!("{:?} [{} x {}]", p.name, p.numel, p.dtype),
        None => "nothing".to_string(),
    };
    let index = index as usize;
    let difference = if bad_rank == rank {
        format!(
            "parameter #{index}: rank 0 has {}, rank {rank} has {}",
            show(rank0.get(index)),
            show(params.get(index))
        )
    } else {
        format!(
            "parameter #{index}: rank 0 has {}, rank {bad_rank} has something else (its error names it)",
            show(rank0.get(index))
        )
    };
    Err(DdpError::ParamMismatch { rank, difference })
}

/// Every rank compares the settings that decide DDP's collectives (the bucket caps,
/// `find_unused_parameters`, `rebuild_buckets`) with every other rank's; all ranks learn
/// the first difference (collective: every rank calls it). Ranks that differ would run
/// different collectives from their first step on. DDP does this when it is created,
/// after [`check_same_params`].
///
/// ```
/// # use ringccl::ddp::*;
/// # let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// check_same_config(&pg, &DdpConfig::default().find_unused_parameters(true))?;
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn check_same_config(comm: &dyn Communicator, config: &DdpConfig) -> Result<(), DdpError> {
    const FIELDS: [&str; 4] = [
        "first_bucket_bytes",
        "bucket_cap_bytes",
        "find_unused_parameters",
        "rebuild_buckets",
    ];
    let size = |bytes: usize| i64::try_from(bytes).unwrap_or(i64::MAX);
    let mine = [
        size(config.first_bucket_bytes),
        size(config.bucket_cap_bytes),
        i64::from(config.find_unused_parameters),
        i64::from(config.rebuild_buckets),
    ];
    let mut all = vec![0i64; comm.world_size() * FIELDS.len()];
    comm.all_gather_i64(&mine, &mut all)?;
    let rank0 = &all[..FIELDS.len()];
    for (other, theirs) in all.chunks(FIELDS.len()).enumerate().skip(1) {
        if let Some(f) = (0..FIELDS.len()).find(|&f| theirs[f] != rank0[f]) {
            let show = |v: i64| match f {
                2 | 3 => (v != 0).to_string(),
                _ => v.to_string(),
            };
            return Err(DdpError::ConfigMismatch {
                rank: comm.rank(),
                difference: format!(
                    "{}: rank 0 has {}, rank {other} has {}",
                    FIELDS[f],
                    show(rank0[f]),
                    show(theirs[f])
                ),
            });
        }
    }
    Ok(())
}

/// `name \0 numel \0 dtype-code \n` per parameter.
fn describe(params: &[ParamSpec]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in params {
        out.extend_from_slice(p.name.as_bytes());
        out.push(0);
        out.extend_from_slice(p.numel.to_string().as_bytes());
        out.push(0);
        out.push(p.dtype.code());
        out.push(b'\n');
    }
    out
}

fn parse(bytes: &[u8]) -> Vec<ParamSpec> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(name_end) = rest.iter().position(|&b| b == 0) else {
            break;
        };
        let name = String::from_utf8_lossy(&rest[..name_end]).into_owned();
        rest = &rest[name_end + 1..];
        let Some(numel_end) = rest.iter().position(|&b| b == 0) else {
            break;
        };
        let numel = std::str::from_utf8(&rest[..numel_end])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(usize::MAX);
        rest = &rest[numel_end + 1..];
        let (Some(&code), Some(b'\n')) = (rest.first(), rest.get(1)) else {
            break;
        };
        rest = &rest[2..];
        match ringccl_collectives::DType::from_code(code) {
            Some(dtype) => out.push(ParamSpec { name, numel, dtype }),
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringccl_collectives::DType;

    #[test]
    fn parameter_descriptions_round_trip() {
        let params = vec![
            ParamSpec::new("a.weight", 12, DType::F32),
            ParamSpec::new("b", 0, DType::BF16),
            ParamSpec::new("ünïcode", 7, DType::F64),
        ];
        assert_eq!(parse(&describe(&params)), params);
        assert!(parse(b"garbage").is_empty());
    }
}
