//! The `"nccl"` backend's public face: start-up, the device it runs on, and collectives
//! on device buffers (`CudaSlice`), which go to NCCL without staging.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use ringccl_collectives::{
    validate_blocks, validate_reduce, validate_root, Backend, CollectiveKind, Deadline, Element,
    Error, GroupRunner, OpDesc, ReduceOp, Sequence,
};

use super::engine::NcclEngine;
use super::ffi::{Call, DeviceRegion};
use super::poller::Involved;
use ringccl_rendezvous::KeptStore;

use crate::{DeviceError, NcclConfig, StreamOrder};

/// Element types NCCL and CUDA memory both handle: all eight [`Element`] types.
pub trait DeviceElement: Element + DeviceRepr + ValidAsZeroBits {}

impl<T: Element + DeviceRepr + ValidAsZeroBits> DeviceElement for T {}

/// One rank's NCCL communicator.
///
/// * Host buffers go through [`NcclBackend::group`], the same [`Backend`] interface as
///   the CPU backend: staged through device memory, reduced there by NCCL, copied back.
/// * Device buffers (`CudaSlice<T>`, the `*_device` methods) go to NCCL directly.
///
/// Both run through one [`GroupRunner`]: one sequence of numbered calls, one broken
/// state. NCCL has no deadline of its own. The communicator is non-blocking; every call
/// is polled (`ncclCommGetAsyncError` and a CUDA event) until it finishes, its deadline
/// passes, or a peer's process is seen gone (a TCP connection to every peer is kept as a
/// liveness channel). In the last two cases the communicator is aborted and the call
/// returns [`DeviceError::Timeout`] (inside [`Error::Engine`]) or [`Error::PeerLost`]; later calls return
/// [`Error::GroupBroken`]. Dropping the last handle shuts NCCL down in an orderly way
/// (or aborts it) and never panics.
///
/// NCCL does not check that ranks issue the same collectives; a mismatch ends in the
/// deadline. Point-to-point tags are not carried by NCCL: messages between two ranks
/// match in order, and the tag is not checked.
pub struct NcclBackend {
    pub(super) group: Arc<GroupRunner<NcclEngine>>,
    pub(super) device: usize,
    pub(super) stream: Arc<CudaStream>,
    /// The rendezvous store, kept for the life of the group.
    pub(super) _store: KeptStore,
}

impl NcclBackend {
    /// Checks that libcuda and libnccl load and that a CUDA device is visible, without
    /// touching the network. Returns the number of devices, or the error
    /// `init_process_group("nccl", ..)` would return, which says what to install or set.
    pub fn probe() -> Result<usize, DeviceError> {
        super::probe::probe()
    }

    /// Joins the group described by `config` (the same rendezvous as the CPU backend).
    /// Rank 0 makes the NCCL unique id and shares it through the rendezvous store; every
    /// rank then opens its communicator on device `config.device`, or
    /// `(local rank or rank) % device_count`.
    pub fn connect(config: NcclConfig) -> Result<NcclBackend, DeviceError> {
        super::startup::connect(config)
    }

    /// The host-buffer collectives, as a [`Backend`] sharing this communicator.
    pub fn group(&self) -> Arc<dyn Backend> {
        self.group.clone()
    }

