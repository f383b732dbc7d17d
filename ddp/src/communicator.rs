//! What DDP needs from a process group, as an object-safe trait.
//!
//! `ringccl::ProcessGroup` implements it; the DDP layer itself knows nothing of
//! backends, so it runs unchanged over `"gloo"` and `"nccl"`.

use std::fmt;
use std::sync::Arc;

use ringccl_collectives::half::{bf16, f16};
use ringccl_collectives::{BufferMut, DType, Error};
use ringccl_observe::timeline::TraceFile;

/// A gradient buffer of one of the float types, moved into an asynchronous all-reduce.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum GradBuf {
    /// `f32` values.
    F32(Vec<f32>),
    /// `f64` values.
    F64(Vec<f64>),
    /// `f16` values.
    F16(Vec<f16>),
    /// `bf16` values.
    BF16(Vec<bf16>),
}

impl GradBuf {
    /// The element type.
    ///
    /// ```
    /// use ringccl::DType;
    /// assert_eq!(ringccl::ddp::GradBuf::F64(vec![1.0]).dtype(), DType::F64);
    /// ```
    pub fn dtype(&self) -> DType {
        match self {
            GradBuf::F32(_) => DType::F32,
            GradBuf::F64(_) => DType::F64,
            GradBuf::F16(_) => DType::F16,
            GradBuf::BF16(_) => DType::BF16,
        }
    }

    /// Number of elements.
    ///
    /// ```
    /// assert_eq!(ringccl::ddp::GradBuf::F32(vec![0.0; 5]).len(), 5);
    /// ```
    pub fn len(&self) -> usize {
        match self {
            GradBuf::F32(v) => v.len(),
            GradBuf::F64(v) => v.len(),
            GradBuf::F16(v) => v.len(),
            GradBuf::BF16(v) => v.len(),
        }
    }

    /// Whether it holds no elements.
    ///
    /// ```
    /// assert!(ringccl::ddp::GradBuf::F32(Vec::new()).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An operation running in the background; `wait` returns its result.
pub trait Wait<V>: Send {
    /// Blocks until the operation has finished (within the group's deadline).
    fn wait(self: Box<Self>) -> Result<V, Error>;
}

/// A boxed [`Wait`].
pub type Pending<V> = Box<dyn Wait<V>>;

impl<V> fmt::Debug for dyn Wait<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pending")
    }
}

/// An already finished operation, for hooks that have nothing left to wait for.
#[derive(Debug)]
pub struct Ready<V>(pub V);

impl<V: Send> Wait<V> for Ready<V> {
    fn wait(self: Box<Self>) -> Result<V, Error> {
        Ok(self.0)
    }
}

/// `pending`, its result passed through `then` once it is there.
pub(crate) fn then<V: 'static, W: 'static>(
    pending: Pending<V>,
    then: impl FnOnce(V) -> Result<W, Error> + Send + 'static,
) -> Pending<W> {
    Box::new(Then {
        pending,
        then: Box::new(then),
    })
}

struct Then<V, W> {
    pending: Pending<V>,
    then: Box<dyn FnOnce(V) -> Result<W, Error> + Send>,
}

impl<V, W> Wait<W> for Then<V, W> {
    fn wait(self: Box<Self>) -> Result<W, Error> {
        (self.then)(self.pending.wait()?)
    }
}

/// Which DDP bucket an all-reduce is, for the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketLabel {
    /// The bucket's index (buckets start in index order).
    pub bucket: usize,
    /// The training step, counted by DDP from 0.
    pub step: u64,
}

/// The collectives DDP uses. Every call follows the group's rules: every rank issues
/// the same calls in the same order.
pub trait Communicator: Send + Sync {
    /// This process's rank.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Starts summing `buf` across ranks in the background, in issue order with every
    /// other operation of the group.
    fn all_reduce_sum_async(&self, buf: GradBuf) -> Result<Pending<GradBuf>, Error>;

    /// Copies rank `root`'s `buf` to every rank.
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), Error>;

    /// Gathers every rank's `input` (equal lengths) into `output`, in rank order.
    fn all_gather_i64(&self, input: &[i64], output: &mut [i64]) -> Result<(), Error>;

    /// This rank's trace file when tracing is on (`RINGCCL_TRACE`): DDP marks the
    /// trainer's backward pass and its own waits there. The default: no trace.
    fn trace_file(&self) -> Option<Arc<TraceFile>> {
        None
    }

    /// [`all_reduce_sum_async`](Self::all_reduce_sum_async) of DDP bucket `label`, which
    /// an implementation with a trace also shows on the timeline's `ddp` row. The
    /// default: the plain all-reduce.
    fn all_reduce_bucket_async(
        &self,
        buf: GradBuf,
        label: BucketLabel,
    ) -> Result<Pending<GradBuf>, Error> {
        let _ = label;
        self.all_reduce_sum_async(buf)
    }
}

/// What DDP can keep its own handle on the group from: `&C` for a communicator that is
/// cheap to clone (`&ringccl::ProcessGroup`), or an `Arc` of one.
///
/// ```
/// use std::sync::Arc;
/// use ringccl::ddp::{Communicator, ToCommunicator};
/// # fn main() -> Result<(), ringccl::Error> {
/// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// let shared: Arc<dyn Communicator> = (&pg).to_communicator(); // a clone of the handle
/// assert_eq!(Arc::clone(&shared).to_communicator().world_size(), 1);
/// # Ok(())
/// # }
/// ```
pub trait ToCommunicator {
    /// The shared handle.
    fn to_communicator(self) -> Arc<dyn Communicator>;
}

impl<C: Communicator + Clone + 'static> ToCommunicator for &C {
    fn to_communicator(self) -> Arc<dyn Communicator> {
        Arc::new(self.clone())
    }
}

impl<C: Communicator + 'static> ToCommunicator for Arc<C> {
    fn to_communicator(self) -> Arc<dyn Communicator> {
        self
    }
}

impl ToCommunicator for Arc<dyn Communicator> {
    fn to_communicator(self) -> Arc<dyn Communicator> {
        self
    }
}
