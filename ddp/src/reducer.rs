//! DDP's bookkeeping without the gradients: which parameter lives where, which buckets
//! may start, when a pass ends. Pure and storage-free, so the same rules drive host
//! buckets ([`DistributedDataParallel`](crate::DistributedDataParallel)) and device
//! buckets (`ringccl::DeviceDdp`), and are tested once.

use std::fmt::Display;
use std::ops::Range;
use std::sync::OnceLock;

use crate::config::{DdpConfig, ParamSpec};
use crate::plan::plan_buckets;
use crate::DdpError;

/// One bucket's place in the pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketPlan {
    /// Its parameters, in the order their gradients sit in it.
    pub params: Vec<usize>,
    /// Its length in elements.
    pub len: usize,
    waiting_for: usize,
    in_flight: bool,
}

/// What [`Reducer::begin_finish`] asks the storage to do.
#[derive(Debug)]
pub enum FinishPlan {
    /// The pass was already closed (synchronisation came back on): nothing to do.
    AlreadyClosed,
    /// Zero the gradients of `zero` (unused parameters), start the buckets in `launch`,
    /// wait for every bucket in flight, then call [`Reducer::end_finish`].
    Reduce {
        /// Parameters with no gradient this step and none accumulated.
        zero: Vec<usize>,
        /// Buckets to start now, in order.
        launch: Range<usize>,
    },
    /// Gradients are missing and unused parameters are not allowed: wait for the buckets
    /// in flight (every rank must finish them), then return this error.
    Missing(DdpError),
}

/// The state machine behind DDP: the trainer's events go in (a gradient is ready, the
/// step ends, synchronisation turns off) and what the storage must do comes out (start
/// these buckets, zero these gradients, rebuild the layout). It owns no gradient and
/// does no I/O.
///
/// ```
/// use ringccl::DType;
/// use ringccl::ddp::{DdpConfig, FinishPlan, ParamSpec, Reducer};
///
/// let params = [ParamSpec::new("w", 2, DType::F32), ParamSpec::new("b", 1, DType::F32)];
/// let mut reducer = Reducer::new(0, &params, DdpConfig::default().rebuild_buckets(false));
/// assert_eq!(reducer.buckets().len(), 1); // both fit the first bucket
/// reducer.check_mark(1, Some(1))?;
/// assert!(reducer.mark(1)?.is_empty()); // the bucket still waits for "w"
/// reducer.check_mark(0, Some(2))?;
/// assert_eq!(reducer.mark(0)?, 0..1); // complete: start bucket 0
/// let plan = reducer.begin_finish();
/// assert!(matches!(plan, FinishPlan::Reduce { zero, launch } if zero.is_empty() && launch.is_empty()));
/// assert!(!reducer.end_finish()); // no rebuild asked for
/// assert_eq!(reducer.step(), 1);
/// # Ok::<(), ringccl::ddp::DdpError>(())
/// ```
#[derive(Debug)]
pub struct Reducer {
    rank: usize,
    params: Vec<ParamSpec>,
    config: DdpConfig,
    buckets: Vec<BucketPlan>,
    /// Where each parameter's gradient lives: (bucket, offset).
    slots: Vec<(usize, usize)>,
    /// Marked ready in the current pass.
    ready: Vec<bool>,
    marked: usize,
    /// Holds a gradient since the last synchronised step (no_sync accumulation).
    has_data: Vec<bool>,
    next_launch: usize,
    no_sync: bool,
    /// The current pass's first gradient was marked with synchronisation off: the pass
    /// can be closed without `finish`.
    pass_unsynced: bool,
    /// The last pass was closed without `finish`; a `finish` on the empty pass that
    /// follows is accepted as that pass's (late) end.
    closed_without_finish: bool,
    step: u64,
    /// Order of the first step's gradients, for the one-time rebuild.
    arrival: Vec<usize>,
    rebuilt: bool,
    /// Under `find_unused_parameters`: 1 for each parameter that got a gradient on this
    /// rank since the last synchronised step, else 0, set by a synchronised
    /// `begin_finish` for the storage to sum over the group
    /// ([`take_used_map`](Self::take_used_map)).
    used_map: Option<Vec<f32>>,
    /// Parameters no rank produced a gradient for in the last synchronised step.
    unused_everywhere: Vec<usize>,
    /// The buckets hold the averages of the last synchronised step: true from that
    /// step's end until the next gradient is marked.
    averaged: bool,
    /// The first error that poisoned the DDP instance this reducer keeps the books of
    /// (see [`DdpError`]): every later call names it.
    poisoned: OnceLock<String>,
}

