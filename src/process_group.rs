//! The typed, user-facing handle on a group of ranks, and the issue order every one of
//! its operations runs in: blocking ones on the calling thread, `*_async` ones on the
//! background worker. The collectives themselves are in `collectives.rs`,
//! `async_ops.rs`, `fusion.rs` and `device.rs`.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringccl_collectives::control::GroupControl;
use ringccl_collectives::{Backend, BackendEngine, Deadline};
use ringccl_observe::flight::FlightRecorder;
use ringccl_observe::timeline::TraceHold;
use ringccl_observe::Observers;
use ringccl_rendezvous::KeptStore;

use crate::fusion_pool::FusionPool;
use crate::origin::{GlooRecipe, Origin};
use crate::sequencer::Sequencer;
use crate::work::{Queued, Work};
use crate::worker::{IdleWatch, Job, RunOnBackend, Worker};
use crate::Error;

/// One rank's handle on a group of processes that run collectives together.
///
/// `Send + Sync`: it can be moved or shared between threads, but calls are issued by
/// one thread at a time. Every operation — blocking or `*_async` — runs in the order it
/// was issued on this rank, one at a time. Every collective must be issued by all ranks
/// in the same order with matching arguments; a rank that disagrees gets
/// [`Error::CollectiveMismatch`] instead of a hang.
///
/// A thread may issue a call while calls it issued itself are pending, and may take over
/// from another thread once that thread's calls have finished. A call issued while
/// another thread's calls are still pending (queued or running) fails with
/// [`Error::ConcurrentUse`] and aborts the group: the other ranks could have paired the
/// two threads' calls the other way round. Give each thread its own group instead:
/// [`ProcessGroup::new_group`] and [`ProcessGroup::split`] form them from this one.
///
/// Cloning is cheap (a reference count) and gives another handle on the same group —
/// same rank, same issue order — so a trainer can keep one next to the objects that use
/// it, such as a `DistributedDataParallel`. The group ends when the last handle is dropped.
///
/// ```
/// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// let handle = pg.clone();
/// handle.barrier()?;
/// assert_eq!(handle.rank(), pg.rank());
/// # Ok::<(), ringccl::Error>(())
/// ```
#[derive(Clone)]
pub struct ProcessGroup {
    shared: Arc<Shared>,
}

/// What every handle on one group shares.
pub(crate) struct Shared {
    backend: Arc<dyn Backend>,
    /// The same backend as `backend` when it is NCCL, for the device-buffer methods.
    #[cfg(feature = "nccl")]
    pub(crate) nccl: Option<Arc<ringccl_nccl::NcclBackend>>,
    sequencer: Arc<Sequencer>,
    /// The group's flight recorder, when it keeps one.
    flight: Option<Arc<FlightRecorder>>,
    worker: Mutex<Option<Worker>>,
    pub(crate) fusion_buffers: FusionPool,
    /// How the group was made, and its rendezvous store, kept for the life of the group
    /// (dropped after the backend) to form sub-groups through.
    pub(crate) origin: Option<Origin>,
    /// This rank's trace file, kept open while the group lives; dropped last, so that
    /// dropping the group finishes the file (see [`ProcessGroup::trace_file`]).
    pub(crate) trace: Option<TraceHold>,
    /// How this rank reaches each rank, when the start-up said (see
    /// [`ProcessGroup::peer_transport`]).
    peer_transports: Vec<&'static str>,
}

impl ProcessGroup {
    /// Wraps any backend implementation. A backend that does not run through a
    /// [`GroupRunner`](ringccl_collectives::GroupRunner) (one of the caller's own) is
    /// run through one ([`BackendEngine`]): its calls are numbered and checked, and once
    /// the group is aborted every later call fails, as under `"gloo"` and `"nccl"`.
    pub fn from_backend(backend: Box<dyn Backend>) -> ProcessGroup {
        ProcessGroup::around(Arc::from(backend), None)
    }

    /// Wraps `backend`, which `observers` watch (their flight recorder, if any, is the
    /// group's).
    pub(crate) fn observed(backend: Box<dyn Backend>, observers: &Observers) -> ProcessGroup {
        ProcessGroup::around(Arc::from(backend), observers.recorder().cloned())
    }