    /// The CUDA device this rank's communicator runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The stream NCCL work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn check_device<T>(&self, what: &str, slice: &CudaSlice<T>) -> Result<(), Error> {
        if slice.ordinal() != self.device {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {what}: the buffer is on cuda:{} but this rank's NCCL communicator \
                 is on cuda:{}; allocate it on the communicator's device (see \
                 InitOptions::device)",
                self.group.rank(),
                slice.ordinal(),
                self.device
            )));
        }
        Ok(())
    }

    /// Runs one device collective, numbered among the group's collectives.
    fn run(
        &self,
        describe: impl FnOnce(u64) -> OpDesc,
        deadline: Deadline,
        launch: impl FnOnce(&super::poller::Cx<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.group
            .run(Sequence::Collective, deadline, |engine, seq| {
                let op = describe(seq);
                engine.running(&op, deadline, |engine| {
                    engine.with_cx(&op, Involved::All, deadline, |cx, _| launch(cx))
                })
            })
    }

    /// All-reduces a device buffer in place, stream-ordered: returns once NCCL has the
    /// call on its stream ([`NcclBackend::stream`]), without waiting for the GPU, as
    /// PyTorch's NCCL calls do. The call runs after everything queued on `buf`'s stream,
    /// and work queued on that stream afterwards (or on NCCL's, or on a stream that waits
    /// on either) runs after it ([`StreamOrder::BufferStreams`]).
    ///
    /// The call keeps the deadline it was issued with: the group watches it (see
    /// [`NcclBackend::watch_in_flight`]) and, past the deadline, aborts the communicator
    /// so nothing waits on it forever; this rank's next call then returns the error,
    /// naming the op. [`NcclBackend::wait_in_flight`] waits for it on the host.
    ///
    /// ```no_run
    /// # use ringccl_nccl::{NcclBackend, NcclConfig};
    /// # use ringccl_collectives::{Deadline, ReduceOp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use ringccl_rendezvous::MeshConfig;
    /// # let mesh = MeshConfig::new(0, 1, "127.0.0.1:0", std::time::Duration::from_secs(60));
    /// # let nccl = NcclBackend::connect(NcclConfig::new(mesh))?;
    /// let mut grads = nccl.stream().clone_htod(&[1.0f32; 1024])?;
    /// let deadline = Deadline::after(std::time::Duration::from_secs(60));
    /// nccl.all_reduce_device_enqueued(&mut grads, ReduceOp::Sum, deadline)?;
    /// // ... more work on the stream, ordered after the reduction ...
    /// nccl.wait_in_flight()?; // the host waits, when it must
    /// # Ok(())
    /// # }
    /// ```
    pub fn all_reduce_device_enqueued<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.all_reduce_in_place(buf, op, deadline, StreamOrder::BufferStreams, true)
    }

    /// [`NcclBackend::all_reduce_device_enqueued`] ordered after `after` only, an event
    /// recorded where `buf`'s data was ready ([`StreamOrder::After`]): work queued on
    /// `buf`'s stream since does not hold the call back, and nothing waits for the call
    /// but what waits on [`NcclBackend::stream`], which the caller joins before it reads
    /// `buf` again. DDP's buckets go this way while backward goes on.
    ///
    /// ```no_run
    /// # use ringccl_nccl::{NcclBackend, NcclConfig};
    /// # use ringccl_collectives::{Deadline, ReduceOp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use ringccl_rendezvous::MeshConfig;
    /// # let mesh = MeshConfig::new(0, 1, "127.0.0.1:0", std::time::Duration::from_secs(60));
    /// # let nccl = NcclBackend::connect(NcclConfig::new(mesh))?;
    /// let trainer = nccl.stream().context().new_stream()?;
    /// let mut grads = trainer.clone_htod(&[1.0f32; 1024])?;
    /// let ready = trainer.record_event(None)?;
    /// // ... the trainer's stream goes on with other work ...
    /// let deadline = Deadline::after(std::time::Duration::from_secs(60));
    /// nccl.all_reduce_device_enqueued_after(&mut grads, ReduceOp::Sum, &ready, deadline)?;
    /// trainer.join(nccl.stream())?; // before the trainer reads `grads` again
    /// # Ok(())
    /// # }
    /// ```
    pub fn all_reduce_device_enqueued_after<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        after: &CudaEvent,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.all_reduce_in_place(buf, op, deadline, StreamOrder::After(after), true)
    }

    /// One look at the stream-ordered calls in flight: settles those the GPU has
    /// finished (and whose fingerprints agreed), and breaks the group when one is past
    /// its deadline, NCCL reports an error, or a peer is gone; the error then goes to
    /// this rank's next call. Returns when to look again, `None` when nothing is in
    /// flight (or the group is broken). The group's background worker calls it while
    /// idle; it never blocks on the GPU.
    ///
    /// ```no_run
    /// # use ringccl_nccl::{NcclBackend, NcclConfig};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use ringccl_rendezvous::MeshConfig;
    /// # let mesh = MeshConfig::new(0, 1, "127.0.0.1:0", std::time::Duration::from_secs(60));
    /// # let nccl = NcclBackend::connect(NcclConfig::new(mesh))?;
    /// while let Some(again) = nccl.watch_in_flight() {
    ///     std::thread::sleep(again.saturating_duration_since(std::time::Instant::now()));
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn watch_in_flight(&self) -> Option<Instant> {
        self.group
            .tend_unattended(|engine| engine.watch(Instant::now()))
            .flatten()
    }

    /// Waits on the host until every stream-ordered call in flight has finished on the
    /// GPU (and agreed with the predecessor's fingerprint), each within its own deadline;
    /// the error of the first that fails breaks the group.
    ///
    /// ```no_run
    /// # use ringccl_nccl::{NcclBackend, NcclConfig};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use ringccl_rendezvous::MeshConfig;
    /// # let mesh = MeshConfig::new(0, 1, "127.0.0.1:0", std::time::Duration::from_secs(60));
    /// # let nccl = NcclBackend::connect(NcclConfig::new(mesh))?;
    /// nccl.wait_in_flight()?; // nothing in flight: returns at once
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_in_flight(&self) -> Result<(), Error> {
        self.group.tend(NcclEngine::wait_in_flight)
    }

    /// All-reduces a device buffer in place; see [`Backend::all_reduce`].
    pub fn all_reduce_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.all_reduce_in_place(buf, op, deadline, StreamOrder::BufferStreams, false)
    }

    /// The two all-reduces of a device buffer: waited for on the host, or
    /// `stream_ordered` (handed to the GPU and watched).
    fn all_reduce_in_place<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        deadline: Deadline,
        order: StreamOrder<'_>,
        stream_ordered: bool,
    ) -> Result<(), Error> {
        validate_reduce(T::DTYPE, op)?;
        self.check_device("all_reduce", buf)?;
        let count = buf.len();
        self.group
            .run(Sequence::Collective, deadline, |engine, seq| {
                let desc = OpDesc::all_reduce(seq, T::DTYPE, count, op);
                let mut enqueue = |engine: &mut NcclEngine, wait: bool| {
                    engine.with_cx(&desc, Involved::All, deadline, |cx, _| {
                        let buf_stream = Arc::clone(buf.stream());
                        let region = DeviceRegion::writing(buf, cx.stream);
                        let calls = [Call::AllReduce {
                            buf: &region,
                            count,
                            dtype: T::DTYPE,
                            op,
                        }];
                        let streams = [&*buf_stream];
                        if wait {
                            cx.launch_ordered(&calls, order, &streams).map(|()| None)
                        } else {
                            cx.enqueue_ordered(&calls, order, &streams)
                        }
                    })
                };
                if stream_ordered {
                    engine.running_enqueued(&desc, deadline, |e| enqueue(e, false))
                } else {
                    engine.running(&desc, deadline, |e| enqueue(e, true).map(drop))
                }
            })
    }

    /// Broadcasts a device buffer from `root`; see [`Backend::broadcast`].
    pub fn broadcast_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        root: usize,
        deadline: Deadline,
    ) -> Result<(), Error> {
        validate_root(root, self.group.world_size())?;
        self.check_device("broadcast", buf)?;
        let count = buf.len();
        self.run(
            |seq| OpDesc::broadcast(seq, T::DTYPE, count, root),
            deadline,
            |cx| {
                let buf_stream = Arc::clone(buf.stream());
                let region = DeviceRegion::writing(buf, cx.stream);
                let call = Call::Broadcast {
                    buf: &region,
                    count,
                    dtype: T::DTYPE,
                    root,
                };
                cx.launch_ordered(&[call], StreamOrder::BufferStreams, &[&*buf_stream])
            },
        )
    }

    /// Reduces a device buffer into `root`'s; see [`Backend::reduce`].
    pub fn reduce_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
        deadline: Deadline,
    ) -> Result<(), Error> {
        validate_root(root, self.group.world_size())?;
        validate_reduce(T::DTYPE, op)?;
        self.check_device("reduce", buf)?;
        let count = buf.len();
        self.run(
            |seq| {
                OpDesc::new(
                    seq,
                    CollectiveKind::Reduce,
                    T::DTYPE,
                    count,
                    Some(op),
                    Some(root),
                )
            },
            deadline,
            |cx| {
                let buf_stream = Arc::clone(buf.stream());
                let region = DeviceRegion::writing(buf, cx.stream);
                let call = Call::Reduce {
                    buf: &region,
                    count,
                    dtype: T::DTYPE,
                    op,
                    root,
                };
                cx.launch_ordered(&[call], StreamOrder::BufferStreams, &[&*buf_stream])
            },
        )
    }

    /// All-gathers device buffers; see [`Backend::all_gather`].
    pub fn all_gather_device<T: DeviceElement>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let (n, m) = (input.len(), output.len());
        validate_blocks(
            "all_gather",
            T::DTYPE,
            T::DTYPE,
            n,
            m,
            self.group.world_size(),
        )?;
        self.check_device("all_gather", input)?;
        self.check_device("all_gather", output)?;
        self.run(
            |seq| OpDesc::new(seq, CollectiveKind::AllGather, T::DTYPE, m, None, None),
            deadline,
            |cx| {
                let streams = (Arc::clone(input.stream()), Arc::clone(output.stream()));
                let (input, output) = (
                    DeviceRegion::reading(input, cx.stream),
                    DeviceRegion::writing(output, cx.stream),
                );
                let call = Call::AllGather {
                    input: &input,
                    output: &output,
                    count: n,
                    dtype: T::DTYPE,
                };
                let buffers = [&*streams.0, &*streams.1];
                cx.launch_ordered(&[call], StreamOrder::BufferStreams, &buffers)
            },
        )
    }

    /// Reduce-scatters device buffers; see [`Backend::reduce_scatter`].
    pub fn reduce_scatter_device<T: DeviceElement>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let (n, m) = (input.len(), output.len());
        validate_blocks(
            "reduce_scatter",
            T::DTYPE,
            T::DTYPE,
            m,
            n,
            self.group.world_size(),
        )?;
        validate_reduce(T::DTYPE, op)?;
        self.check_device("reduce_scatter", input)?;
        self.check_device("reduce_scatter", output)?;
        self.run(
            |seq| {
                OpDesc::new(
                    seq,
                    CollectiveKind::ReduceScatter,
                    T::DTYPE,
                    n,
                    Some(op),
                    None,
                )
            },
            deadline,
            |cx| {
                let streams = (Arc::clone(input.stream()), Arc::clone(output.stream()));
                let (input, output) = (
                    DeviceRegion::reading(input, cx.stream),
                    DeviceRegion::writing(output, cx.stream),
                );
                let call = Call::ReduceScatter {
                    input: &input,
                    output: &output,
                    count: m,
                    dtype: T::DTYPE,
                    op,
                };
                let buffers = [&*streams.0, &*streams.1];
                cx.launch_ordered(&[call], StreamOrder::BufferStreams, &buffers)
            },
        )
    }
}

impl fmt::Debug for NcclBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclBackend")
            .field("group", &self.group)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}