impl Reducer {
    /// Rank `rank`'s bookkeeping for `params`, laid out in reverse registration order
    /// (backward produces the last layer's gradients first), torch's bucket caps from
    /// `config`.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let params = [ParamSpec::new("a", 3, DType::F64), ParamSpec::new("b", 1, DType::F64)];
    /// let reducer = Reducer::new(0, &params, DdpConfig::default());
    /// assert_eq!(reducer.slot(0), Some((0, 1, 3))); // "b" comes first in the bucket
    /// ```
    pub fn new(rank: usize, params: &[ParamSpec], config: DdpConfig) -> Reducer {
        let order: Vec<usize> = (0..params.len()).rev().collect();
        let mut reducer = Reducer {
            rank,
            params: params.to_vec(),
            config,
            buckets: Vec::new(),
            slots: Vec::new(),
            ready: vec![false; params.len()],
            marked: 0,
            has_data: vec![false; params.len()],
            next_launch: 0,
            no_sync: false,
            pass_unsynced: false,
            closed_without_finish: false,
            step: 0,
            arrival: Vec::with_capacity(params.len()),
            rebuilt: false,
            used_map: None,
            unused_everywhere: Vec::new(),
            averaged: false,
            poisoned: OnceLock::new(),
        };
        reducer.lay_out(&order);
        reducer
    }

    /// The registered parameters.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let reducer = Reducer::new(0, &[ParamSpec::new("w", 4, DType::F32)], DdpConfig::default());
    /// assert_eq!(reducer.params()[0].numel, 4);
    /// ```
    pub fn params(&self) -> &[ParamSpec] {
        &self.params
    }

    /// The configuration.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let config = DdpConfig::default().gradient_as_bucket_view(true);
    /// assert!(Reducer::new(0, &[], config).config().gradient_as_bucket_view_on());
    /// ```
    pub fn config(&self) -> &DdpConfig {
        &self.config
    }

    /// The buckets, in launch order.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let reducer = Reducer::new(0, &[ParamSpec::new("w", 4, DType::F32)], DdpConfig::default());
    /// assert_eq!(reducer.buckets()[0].len, 4);
    /// ```
    pub fn buckets(&self) -> &[BucketPlan] {
        &self.buckets
    }

    /// The buckets as parameter indices, in launch order.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let params = [ParamSpec::new("a", 2, DType::F32), ParamSpec::new("b", 1, DType::F32)];
    /// let reducer = Reducer::new(0, &params, DdpConfig::default());
    /// assert_eq!(reducer.bucket_layout(), vec![vec![1, 0]]);
    /// ```
    pub fn bucket_layout(&self) -> Vec<Vec<usize>> {
        self.buckets.iter().map(|b| b.params.clone()).collect()
    }

    /// Where parameter `index`'s gradient lives: (bucket, offset in elements), and its
    /// length; `None` for an index that is not a registered parameter.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let reducer = Reducer::new(0, &[ParamSpec::new("w", 4, DType::F32)], DdpConfig::default());
    /// assert_eq!(reducer.slot(0), Some((0, 0, 4)));
    /// assert_eq!(reducer.slot(1), None);
    /// ```
    pub fn slot(&self, index: usize) -> Option<(usize, usize, usize)> {
        let (bucket, offset) = *self.slots.get(index)?;
        Some((bucket, offset, self.params[index].numel))
    }