    /// A group over NCCL, whose device-buffer methods go straight to it.
    #[cfg(feature = "nccl")]
    pub(crate) fn from_nccl(
        nccl: Arc<ringccl_nccl::NcclBackend>,
        observers: &Observers,
    ) -> ProcessGroup {
        ProcessGroup::around(nccl.group(), observers.recorder().cloned())
            .configure("nccl", |shared| shared.nccl = Some(nccl))
    }

    fn around(backend: Arc<dyn Backend>, flight: Option<Arc<FlightRecorder>>) -> ProcessGroup {
        let (backend, control) = run_through_a_runner(backend);
        let shared = Shared {
            sequencer: Arc::new(Sequencer::new(control, flight.clone())),
            flight,
            backend,
            #[cfg(feature = "nccl")]
            nccl: None,
            worker: Mutex::new(None),
            fusion_buffers: FusionPool::default(),
            origin: None,
            trace: None,
            peer_transports: Vec::new(),
        };
        ProcessGroup {
            shared: Arc::new(shared),
        }
    }

    /// How long dropping the group waits for its worker thread: under NCCL, long enough
    /// for the communicator's orderly shutdown (finalize, then abort), so that it ends
    /// before the process can exit; other backends need not wait.
    fn worker_exit_wait(&self) -> Option<std::time::Duration> {
        #[cfg(feature = "nccl")]
        if self.shared.nccl.is_some() {
            return Some(ringccl_nccl::TEARDOWN_LIMIT + std::time::Duration::from_secs(2));
        }
        None
    }

