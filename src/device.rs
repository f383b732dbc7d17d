//! Collectives on GPU memory (`CudaSlice<T>`), under either backend.
//!
//! * `"nccl"`: the buffer goes to NCCL as it is, on the communicator's stream, which
//!   first waits for the work queued on the buffer's stream (PyTorch's rule; see
//!   [`StreamOrder`](ringccl_nccl::StreamOrder)); queued calls with a known producer
//!   wait for its event instead.
//! * `"gloo"`: the buffer is staged through host memory — copied to the host, run through
//!   the CPU backend, copied back — as PyTorch's gloo backend does with CUDA tensors.
//!
//! So a program written against these methods runs under both backends; only the
//! backend name passed to [`init_process_group`](crate::init_process_group) changes.

use ringccl_collectives::{validate_reduce, Backend, BufferMut, BufferRef, Deadline, ReduceOp};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ringccl_nccl::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DriverError};
use ringccl_nccl::DeviceElement;

use crate::{Error, ProcessGroup, Work};

/// The error of a failed copy while staging a GPU buffer through host memory.
fn staging_failed(rank: usize, what: &str, call: &'static str) -> impl Fn(DriverError) -> Error {
    let op = format!("{what} (staging a GPU buffer through host memory)");
    move |e| Error::Device {
        rank,
        op: op.clone(),
        call: call.to_string(),
        reason: e.to_string(),
    }
}

/// Waits on the host until the GPU has reached `event`, or `deadline` passes: a copy to
/// pageable host memory, or a stream's synchronize, would wait with no bound for
/// whatever is queued ahead (a trainer's kernel that never ends).
fn reached(
    rank: usize,
    what: &str,
    event: &CudaEvent,
    deadline: Deadline,
    waiting_for: &'static str,
) -> Result<(), Error> {
    // NCCL's poll's rhythm: yield for the first 50 us (a small copy is done by then;
    // a sleep would cost more than the copy), then naps growing to 1 ms.
    let start = Instant::now();
    let mut nap = Duration::from_micros(5);
    loop {
        match event.try_is_complete() {
            Ok(true) => return Ok(()),
            Ok(false) if deadline.has_passed() => {
                return Err(Error::Device {
                    rank,
                    op: format!("{what} (staging a GPU buffer through host memory)"),
                    call: format!("waiting for {waiting_for}"),
                    reason: format!(
                        "not done within the call's deadline ({:?}): the GPU work queued \
                         ahead of it did not finish. The group is now broken: find the \
                         kernel that does not end, or raise the group's timeout",
                        deadline.timeout()
                    ),
                })
            }
            Ok(false) if start.elapsed() < Duration::from_micros(50) => thread::yield_now(),
            Ok(false) => {
                thread::sleep(nap.min(deadline.remaining()));
                nap = (nap * 2).min(Duration::from_millis(1));
            }
            Err(e) => return Err(staging_failed(rank, what, "querying a CUDA event")(e)),
        }
    }
}

/// A host copy of `buf`, made on `on` once the GPU has reached `after` (`on` waits for it
/// too), the wait bounded by `deadline`: the copy itself then has nothing ahead of it.
fn to_host<T: DeviceElement>(
    rank: usize,
    what: &str,
    buf: &CudaSlice<T>,
    on: &Arc<CudaStream>,
    after: &CudaEvent,
    deadline: Deadline,
) -> Result<Vec<T>, Error> {
    let failed = |call: &'static str| staging_failed(rank, what, call);
    on.wait(after).map_err(failed(
        "ordering the staging copy after the buffer's producer",
    ))?;
    reached(rank, what, after, deadline, "the buffer's producer")?;
    on.clone_dtoh(buf)
        .map_err(failed("copying the buffer to the host"))
}

/// A host copy of `buf` once the work queued on its own stream is done (within
/// `deadline`).
fn on_host<T: DeviceElement>(
    rank: usize,
    what: &str,
    buf: &CudaSlice<T>,
    deadline: Deadline,
) -> Result<Vec<T>, Error> {
    let stream = buf.stream();
    let produced = stream.record_event(None).map_err(staging_failed(
        rank,
        what,
        "recording an event after the buffer's producer",
    ))?;
    to_host(rank, what, buf, stream, &produced, deadline)
}