    /// Steps finished so far.
    ///
    /// ```
    /// # use ringccl::ddp::{DdpConfig, Reducer};
    /// assert_eq!(Reducer::new(0, &[], DdpConfig::default()).step(), 0);
    /// ```
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Whether parameter `index` already holds a gradient to add to (accumulated under
    /// `no_sync`) rather than to overwrite.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let mut reducer = Reducer::new(0, &[ParamSpec::new("w", 1, DType::F32)], DdpConfig::default());
    /// reducer.set_no_sync(true);
    /// reducer.check_mark(0, None)?;
    /// assert!(!reducer.accumulates(0));
    /// reducer.mark(0)?;
    /// reducer.check_mark(0, None)?; // the next micro-batch
    /// assert!(reducer.accumulates(0));
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn accumulates(&self, index: usize) -> bool {
        self.has_data.get(index).copied().unwrap_or(false)
    }

    /// Whether a bucket is being reduced.
    ///
    /// ```
    /// # use ringccl::ddp::{DdpConfig, Reducer};
    /// assert!(!Reducer::new(0, &[], DdpConfig::default()).any_in_flight());
    /// ```
    pub fn any_in_flight(&self) -> bool {
        self.buckets.iter().any(|b| b.in_flight)
    }

    /// Whether a pass is under way (a gradient was marked since the last step ended).
    ///
    /// ```
    /// # use ringccl::ddp::{DdpConfig, Reducer};
    /// assert!(!Reducer::new(0, &[], DdpConfig::default()).pass_open());
    /// ```
    pub fn pass_open(&self) -> bool {
        self.marked > 0
    }

    /// Turns synchronisation off or back on; turning it on closes a pass that ran
    /// without it (see `DistributedDataParallel::set_no_sync`).
    ///
    /// ```
    /// # use ringccl::ddp::{DdpConfig, Reducer};
    /// let mut reducer = Reducer::new(0, &[], DdpConfig::default());
    /// reducer.set_no_sync(true);
    /// reducer.set_no_sync(false);
    /// ```
    pub fn set_no_sync(&mut self, off: bool) {
        self.no_sync = off;
        if !off {
            self.close_unsynced_pass();
        }
    }

    /// Closes a pass that began with synchronisation off, if one is open and nothing of
    /// it is in flight: its gradients stay accumulated, nothing is communicated.
    fn close_unsynced_pass(&mut self) -> bool {
        if !(self.pass_unsynced && self.marked > 0 && !self.any_in_flight()) {
            return false;
        }
        self.reset_pass();
        self.step += 1;
        self.closed_without_finish = true;
        true
    }

    /// Checks a gradient about to be marked (its index, and its length when given); a
    /// gradient marked again after a pass without synchronisation closes that pass
    /// first.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let mut reducer = Reducer::new(0, &[ParamSpec::new("w", 2, DType::F32)], DdpConfig::default());
    /// assert!(reducer.check_mark(1, None).is_err()); // no parameter #1
    /// assert!(reducer.check_mark(0, Some(3)).is_err()); // wrong length
    /// reducer.check_mark(0, Some(2))?;
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn check_mark(&mut self, index: usize, len: Option<usize>) -> Result<(), DdpError> {
        let Some(spec) = self.params.get(index) else {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: a gradient was marked for parameter #{index}, which does not exist \
                 ({} parameters registered)",
                self.rank,
                self.params.len()
            )));
        };
        if let Some(len) = len.filter(|&len| len != spec.numel) {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: the gradient of parameter #{index} {:?} has {len} elements, but it \
                 was registered with {}; hand a gradient of the parameter's size",
                self.rank, spec.name, spec.numel
            )));
        }
        if self.ready[index] && self.close_unsynced_pass() {
            return Ok(());
        }
        if self.ready[index] {
            let name = self.params[index].name.clone();
            let (rank, step) = (self.rank, self.step);
            return Err(if self.marked == self.params.len() {
                DdpError::StepNotFinished {
                    rank,
                    index,
                    name,
                    step,
                }
            } else {
                DdpError::GradReadyTwice {
                    rank,
                    index,
                    name,
                    step,
                }
            });
        }
        Ok(())
    }

    /// Records that parameter `index`'s gradient is in its bucket (after
    /// [`check_mark`](Self::check_mark)); returns the buckets to start now, in order
    /// (complete, and every earlier one started), which are then counted in flight. A
    /// parameter not checked first (out of range, or already marked in this pass) is an
    /// error and changes nothing.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let mut reducer = Reducer::new(0, &[ParamSpec::new("w", 2, DType::F32)], DdpConfig::default());
    /// reducer.check_mark(0, None)?;
    /// assert_eq!(reducer.mark(0)?, 0..1);
    /// assert!(reducer.any_in_flight());
    /// assert!(reducer.mark(0).is_err()); // twice in one pass
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn mark(&mut self, index: usize) -> Result<Range<usize>, DdpError> {
        if self.ready.get(index).is_none_or(|&ready| ready) {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: Reducer::mark({index}) without a successful check_mark",
                self.rank
            )));
        }
        if self.marked == 0 {
            self.pass_unsynced = self.no_sync;
            self.closed_without_finish = false;
        }
        self.ready[index] = true;
        self.has_data[index] = true;
        self.averaged = false;
        self.marked += 1;
        if self.step == 0 && !self.rebuilt {
            self.arrival.push(index);
        }
        let (b, _) = self.slots[index];
        self.buckets[b].waiting_for -= 1;
        if self.no_sync {
            return Ok(self.next_launch..self.next_launch);
        }
        Ok(self.launchable())
    }

    /// The complete buckets whose predecessors have all started, now counted in flight.
    fn launchable(&mut self) -> Range<usize> {
        let first = self.next_launch;
        while let Some(bucket) = self.buckets.get_mut(self.next_launch) {
            if bucket.waiting_for > 0 {
                break;
            }
            bucket.in_flight = true;
            self.next_launch += 1;
        }
        first..self.next_launch
    }

    /// Every bucket in flight has landed (the storage waited for them).
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let mut reducer = Reducer::new(0, &[ParamSpec::new("w", 2, DType::F32)], DdpConfig::default());
    /// reducer.check_mark(0, None)?;
    /// reducer.mark(0)?;
    /// reducer.landed();
    /// assert!(!reducer.any_in_flight());
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn landed(&mut self) {
        for bucket in &mut self.buckets {
            bucket.in_flight = false;
        }
    }

    /// The step ends: what the storage must do before [`end_finish`](Self::end_finish).
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, FinishPlan, ParamSpec, Reducer};
    /// let params = [ParamSpec::new("w", 1, DType::F32), ParamSpec::new("b", 1, DType::F32)];
    /// let config = DdpConfig::default().find_unused_parameters(true);
    /// let mut reducer = Reducer::new(0, &params, config);
    /// reducer.check_mark(1, None)?;
    /// reducer.mark(1)?;
    /// // "w" got no gradient: it is zeroed, and the bucket starts.
    /// let plan = reducer.begin_finish();
    /// assert!(matches!(plan, FinishPlan::Reduce { zero, launch } if zero == [0] && launch == (0..1)));
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn begin_finish(&mut self) -> FinishPlan {
        self.used_map = None;
        if self.marked == 0 && std::mem::take(&mut self.closed_without_finish) {
            return FinishPlan::AlreadyClosed;
        }
        if self.no_sync {
            return FinishPlan::Reduce {
                zero: Vec::new(),
                launch: self.next_launch..self.next_launch,
            };
        }
        let missing: Vec<usize> = (0..self.params.len()).filter(|&i| !self.ready[i]).collect();
        if self.config.find_unused_parameters {
            // Every rank sums this map at every synchronised step, whether or not it
            // misses a gradient itself: another rank may.
            let used = (0..self.params.len())
                .map(|i| {
                    if self.ready[i] || self.has_data[i] {
                        1.0
                    } else {
                        0.0
                    }
                })
                .collect();
            self.used_map = Some(used);
            // Until the group's sum is noted, nothing is known to be unused everywhere.
            self.unused_everywhere.clear();
        }
        if missing.is_empty() {
            // Buckets completed while synchronisation was off (turned off and on again
            // mid-pass) start now.
            return FinishPlan::Reduce {
                zero: Vec::new(),
                launch: self.launchable(),
            };
        }
        if !self.config.find_unused_parameters {
            return FinishPlan::Missing(DdpError::MissingGrads {
                rank: self.rank,
                step: self.step,
                missing: missing
                    .iter()
                    .map(|&i| (i, self.params[i].name.clone()))
                    .collect(),
            });
        }
        let mut zero = Vec::new();
        for &i in &missing {
            if !self.has_data[i] {
                zero.push(i);
            }
            self.ready[i] = true;
            self.marked += 1;
            let (b, _) = self.slots[i];
            self.buckets[b].waiting_for -= 1;
        }
        FinishPlan::Reduce {
            zero,
            launch: self.launchable(),
        }
    }

    /// Under `find_unused_parameters`, after a synchronised
    /// [`begin_finish`](Self::begin_finish): 1 for each parameter that got a gradient on
    /// this rank since the last synchronised step, else 0. Every rank must sum it over
    /// the group (after starting the step's buckets, so that every rank issues the calls
    /// in the same order) and hand the sum to [`note_used`](Self::note_used). `None` in
    /// every other case, and once taken.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let params = [ParamSpec::new("w", 1, DType::F32), ParamSpec::new("b", 1, DType::F32)];
    /// let config = DdpConfig::default().find_unused_parameters(true);
    /// let mut reducer = Reducer::new(0, &params, config);
    /// reducer.check_mark(1, None)?;
    /// reducer.mark(1)?;
    /// reducer.begin_finish();
    /// assert_eq!(reducer.take_used_map(), Some(vec![0.0, 1.0]));
    /// assert_eq!(reducer.take_used_map(), None);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn take_used_map(&mut self) -> Option<Vec<f32>> {
        self.used_map.take()
    }

    /// Records the group's sum of [`take_used_map`](Self::take_used_map) for this
    /// synchronised step: the parameters whose count is 0 are
    /// [`unused_everywhere`](Self::unused_everywhere).
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let params = [ParamSpec::new("w", 1, DType::F32), ParamSpec::new("b", 1, DType::F32)];
    /// let mut reducer = Reducer::new(0, &params, DdpConfig::default().find_unused_parameters(true));
    /// reducer.note_used(&[0.0, 2.0])?; // "b" used on two ranks, "w" on none
    /// assert_eq!(reducer.unused_everywhere(), [0]);
    /// assert!(reducer.note_used(&[1.0]).is_err()); // one count per parameter
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn note_used(&mut self, counts: &[f32]) -> Result<(), DdpError> {
        if counts.len() != self.params.len() {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: the group's used-parameter map has {} entries for {} parameters",
                self.rank,
                counts.len(),
                self.params.len()
            )));
        }
        self.unused_everywhere = (0..counts.len()).filter(|&i| counts[i] == 0.0).collect();
        Ok(())
    }

    /// The parameters no rank produced a gradient for since the one before the last
    /// synchronised step (a gradient accumulated under `no_sync` counts as produced),
    /// under `find_unused_parameters` (empty otherwise). torch leaves such a
    /// parameter's gradient untouched (usually `None`, so its optimizer skips it); here
    /// its averaged gradient reads zero, and an optimizer that must match torch (momentum,
    /// weight decay) skips these.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let reducer = Reducer::new(0, &[ParamSpec::new("w", 1, DType::F32)], DdpConfig::default());
    /// assert!(reducer.unused_everywhere().is_empty());
    /// ```
    pub fn unused_everywhere(&self) -> &[usize] {
        &self.unused_everywhere
    }

    /// [`Broken`](DdpError::Broken), naming the first poisoning error, once the instance
    /// is poisoned ([`poison`](Self::poison)); `Ok` until then.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, DdpError, ParamSpec, Reducer};
    /// let reducer = Reducer::new(0, &[ParamSpec::new("w", 2, DType::F32)], DdpConfig::default());
    /// assert!(reducer.check_usable().is_ok());
    /// reducer.poison(&"rank 0: a gradient was marked twice");
    /// reducer.poison(&"a later error"); // the first one stays
    /// let Err(DdpError::Broken(first)) = reducer.check_usable() else { panic!() };
    /// assert_eq!(first, "rank 0: a gradient was marked twice");
    /// ```
    pub fn check_usable(&self) -> Result<(), DdpError> {
        match self.poisoned.get() {
            Some(first) => Err(DdpError::Broken(first.clone())),
            None => Ok(()),
        }
    }

    /// Poisons the instance with `error`, unless an earlier error already did.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let reducer = Reducer::new(0, &[ParamSpec::new("w", 2, DType::F32)], DdpConfig::default());
    /// reducer.poison(&"rank 0: the all-reduce timed out");
    /// assert!(reducer.check_usable().is_err());
    /// ```
    pub fn poison(&self, error: &dyn Display) {
        self.poisoned.get_or_init(|| error.to_string());
    }

    /// An error of the reducer's checks, as the instance takes it: an argument refused
    /// before anything changed ([`InvalidArgument`](DdpError::InvalidArgument)) leaves it
    /// usable; any other (an inconsistent step) poisons it.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, DdpError, ParamSpec, Reducer};
    /// let reducer = Reducer::new(0, &[ParamSpec::new("w", 2, DType::F32)], DdpConfig::default());
    /// reducer.refused_or_poisoned(DdpError::InvalidArgument("wrong length".into()));
    /// assert!(reducer.check_usable().is_ok());
    /// reducer.refused_or_poisoned(DdpError::Internal("a fault".into()));
    /// assert!(reducer.check_usable().is_err());
    /// ```
    pub fn refused_or_poisoned(&self, error: DdpError) -> DdpError {
        if !matches!(error, DdpError::InvalidArgument(_)) {
            self.poison(&error);
        }
        error
    }

    /// Whether parameter `index`'s gradient can be read as an average, and if not, the
    /// error that says why. The buckets hold averages from the end of a synchronised
    /// step (its `finish`) until the next gradient is marked; at any other time they
    /// hold this rank's own gradients (divided by the world size, or accumulated under
    /// `no_sync`), which must not pass for averages. The error is an
    /// [`InvalidArgument`](DdpError::InvalidArgument): it changes nothing.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let mut reducer = Reducer::new(0, &[ParamSpec::new("w", 2, DType::F32)], DdpConfig::default());
    /// assert!(reducer.check_averaged(0).is_err()); // no step has finished
    /// reducer.check_mark(0, None)?;
    /// reducer.mark(0)?;
    /// let early = reducer.check_averaged(0).unwrap_err();
    /// assert!(early.to_string().contains("before finish()"));
    /// reducer.begin_finish();
    /// reducer.end_finish();
    /// reducer.check_averaged(0)?; // the step's averages
    /// assert!(reducer.check_averaged(1).is_err()); // no parameter #1
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn check_averaged(&self, index: usize) -> Result<(), DdpError> {
        let rank = self.rank;
        let Some(spec) = self.params.get(index) else {
            return Err(DdpError::InvalidArgument(format!(
                "rank {rank}: grad({index}): there is no parameter #{index} ({} parameters \
                 registered)",
                self.params.len()
            )));
        };
        if self.averaged {
            return Ok(());
        }
        let (name, step) = (&spec.name, self.step);
        let why = if self.marked > 0 && !self.pass_unsynced {
            format!(
                "grad({index}) before finish(): step {step}'s gradients are not averaged yet \
                 (parameter #{index} {name:?} holds this rank's own gradient, or is still being \
                 all-reduced); call finish() first"
            )
        } else if self.marked > 0 || self.has_data.iter().any(|&d| d) {
            format!(
                "grad({index}): the gradients were accumulated under no_sync and are not \
                 averaged (parameter #{index} {name:?} holds this rank's own sum); they are \
                 averaged by the finish() of the next synchronised pass"
            )
        } else {
            format!(
                "grad({index}): no synchronised step has finished yet, so parameter #{index} \
                 {name:?} has no averaged gradient; mark every gradient, then call finish()"
            )
        };
        Err(DdpError::InvalidArgument(format!("rank {rank}: {why}")))
    }

    /// The buckets have landed: closes the step. Returns whether the one-time rebuild is
    /// due now (then [`rebuild_order`](Self::rebuild_order), broadcast it from rank 0,
    /// and [`lay_out_in`](Self::lay_out_in)).
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let mut reducer = Reducer::new(0, &[ParamSpec::new("w", 1, DType::F32)], DdpConfig::default());
    /// reducer.check_mark(0, None)?;
    /// reducer.mark(0)?;
    /// reducer.begin_finish();
    /// assert!(reducer.end_finish()); // torch rebuilds once, after the first step
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn end_finish(&mut self) -> bool {
        self.landed();
        let synced = !self.no_sync;
        if synced {
            self.has_data.fill(false);
            self.averaged = true;
        }
        self.reset_pass();
        let rebuild = synced && self.step == 0 && self.config.rebuild_buckets && !self.rebuilt;
        self.step += 1;
        rebuild
    }

    fn reset_pass(&mut self) {
        self.ready.fill(false);
        self.marked = 0;
        self.pass_unsynced = false;
        self.next_launch = 0;
        for bucket in &mut self.buckets {
            bucket.waiting_for = bucket.params.len();
        }
    }

    /// The one-time rebuild's order: the first step's arrival order (parameters that
    /// never arrived follow, in reverse registration order). Rank 0's becomes everyone's.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let params = [ParamSpec::new("a", 1, DType::F32), ParamSpec::new("b", 1, DType::F32)];
    /// let mut reducer = Reducer::new(0, &params, DdpConfig::default());
    /// reducer.check_mark(0, None)?;
    /// reducer.mark(0)?;
    /// assert_eq!(reducer.rebuild_order(), vec![0, 1]);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn rebuild_order(&mut self) -> Vec<i64> {
        self.rebuilt = true;
        let n = self.params.len();
        let mut seen = vec![false; n];
        let mut order: Vec<i64> = Vec::with_capacity(n);
        for &i in &self.arrival {
            seen[i] = true;
            order.push(i as i64);
        }
        order.extend((0..n).rev().filter(|&i| !seen[i]).map(|i| i as i64));
        self.arrival = Vec::new();
        order
    }

    /// Lays the buckets out in `order` (rank 0's, after a broadcast), which must name
    /// every parameter once; no rebuild happens after this. Returns the old buckets and
    /// slots, for the storage to move the gradients it holds.
    ///
    /// ```
    /// # use ringccl::DType;
    /// # use ringccl::ddp::{DdpConfig, ParamSpec, Reducer};
    /// let params = [ParamSpec::new("a", 1, DType::F32), ParamSpec::new("b", 1, DType::F32)];
    /// let mut reducer = Reducer::new(0, &params, DdpConfig::default());
    /// let (_, old_slots) = reducer.lay_out_in(&[0, 1])?;
    /// assert_eq!(old_slots, vec![(0, 1), (0, 0)]);
    /// assert_eq!(reducer.slot(0), Some((0, 0, 1)));
    /// assert!(reducer.lay_out_in(&[0, 0]).is_err());
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn lay_out_in(&mut self, order: &[i64]) -> Result<OldLayout, DdpError> {
        let n = self.params.len();
        if !is_permutation(order, n) {
            return Err(DdpError::InvalidArgument(format!(
                "rank {}: the bucket order from rank 0 does not name each of the {n} \
                 parameters once",
                self.rank
            )));
        }
        self.rebuilt = true;
        self.arrival = Vec::new();
        let order: Vec<usize> = order
            .iter()
            .map(|&i| usize::try_from(i).unwrap_or(0))
            .collect();
        let old = (
            std::mem::take(&mut self.buckets),
            std::mem::take(&mut self.slots),
        );
        self.lay_out(&order);
        Ok(old)
    }

    fn lay_out(&mut self, order: &[usize]) {
        let numels: Vec<usize> = self.params.iter().map(|p| p.numel).collect();
        let elem_bytes = self.params.first().map_or(1, |p| p.dtype.size());
        let plan = plan_buckets(
            order,
            &numels,
            elem_bytes,
            self.config.first_bucket_bytes,
            self.config.bucket_cap_bytes,
        );
        let mut slots = vec![(0, 0); self.params.len()];
        self.buckets = plan
            .into_iter()
            .enumerate()
            .map(|(b, params)| {
                let mut len = 0;
                for &p in &params {
                    slots[p] = (b, len);
                    len += numels[p];
                }
                BucketPlan {
                    waiting_for: params.len(),
                    params,
                    len,
                    in_flight: false,
                }
            })
            .collect();
        self.slots = slots;
    }
}