    /// The slot of the group's background worker.
    fn worker(&self) -> Result<std::sync::MutexGuard<'_, Option<Worker>>, Error> {
        self.shared.worker.lock().map_err(|_| Error::GroupBroken {
            rank: self.rank(),
            cause: "a thread panicked while queueing an operation".into(),
        })
    }

    /// The group's background worker, started on first use.
    fn started<'a>(&self, slot: &'a mut Option<Worker>) -> Result<&'a Worker, Error> {
        Ok(match slot {
            Some(worker) => worker,
            empty => empty.insert(Worker::start(
                Arc::clone(&self.shared.backend),
                Arc::clone(&self.shared.sequencer),
                self.worker_exit_wait(),
                self.idle_watch(),
            )?),
        })
    }

    /// Has the background worker (started if need be) watch the work this group handed
    /// to the GPU without waiting.
    #[cfg(feature = "nccl")]
    pub(crate) fn watch_in_flight(&self) -> Result<(), Error> {
        let mut slot = self.worker()?;
        self.started(&mut slot)?.nudge();
        Ok(())
    }

    /// What the worker does between operations: under NCCL, it watches the
    /// stream-ordered calls in flight against their deadlines (PyTorch's watchdog, with
    /// the deadline each call was issued with).
    fn idle_watch(&self) -> Option<IdleWatch> {
        #[cfg(feature = "nccl")]
        if let Some(nccl) = &self.shared.nccl {
            let nccl = Arc::clone(nccl);
            return Some(Box::new(move || nccl.watch_in_flight()));
        }
        None
    }

    /// What every handle on this group shares.
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Sets up a group that has just been made, before any other handle on it exists.
    fn configure(mut self, setting: &str, set: impl FnOnce(&mut Shared)) -> ProcessGroup {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => set(shared),
            None => tracing::error!(
                setting,
                "internal: a process group was configured after being shared; setting ignored"
            ),
        }
        self
    }

    /// Records how this rank reaches each rank (`"self"`, `"shm"`, `"tcp"`, `"memory"`),
    /// by rank.
    pub(crate) fn reaching_peers_by(self, transports: Vec<&'static str>) -> ProcessGroup {
        self.configure("peer transports", |shared| {
            shared.peer_transports = transports
        })
    }

    /// Under [`InitOptions::issue_from_any_thread`](crate::InitOptions::issue_from_any_thread),
    /// orders calls from any thread by issue.
    pub(crate) fn issuing_from_any_thread(self, any_thread: bool) -> ProcessGroup {
        if any_thread {
            self.shared.sequencer.accept_any_thread();
        }
        self
    }

    /// Keeps this rank's trace file open for the life of the group.
    pub(crate) fn holding_trace(self, trace: Option<TraceHold>) -> ProcessGroup {
        self.configure("trace", |shared| shared.trace = trace)
    }

    /// Keeps the rendezvous store alive as long as the group, with the recipe the group
    /// was made with, for the groups formed from it.
    pub(crate) fn keeping_store(self, store: KeptStore, recipe: Arc<GlooRecipe>) -> ProcessGroup {
        // A process claiming one of the ranks now is refused, and fails alone unless
        // the group stops too: rank 0, which hosts the store, aborts it, naming both.
        let backend = Arc::downgrade(&self.shared.backend);
        store.on_duplicate_rank(move |duplicate| {
            if let Some(backend) = backend.upgrade() {
                backend.abort(&format!(
                    "{duplicate} (the second process started while the group was running; \
                     stop the stray process before restarting the job)"
                ));
            }
        });
        let origin = Origin {
            store,
            recipe,
            formed: AtomicU64::new(0),
        };
        self.configure("store", |shared| shared.origin = Some(origin))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.shared.backend.rank()
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.shared.backend.world_size()
    }

    /// The backend's name (`"gloo"` or `"nccl"`).
    pub fn backend(&self) -> &str {
        self.shared.backend.name()
    }

    /// How this rank reaches rank `peer`: under `"gloo"`, `"self"` for this rank,
    /// `"shm"` for a rank it shares memory with (same host, set up and probed at
    /// start-up), `"tcp"` for the others (another host, or a pair whose shared memory
    /// could not be set up; the start-up log says why), and `"memory"` for a rank of the
    /// same [`local_groups`](crate::local_groups). Under `"nccl"`, `"nccl"`; for a
    /// group over a backend of the caller's own, `"custom"`. `"none"` for a rank outside
    /// the group.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), ringccl::Error> {
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::from_env()?)?;
    /// for peer in 0..pg.world_size() {
    ///     println!("rank {peer}: {}", pg.peer_transport(peer));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn peer_transport(&self, peer: usize) -> &'static str {
        if peer >= self.world_size() {
            return "none";
        }
        if let Some(&transport) = self.shared.peer_transports.get(peer) {
            return transport;
        }
        if peer == self.rank() {
            return "self";
        }
        match self.shared.backend.name() {
            "nccl" => "nccl",
            "gloo" => "tcp",
            _ => "custom",
        }
    }

    /// The group's flight recorder (for groups started by `init_process_group`): its
    /// last calls, which it dumps to `RINGCCL_FLIGHT_DIR` when the group breaks, when a
    /// call times out and on `SIGUSR1`; or on demand, as here.
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// pg.barrier()?;
    /// let dump = pg.flight_recorder().expect("gloo keeps one").snapshot("requested");
    /// assert_eq!(dump.entries[0].description, "barrier");
    /// assert_eq!(dump.entries[0].state, ringccl::flight::CallState::Done);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn flight_recorder(&self) -> Option<Arc<FlightRecorder>> {
        self.shared.flight.clone()
    }

    /// The type-erased backend underneath. Calls made on it directly bypass the group's
    /// issue order; prefer the methods of `ProcessGroup`.
    pub fn as_backend(&self) -> &dyn Backend {
        &*self.shared.backend
    }

    /// Runs an operation of the caller's own on the calling thread, in the group's issue
    /// order: once every operation issued before it has finished, with the group's
    /// deadline counted from now, recorded in the flight recorder as `name`. `op` gets
    /// the backend and the deadline, which it must pass on. For collectives over buffers
    /// the typed methods cannot describe (memory of a tensor library, say).
    ///
    /// ```
    /// use ringccl::{BufferMut, ReduceOp};
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut bytes = 3.0f64.to_ne_bytes();
    /// pg.run("all_reduce", |backend, deadline| {
    ///     let buf = BufferMut::from_bytes(&mut bytes, ringccl::DType::F64)?;
    ///     backend.all_reduce(buf, ReduceOp::Sum, deadline)
    /// })?;
    /// assert_eq!(f64::from_ne_bytes(bytes), 3.0);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn run<R>(
        &self,
        name: &'static str,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<R, crate::RuntimeError>,
    ) -> Result<R, Error> {
        self.in_order(name, op)
    }

    /// [`ProcessGroup::run`] on the group's background worker: queued behind every
    /// operation issued before it, and returns at once. `op` owns what it works on,
    /// and hands it back through the [`Work`].
    ///
    /// ```
    /// use ringccl::{BufferMut, ReduceOp};
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut bytes = 3.0f64.to_ne_bytes().to_vec();
    /// let work = pg.run_async("all_reduce", move |backend, deadline| {
    ///     let buf = BufferMut::from_bytes(&mut bytes, ringccl::DType::F64)?;
    ///     backend.all_reduce(buf, ReduceOp::Max, deadline)?;
    ///     Ok(bytes)
    /// })?;
    /// assert_eq!(work.wait()?, 3.0f64.to_ne_bytes());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn run_async<R: Send + 'static>(
        &self,
        name: &'static str,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<R, crate::RuntimeError> + Send + 'static,
    ) -> Result<Work<R>, Error> {
        self.queue(name, op)
    }

    /// [`ProcessGroup::run_async`], calling `on_end` with the outcome once the operation
    /// has ended, on the worker thread, before its [`Work`] gets the result: after the
    /// turn has passed on, so `on_end` may itself issue calls on this group (a blocking
    /// one runs at once, on the worker). `on_end` also hears of an operation refused at
    /// its turn (its deadline passed while queued, or the group broke). For a binding
    /// that completes a future of its own language.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let (tx, rx) = mpsc::channel();
    /// let again = pg.clone();
    /// let work = pg.run_async_and_then(
    ///     "barrier",
    ///     |backend, deadline| backend.barrier(deadline),
    ///     move |outcome| {
    ///         // The turn has passed on: a blocking call here runs at once.
    ///         let _ = tx.send((outcome.is_ok(), again.barrier().is_ok()));
    ///     },
    /// )?;
    /// work.wait()?;
    /// assert_eq!(rx.recv().unwrap(), (true, true));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn run_async_and_then<R: Send + 'static>(
        &self,
        name: &'static str,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<R, crate::RuntimeError> + Send + 'static,
        on_end: impl FnOnce(&Result<R, Error>) + Send + 'static,
    ) -> Result<Work<R>, Error> {
        self.queue_then(name, op, on_end)
    }

    /// Runs `op` (named `name` in messages) on the calling thread once every earlier
    /// operation has finished, with the group's deadline counted from now.
    pub(crate) fn in_order<R, E>(
        &self,
        name: &'static str,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<R, E>,
    ) -> Result<R, Error>
    where
        Error: From<E>,
    {
        self.in_order_within(name, self.shared.backend.timeout(), op)
    }

    /// [`ProcessGroup::in_order`] with a deadline `timeout` from now. The deadline covers
    /// the wait for earlier operations too: a call still queued when it passes fails
    /// with [`Error::QueueTimeout`] and aborts the group.
    pub(crate) fn in_order_within<R, E>(
        &self,
        name: &'static str,
        timeout: Duration,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<R, E>,
    ) -> Result<R, Error>
    where
        Error: From<E>,
    {
        let deadline = Deadline::after(timeout);
        let turn = self
            .shared
            .sequencer
            .issue_and_wait(name, deadline)
            .map_err(|refusal| refusal.settle(&*self.shared.backend))?;
        let result = op(&*self.shared.backend, deadline);
        let aborted_meanwhile = turn.finish();
        let value = result?;
        aborted_meanwhile?;
        Ok(value)
    }

    /// Queues `op` (named `name` in messages) on the background worker, behind every
    /// earlier operation, with the group's deadline counted from now (time spent queued
    /// counts).
    pub(crate) fn queue<T: Send + 'static, E>(
        &self,
        name: &'static str,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<T, E> + Send + 'static,
    ) -> Result<Work<T>, Error>
    where
        Error: From<E>,
    {
        self.queue_then(name, op, |_| {})
    }

    /// [`ProcessGroup::queue`], calling `on_end` with the outcome once the turn has passed
    /// on (see [`ProcessGroup::run_async_and_then`]).
    fn queue_then<T: Send + 'static, E>(
        &self,
        name: &'static str,
        op: impl FnOnce(&dyn Backend, Deadline) -> Result<T, E> + Send + 'static,
        on_end: impl FnOnce(&Result<T, Error>) + Send + 'static,
    ) -> Result<Work<T>, Error>
    where
        Error: From<E>,
    {
        let rank = self.rank();
        let deadline = Deadline::after(self.shared.backend.timeout());
        let mut slot = self.worker()?;
        let worker = self.started(&mut slot)?;
        let (done, result) = crossbeam_channel::bounded(1);
        let run: RunOnBackend = Box::new(move |turn| {
            let result = turn.and_then(|(backend, turn)| {
                let result = panic::catch_unwind(AssertUnwindSafe(|| {
                    op(backend, deadline).map_err(Error::from)
                }))
                .unwrap_or_else(|_| {
                    Err(Error::GroupBroken {
                        rank,
                        cause: "an operation panicked in the background worker".into(),
                    })
                });
                // The turn passes on before the result is handed over, so that a thread
                // that waited for this call may issue the next one at once.
                let aborted_meanwhile = turn.finish();
                let value = result?;
                aborted_meanwhile?;
                Ok(value)
            });
            on_end(&result);
            // The Work may have been dropped: the result is then discarded.
            let _ = done.send(result);
        });
        let submitted = self
            .shared
            .sequencer
            .issue(name, deadline, |ticket| {
                worker
                    .submit(Job {
                        ticket,
                        deadline,
                        run,
                    })
                    .map(|()| ticket)
            })
            .map_err(|refusal| refusal.settle(&*self.shared.backend))?;
        let ticket = submitted.map_err(|job| {
            self.shared.sequencer.skip(job.ticket);
            Error::GroupBroken {
                rank,
                cause: "the group's background worker has stopped".into(),
            }
        })?;
        Ok(Work::new(
            result,
            rank,
            Queued {
                ticket,
                deadline,
                sequencer: Arc::clone(&self.shared.sequencer),
                backend: Arc::clone(&self.shared.backend),
            },
        ))
    }
}