/// Copies `host` back into `buf` on `on` and waits, within `deadline`, until the copy is
/// done. When the wait outruns the deadline (the group then breaks), cudarc still orders
/// later uses of `buf`, and its release, after the copy it recorded.
fn to_device<T: DeviceElement>(
    rank: usize,
    what: &str,
    host: &[T],
    buf: &mut CudaSlice<T>,
    on: &Arc<CudaStream>,
    deadline: Deadline,
) -> Result<(), Error> {
    let failed = |call: &'static str| staging_failed(rank, what, call);
    let copied = on
        .memcpy_htod(host, buf)
        .map_err(failed("copying the result to the GPU"));
    // Also after a failed copy: nothing may still write `buf` once this returns.
    let synced = on
        .record_event(None)
        .map_err(failed("recording an event after the copy to the GPU"))
        .and_then(|e| reached(rank, what, &e, deadline, "the copy to the GPU"));
    copied.and(synced)
}

/// Copies `buf` to the host, runs `op` on the copy and, when `copy_back`, copies the
/// result back, all on the buffer's own stream, each wait on the GPU bounded by
/// `deadline`. Stands in for a device collective on CPU backends.
fn through_host<T: DeviceElement>(
    rank: usize,
    what: &str,
    buf: &mut CudaSlice<T>,
    copy_back: bool,
    deadline: Deadline,
    op: impl FnOnce(&mut [T]) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut host = on_host(rank, what, buf, deadline)?;
    op(&mut host)?;
    if copy_back {
        let stream = Arc::clone(buf.stream());
        to_device(rank, what, &host, buf, &stream, deadline)?;
    }
    Ok(())
}

/// What a queued device call is ordered after: `event`, recorded on the stream that
/// produced the buffer; under `"gloo"`, its staging copies run on `staging` (a stream
/// kept by the caller, so that none is made per call) after that event.
pub(crate) struct After {
    pub(crate) event: CudaEvent,
    pub(crate) staging: Option<Arc<CudaStream>>,
}

/// When a queued device call's [`Work`] completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    /// When the GPU has finished the call.
    Finished,
    /// Under `"nccl"`, as soon as NCCL has the call on its stream: later work on that
    /// stream (or on a stream that waits on it) is ordered after it, and the group's
    /// worker watches it against its deadline. Under `"gloo"`, the same as `Finished`.
    Enqueued,
}

/// [`through_host`] for a call queued on the worker whose buffer's producer is known by
/// `after`, an event on the producing stream: the copies run on `staging`, a stream of
/// their own, after that event, so that the worker waits for the buffer's data and not
/// for whatever the producing stream has queued since (the rest of backward). The copy
/// back has finished when this returns `Ok`.
fn staged_after<T: DeviceElement>(
    rank: usize,
    what: &str,
    buf: &mut CudaSlice<T>,
    after: &CudaEvent,
    staging: &Arc<CudaStream>,
    deadline: Deadline,
    op: impl FnOnce(&mut [T]) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut host = to_host(rank, what, buf, staging, after, deadline)?;
    op(&mut host)?;
    to_device(rank, what, &host, buf, staging, deadline)
}

/// Runs a staged call, and breaks the group when the staging itself failed (a copy, or
/// a wait on the GPU past the deadline): this rank may have skipped the collective its
/// peers run, so no later call may pair with theirs.
fn staged<R>(backend: &dyn Backend, call: impl FnOnce() -> Result<R, Error>) -> Result<R, Error> {
    let result = call();
    if let Err(e @ Error::Device { .. }) = &result {
        backend.abort(&e.to_string());
    }
    result
}