/// The buckets and slots a new layout replaced.
pub type OldLayout = (Vec<BucketPlan>, Vec<(usize, usize)>);

/// Whether `order` names each of `0..n` exactly once.
pub(crate) fn is_permutation(order: &[i64], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order.iter().all(|&i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| seen.get_mut(i))
                .is_some_and(|s| !std::mem::replace(s, true))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringccl_collectives::DType;

    /// Two parameters, a bucket each: bucket 0 holds #1, bucket 1 holds #0.
    fn two_buckets() -> Reducer {
        let params = [
            ParamSpec::new("a", 4, DType::F32),
            ParamSpec::new("b", 4, DType::F32),
        ];
        let config = DdpConfig::default()
            .first_bucket_bytes(1)
            .bucket_cap_bytes(1);
        Reducer::new(3, &params, config)
    }

    #[test]
    fn a_mark_without_a_check_is_refused_and_changes_nothing() {
        let mut reducer = two_buckets();
        assert!(reducer.mark(2).is_err(), "out of range");
        reducer.check_mark(1, None).unwrap();
        assert_eq!(reducer.mark(1).unwrap(), 0..1);
        let err = reducer.mark(1).unwrap_err();
        assert!(err.to_string().contains("rank 3"), "{err}");
        assert!(reducer.pass_open());
        // The pass is intact: #0 completes bucket 1.
        reducer.check_mark(0, None).unwrap();
        assert_eq!(reducer.mark(0).unwrap(), 1..2);
    }

    #[test]
    fn buckets_completed_while_sync_was_off_mid_pass_start_at_finish() {
        let mut reducer = two_buckets();
        reducer.check_mark(1, None).unwrap();
        assert_eq!(reducer.mark(1).unwrap(), 0..1); // synchronised: starts
        reducer.set_no_sync(true);
        reducer.check_mark(0, None).unwrap();
        assert!(reducer.mark(0).unwrap().is_empty()); // held back
        reducer.set_no_sync(false); // the pass began synchronised: it stays open
        assert!(reducer.pass_open());
        match reducer.begin_finish() {
            FinishPlan::Reduce { zero, launch } => {
                assert!(zero.is_empty());
                assert_eq!(launch, 1..2, "bucket 1 must be reduced too");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_a_synchronised_finish_hands_out_the_used_map() {
        let params = [
            ParamSpec::new("w", 1, DType::F32),
            ParamSpec::new("b", 1, DType::F32),
        ];
        let config = DdpConfig::default()
            .find_unused_parameters(true)
            .rebuild_buckets(false);
        let mut reducer = Reducer::new(0, &params, config);
        // A no_sync pass ended by finish: nothing to exchange.
        reducer.set_no_sync(true);
        reducer.check_mark(1, None).unwrap();
        reducer.mark(1).unwrap();
        assert!(matches!(reducer.begin_finish(), FinishPlan::Reduce { .. }));
        assert_eq!(reducer.take_used_map(), None);
        reducer.end_finish();
        // A no_sync pass closed by turning synchronisation back on; the finish that
        // follows on the empty pass is its late end: nothing to exchange either.
        reducer.check_mark(1, None).unwrap();
        reducer.mark(1).unwrap();
        reducer.set_no_sync(false);
        assert!(matches!(reducer.begin_finish(), FinishPlan::AlreadyClosed));
        assert_eq!(reducer.take_used_map(), None);
        // The synchronised pass: "b", accumulated under no_sync, counts as used.
        reducer.check_mark(0, None).unwrap();
        reducer.mark(0).unwrap();
        assert!(matches!(reducer.begin_finish(), FinishPlan::Reduce { .. }));
        assert_eq!(reducer.take_used_map(), Some(vec![1.0, 1.0]));
        reducer.end_finish();
        reducer.note_used(&[3.0, 0.0]).unwrap();
        assert_eq!(reducer.unused_everywhere(), [1]);
        // The next synchronised step forgets the list until its own sum is noted.
        reducer.check_mark(0, None).unwrap();
        reducer.mark(0).unwrap();
        reducer.begin_finish();
        assert_eq!(reducer.take_used_map(), Some(vec![1.0, 0.0]));
        assert!(reducer.unused_everywhere().is_empty());
    }

    #[test]
    fn averages_are_readable_from_a_synchronised_finish_to_the_next_mark() {
        let mut reducer = two_buckets();
        let says = |reducer: &Reducer, what: &str| {
            let error = reducer.check_averaged(0).unwrap_err().to_string();
            assert!(error.contains(what), "{error}");
            assert!(error.contains("rank 3"), "{error}");
        };
        says(&reducer, "no synchronised step");
        for i in [1, 0] {
            reducer.check_mark(i, None).unwrap();
            reducer.mark(i).unwrap();
        }
        says(&reducer, "before finish()");
        reducer.begin_finish();
        reducer.end_finish();
        reducer.check_averaged(0).unwrap();
        reducer.check_averaged(1).unwrap();
        // A finish under no_sync with nothing marked changes no bucket: still averages.
        reducer.set_no_sync(true);
        reducer.begin_finish();
        reducer.end_finish();
        reducer.check_averaged(0).unwrap();
        // A gradient accumulated under no_sync: no average until the synchronised finish.
        reducer.check_mark(1, None).unwrap();
        reducer.mark(1).unwrap();
        says(&reducer, "no_sync");
        reducer.set_no_sync(false); // closes the pass
        says(&reducer, "no_sync");
        reducer.check_mark(1, None).unwrap();
        reducer.mark(1).unwrap();
        says(&reducer, "before finish()");
        reducer.check_mark(0, None).unwrap();
        reducer.mark(0).unwrap();
        reducer.begin_finish();
        reducer.end_finish();
        reducer.check_averaged(0).unwrap();
        assert!(reducer.check_averaged(2).is_err());
    }

    #[test]
    fn slots_of_unknown_parameters_are_none() {
        let reducer = two_buckets();
        assert_eq!(reducer.slot(0), Some((1, 0, 4)));
        assert_eq!(reducer.slot(2), None);
        assert!(!reducer.accumulates(9));
    }
}