/// `backend`, run through a [`GroupRunner`](ringccl_collectives::GroupRunner) if it does
/// not already run through one, and the group's control state that runner keeps.
fn run_through_a_runner(backend: Arc<dyn Backend>) -> (Arc<dyn Backend>, Arc<GroupControl>) {
    if let Some(control) = backend.control() {
        let control = Arc::clone(control);
        return (backend, control);
    }
    let runner = BackendEngine::runner(backend);
    let control = Arc::clone(runner.control());
    (Arc::new(runner), control)
}

/// Dropping a group with operations still pending (queued `*_async` calls whose `Work`
/// was dropped, or a call still running) aborts it: those operations would otherwise run
/// on, unobserved, while the peers wait for this rank; instead every peer is told at once.
impl Drop for Shared {
    fn drop(&mut self) {
        let pending = self.sequencer.pending();
        if !pending.is_empty() {
            self.backend.abort(&format!(
                "rank {} dropped its ProcessGroup with {} operation(s) still pending ({})",
                self.backend.rank(),
                pending.len(),
                pending.join(", ")
            ));
        }
    }
}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("backend", &self.shared.backend)
            .finish_non_exhaustive()
    }
}

/// How rank `rank` of `world_size` reaches each rank when it reaches every peer the same
/// way, `kind` (see [`ProcessGroup::peer_transport`]).
pub(crate) fn same_for_every_peer(
    rank: usize,
    world_size: usize,
    kind: &'static str,
) -> Vec<&'static str> {
    (0..world_size)
        .map(|peer| if peer == rank { "self" } else { kind })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn process_group_is_send_and_sync() {
        assert_send_sync::<ProcessGroup>();
    }
}