impl ProcessGroup {
    /// Waits on the host until every device call this group handed to the GPU without
    /// waiting (the buckets of a [`DeviceDdp`](crate::DeviceDdp) step, after its
    /// `finish`) has finished, each within the deadline it was issued with. A call that
    /// failed or outran its deadline is returned as the error, and the group is broken.
    /// Under `"gloo"`, device calls finish before they return, and this returns at once.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pg = ringccl::init_process_group("nccl", ringccl::InitOptions::from_env()?)?;
    /// // ... DeviceDdp::finish() returned without waiting for the GPU ...
    /// pg.synchronize_device()?; // e.g. before saving a checkpoint
    /// # Ok(())
    /// # }
    /// ```
    pub fn synchronize_device(&self) -> Result<(), Error> {
        match &self.shared().nccl {
            Some(nccl) => {
                let nccl = Arc::clone(nccl);
                self.queue("synchronize_device", move |_, _| nccl.wait_in_flight())?
                    .wait()
            }
            None => Ok(()),
        }
    }

    /// The CUDA device this rank's NCCL communicator runs on (`None` under other
    /// backends). Device buffers handed to the `*_device` methods must live there.
    pub fn cuda_device(&self) -> Option<usize> {
        self.shared().nccl.as_ref().map(|nccl| nccl.device())
    }

    /// The stream NCCL runs this group's calls on (`None` under other backends).
    pub(crate) fn nccl_stream(&self) -> Option<Arc<CudaStream>> {
        self.shared()
            .nccl
            .as_ref()
            .map(|nccl| Arc::clone(nccl.stream()))
    }

    /// A device collective under a CPU backend, in its turn on the group: `buf` is
    /// staged through the host ([`through_host`]) around `op`, which runs the collective
    /// on the host copy, and a failed staging breaks the group ([`staged`]).
    fn staged_in_order<T: DeviceElement>(
        &self,
        what: &'static str,
        buf: &mut CudaSlice<T>,
        copy_back: bool,
        op: impl FnOnce(&dyn Backend, &mut [T], Deadline) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let rank = self.rank();
        self.in_order(what, |backend, d| {
            staged(backend, || {
                through_host(rank, what, buf, copy_back, d, |host| op(backend, host, d))
            })
        })
    }

    /// Like [`ProcessGroup::all_reduce`], on a buffer in GPU memory. Under `"nccl"` the
    /// buffer is reduced in place on the GPU (it must be on the group's device, see
    /// [`InitOptions::device`](crate::InitOptions::device)); under `"gloo"` it is staged
    /// through host memory.
    ///
    /// ```no_run
    /// use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = std::env::var("BACKEND").unwrap_or("nccl".into()); // or "gloo"
    /// let opts = ringccl::InitOptions::from_env()?;
    /// let local_rank = opts.local_rank.unwrap_or(0);
    /// let pg = ringccl::init_process_group(&backend, opts)?;
    /// let stream = CudaContext::new(local_rank)?.default_stream();
    /// let mut grads = stream.clone_htod(&[1.0f32; 1024])?;
    /// pg.all_reduce_device(&mut grads, ringccl::ReduceOp::Avg)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn all_reduce_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        match &self.shared().nccl {
            Some(nccl) => self.in_order("all_reduce", |_, d| nccl.all_reduce_device(buf, op, d)),
            None => {
                validate_reduce(T::DTYPE, op)?;
                self.staged_in_order("all_reduce", buf, true, |backend, host, d| {
                    Ok(backend.all_reduce(BufferMut::from_slice(host), op, d)?)
                })
            }
        }
    }

    /// [`ProcessGroup::all_reduce_device`] without a wait on the host, as PyTorch's
    /// NCCL collectives run: under `"nccl"` it returns once NCCL has the call on its
    /// stream. The reduction runs after the work queued on `buf`'s stream, and work
    /// queued on that stream afterwards runs after the reduction, so a kernel launched
    /// on `buf` next sees the result without a host wait.
    ///
    /// The call keeps the deadline it was issued with: the group's worker thread watches
    /// it, and one that fails or outruns it aborts the communicator (releasing any
    /// stream that waits on it) and the group; this rank's next call returns the error,
    /// naming the op. [`ProcessGroup::synchronize_device`] waits for it on the host, and
    /// so does any call that waits on the host (a host-buffer collective) before it
    /// starts. Under `"gloo"` it is [`ProcessGroup::all_reduce_device`]: staged through
    /// the host, finished when it returns.
    ///
    /// ```no_run
    /// use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pg = ringccl::init_process_group("nccl", ringccl::InitOptions::from_env()?)?;
    /// let stream = CudaContext::new(pg.cuda_device().unwrap_or(0))?.new_stream()?;
    /// let mut grads = stream.clone_htod(&[1.0f32; 1024])?;
    /// for _ in 0..10 {
    ///     pg.all_reduce_device_enqueued(&mut grads, ringccl::ReduceOp::Sum)?; // no host wait
    /// }
    /// pg.synchronize_device()?; // the ten have finished, or this says which did not
    /// # Ok(())
    /// # }
    /// ```
    pub fn all_reduce_device_enqueued<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        match &self.shared().nccl {
            Some(nccl) => {
                self.in_order("all_reduce", |_, d| {
                    nccl.all_reduce_device_enqueued(buf, op, d)
                })?;
                // The call is on its way: a worker that cannot start is reported, and the
                // next call that waits on the host settles the call instead.
                if let Err(e) = self.watch_in_flight() {
                    tracing::warn!(rank = self.rank(), error = %e, "no watch over the enqueued all_reduce");
                }
                Ok(())
            }
            None => self.all_reduce_device(buf, op),
        }
    }

    /// Like [`ProcessGroup::broadcast`], on a buffer in GPU memory (see
    /// [`ProcessGroup::all_reduce_device`] for how each backend handles it).
    pub fn broadcast_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<(), Error> {
        match &self.shared().nccl {
            Some(nccl) => self.in_order("broadcast", |_, d| nccl.broadcast_device(buf, root, d)),
            None => {
                let copy_back = self.rank() != root;
                self.staged_in_order("broadcast", buf, copy_back, |backend, host, d| {
                    Ok(backend.broadcast(BufferMut::from_slice(host), root, d)?)
                })
            }
        }
    }

    /// Like [`ProcessGroup::reduce`], on a buffer in GPU memory.
    pub fn reduce_device<T: DeviceElement>(
        &self,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), Error> {
        match &self.shared().nccl {
            Some(nccl) => self.in_order("reduce", |_, d| nccl.reduce_device(buf, op, root, d)),
            None => {
                let copy_back = self.rank() == root;
                self.staged_in_order("reduce", buf, copy_back, |backend, host, d| {
                    Ok(backend.reduce(BufferMut::from_slice(host), op, root, d)?)
                })
            }
        }
    }

    /// Like [`ProcessGroup::all_gather`], on buffers in GPU memory.
    pub fn all_gather_device<T: DeviceElement>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
    ) -> Result<(), Error> {
        match &self.shared().nccl {
            Some(nccl) => self.in_order("all_gather", |_, d| {
                nccl.all_gather_device(input, output, d)
            }),
            None => {
                let rank = self.rank();
                self.staged_in_order("all_gather", output, true, |backend, host, d| {
                    let host_input = on_host(rank, "all_gather", input, d)?;
                    let input = BufferRef::from_slice(&host_input);
                    Ok(backend.all_gather(input, BufferMut::from_slice(host), d)?)
                })
            }
        }
    }

    /// Like [`ProcessGroup::reduce_scatter`], on buffers in GPU memory.
    pub fn reduce_scatter_device<T: DeviceElement>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<(), Error> {
        match &self.shared().nccl {
            Some(nccl) => self.in_order("reduce_scatter", |_, d| {
                nccl.reduce_scatter_device(input, output, op, d)
            }),
            None => {
                let rank = self.rank();
                self.staged_in_order("reduce_scatter", output, true, |backend, host, d| {
                    let host_input = on_host(rank, "reduce_scatter", input, d)?;
                    let input = BufferRef::from_slice(&host_input);
                    let output = BufferMut::from_slice(host);
                    Ok(backend.reduce_scatter(input, output, op, d)?)
                })
            }
        }
    }

    /// Starts an all-reduce of a GPU buffer in the background, like
    /// [`ProcessGroup::all_reduce_async`]: the buffer moves into the [`Work`] and comes
    /// back from [`Work::wait`]. Under `"nccl"` the reduction runs on the communicator's
    /// stream and the group's worker thread waits on a CUDA event for it (with the
    /// group's deadline); under `"gloo"` the worker stages it through host memory.
    ///
    /// ```no_run
    /// use ringccl::cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pg = ringccl::init_process_group("nccl", ringccl::InitOptions::from_env()?)?;
    /// let stream = CudaContext::new(pg.cuda_device().unwrap_or(0))?.new_stream()?;
    /// let grads = stream.clone_htod(&[1.0f32; 1024])?;
    /// let work = pg.all_reduce_device_async(grads, ringccl::ReduceOp::Sum)?;
    /// // ... more work on the stream ...
    /// let grads = work.wait()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn all_reduce_device_async<T: DeviceElement>(
        &self,
        buf: CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<Work<CudaSlice<T>>, Error> {
        self.all_reduce_device_async_after(buf, op, None, Completion::Finished)
    }

    /// [`ProcessGroup::all_reduce_device_async`] ordered after `after`, an event on the
    /// stream that produced the buffer: under `"nccl"` NCCL's stream waits on it just
    /// before the call is enqueued (on the worker thread), so a call queued behind others
    /// is not held back by work queued after its event; without `after`, the event is
    /// recorded on the buffer's stream now, on the calling thread. Under `"gloo"`, with a
    /// staging stream in `after`, the staging copies run there after the event (see
    /// [`staged_after`]); without, on the buffer's own stream when the worker gets to the
    /// call. `completion` says when the `Work` completes. A failed staging breaks the
    /// group (see [`staged`]).
    pub(crate) fn all_reduce_device_async_after<T: DeviceElement>(
        &self,
        mut buf: CudaSlice<T>,
        op: ReduceOp,
        after: Option<After>,
        completion: Completion,
    ) -> Result<Work<CudaSlice<T>>, Error> {
        validate_reduce(T::DTYPE, op)?;
        let rank = self.rank();
        match &self.shared().nccl {
            Some(nccl) => {
                let nccl = nccl.clone();
                // The call is ordered after the work on the buffer's stream when it is
                // issued, here, not when the worker gets to it (work queued since is not
                // the call's to wait for).
                let event = match after {
                    Some(After { event, .. }) => event,
                    None => buf.stream().record_event(None).map_err(|e| Error::Device {
                        rank,
                        op: "all_reduce (a device buffer)".into(),
                        call: "recording an event after the buffer's producer".into(),
                        reason: e.to_string(),
                    })?,
                };
                self.queue("all_reduce", move |_, d| {
                    nccl.all_reduce_device_enqueued_after(&mut buf, op, &event, d)?;
                    match completion {
                        Completion::Finished => nccl.wait_in_flight(),
                        Completion::Enqueued => Ok(()),
                    }
                    .map(|()| buf)
                })
            }
            None => self.queue("all_reduce", move |backend, d| {
                let reduce = |host: &mut [T]| -> Result<(), Error> {
                    Ok(backend.all_reduce(BufferMut::from_slice(host), op, d)?)
                };
                staged(backend, || match &after {
                    Some(After {
                        event,
                        staging: Some(staging),
                    }) => staged_after(rank, "all_reduce", &mut buf, event, staging, d, reduce),
                    _ => through_host(rank, "all_reduce", &mut buf, true, d, reduce),
                })
                .map(|()| buf)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs_device_element<T: DeviceElement>() {}

    #[test]
    fn every_element_type_can_live_on_the_device() {
        needs_device_element::<f32>();
        needs_device_element::<f64>();
        needs_device_element::<half::f16>();
        needs_device_element::<half::bf16>();
        needs_device_element::<i32>();
        needs_device_element::<i64>();
        needs_device_element::<u8>();
        needs_device_element::<i8>();
    }
}
