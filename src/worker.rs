//! The group's background worker: runs queued operations, one at a time, in issue order,
//! and between them watches the work its backend left in flight on a device.

use std::fmt;
use std::sync::Arc;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use ringccl_collectives::{Backend, Deadline};

use crate::sequencer::{Sequencer, Turn};
use crate::Error;

/// Runs one queued operation on the backend, once it has its turn (or reports why it
/// will not run), and hands the result to its `Work`.
pub(crate) type RunOnBackend =
    Box<dyn for<'a> FnOnce(Result<(&'a dyn Backend, Turn<'a>), Error>) + Send>;

/// What the worker does while no operation is queued: one look at the backend's work in
/// flight (NCCL's stream-ordered calls), returning when to look again (`None`: nothing
/// is in flight, so wait for the next operation).
pub(crate) type IdleWatch = Box<dyn FnMut() -> Option<Instant> + Send>;

/// A queued operation: its ticket, its deadline (fixed when it was issued) and the
/// closure that runs it.
pub(crate) struct Job {
    pub(crate) ticket: u64,
    pub(crate) deadline: Deadline,
    pub(crate) run: RunOnBackend,
}

/// Handle on the worker thread; dropping it lets the worker finish the queue and exit.
pub(crate) struct Worker {
    /// `None` once dropping began (closing the queue).
    queue: Option<Sender<Job>>,
    /// Tells an idle worker to look at the work in flight (work handed to the device
    /// from another thread); holds at most one pending nudge.
    nudge: Sender<()>,
    /// How long dropping the handle waits for the thread to finish (`None`: not at all).
    wait_on_drop: Option<Duration>,
    /// Disconnected once the thread has finished and dropped its backend handle.
    finished: Receiver<()>,
    thread: ThreadId,
    rank: usize,
}

impl Worker {
    /// Starts the thread. With `wait_on_drop`, dropping the handle waits (that long at
    /// most) until the thread has finished the queue and let go of the backend, so the
    /// backend's teardown is over before the drop returns: NCCL's must be, or it races
    /// with the process's exit (it crashed inside `ncclCommDestroy` on a real GPU when
    /// the worker thread still tore the communicator down while `main` returned).
    /// `idle` runs between operations (see [`IdleWatch`]).
    pub(crate) fn start(
        backend: Arc<dyn Backend>,
        sequencer: Arc<Sequencer>,
        wait_on_drop: Option<Duration>,
        idle: Option<IdleWatch>,
    ) -> Result<Worker, Error> {
        let (queue, jobs) = crossbeam_channel::unbounded::<Job>();
        let (nudge, nudged) = crossbeam_channel::bounded::<()>(1);
        let (finishing, finished) = crossbeam_channel::bounded::<()>(0);
        let rank = backend.rank();
        let handle = thread::Builder::new()
            .name(format!("ringccl-worker-{rank}"))
            .spawn(move || {
                let mut idle = idle;
                work(&*backend, &sequencer, &jobs, &nudged, idle.as_mut());
                // The watch may hold the backend too: both go before the drop is told.
                drop(idle);
                drop(backend);
                drop(finishing);
            })
            .map_err(|source| Error::Io {
                rank,
                context: "starting the process group's background worker".into(),
                source,
            })?;
        Ok(Worker {
            queue: Some(queue),
            nudge,
            wait_on_drop,
            finished,
            thread: handle.thread().id(),
            rank,
        })
    }

    /// Has the worker look at the work in flight now (and keep looking while there is
    /// any), even if no operation comes.
    // Only device work is handed off without a wait, so only the GPU build nudges.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn nudge(&self) {
        // Full: a nudge is already pending. Disconnected: the worker has stopped.
        let _ = self.nudge.try_send(());
    }

    /// Queues `job`; gives it back if the worker is gone.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        match &self.queue {
            Some(queue) => queue.send(job).map_err(|e| e.into_inner()),
            None => Err(job),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.queue = None; // the worker drains the queue and exits
        let Some(limit) = self.wait_on_drop else {
            return;
        };
        if thread::current().id() == self.thread {
            return; // the last handle went away inside a queued job: nothing to wait for
        }
        if let Err(crossbeam_channel::RecvTimeoutError::Timeout) = self.finished.recv_timeout(limit)
        {
            tracing::warn!(
                rank = self.rank,
                ?limit,
                "the process group's worker is still running queued operations; \
                 leaving it to finish on its own"
            );
        }
    }
}

fn work(
    backend: &dyn Backend,
    sequencer: &Sequencer,
    jobs: &Receiver<Job>,
    nudged: &Receiver<()>,
    mut idle: Option<&mut IdleWatch>,
) {
    // When to look at the work in flight next; `None`: nothing is in flight.
    let mut look_at: Option<Instant> = None;
    // Ends when the group (the only sender) is dropped and the queue is drained; work
    // still in flight then is the backend's teardown's to finish.
    loop {
        let timer = look_at.map_or_else(crossbeam_channel::never, crossbeam_channel::at);
        crossbeam_channel::select! {
            recv(jobs) -> job => match job {
                Ok(job) => {
                    let turn = sequencer
                        .turn(job.ticket, job.deadline)
                        .map(|turn| (backend, turn))
                        .map_err(|refusal| refusal.settle(backend));
                    (job.run)(turn);
                }
                Err(_) => return,
            },
            recv(nudged) -> _ => {
                if look_at.is_some() {
                    // Already watching: the next look comes within the timer's period,
                    // and a look per call would compete with the calls for the group.
                    continue;
                }
            }
            recv(timer) -> _ => {}
        }
        look_at = idle.as_mut().and_then(|watch| watch());
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("queued", &self.queue.as_ref().map_or(0, Sender::len))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringccl_collectives::{HostBackend, HostConfig, MemoryConfig, MemoryTransport};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A worker over a real one-rank group, whose idle watch counts its looks and asks
    /// to be called again while `in_flight` is non-zero.
    fn watched(in_flight: Arc<AtomicUsize>, looks: Arc<AtomicUsize>) -> Worker {
        let transport = MemoryTransport::mesh(1, MemoryConfig::default())
            .pop()
            .expect("one rank");
        let backend: Arc<dyn Backend> =
            Arc::new(HostBackend::new("test", transport, HostConfig::default()));
        let sequencer = Arc::new(Sequencer::new(
            Arc::clone(backend.control().expect("a runner")),
            None,
        ));
        let idle: IdleWatch = Box::new(move || {
            looks.fetch_add(1, Ordering::SeqCst);
            (in_flight.load(Ordering::SeqCst) > 0)
                .then(|| Instant::now() + Duration::from_millis(5))
        });
        Worker::start(backend, sequencer, Some(Duration::from_secs(5)), Some(idle))
            .expect("the worker starts")
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < until, "timed out waiting until {what}");
            thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn an_idle_worker_looks_only_when_nudged_and_keeps_looking_while_work_is_in_flight() {
        let (in_flight, looks) = (Arc::new(AtomicUsize::new(0)), Arc::default());
        let worker = watched(Arc::clone(&in_flight), Arc::clone(&looks));
        thread::sleep(Duration::from_millis(50));
        assert_eq!(looks.load(Ordering::SeqCst), 0, "nothing to watch: no look");
        // Work handed off from another thread: the nudge starts the watch, which goes
        // on by its own timer while anything is in flight.
        in_flight.store(1, Ordering::SeqCst);
        worker.nudge();
        wait_until("several looks", || looks.load(Ordering::SeqCst) >= 5);
        // Nudges while it watches are absorbed, not a look each.
        let before = looks.load(Ordering::SeqCst);
        for _ in 0..1000 {
            worker.nudge();
        }
        thread::sleep(Duration::from_millis(20));
        let after = looks.load(Ordering::SeqCst);
        assert!(
            after - before < 100,
            "a look per nudge: {before} -> {after}"
        );
        // Nothing left in flight: the watch stops after one more look (a look every
        // timer period would keep the count moving).
        in_flight.store(0, Ordering::SeqCst);
        wait_until("the looks stop", || {
            let before = looks.load(Ordering::SeqCst);
            thread::sleep(Duration::from_millis(60));
            looks.load(Ordering::SeqCst) == before
        });
        // Dropping the handle ends the thread (the drop waits for it, bounded).
        let started = Instant::now();
        drop(worker);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn every_job_is_followed_by_a_look_at_the_work_in_flight() {
        let (in_flight, looks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let worker = watched(in_flight, Arc::clone(&looks));
        let (ran, jobs_done) = crossbeam_channel::unbounded();
        for ticket in 1..=3u64 {
            let ran = ran.clone();
            let job = Job {
                ticket,
                deadline: Deadline::after(Duration::from_secs(20)),
                run: Box::new(move |turn| {
                    if let Ok((_, turn)) = turn {
                        let _ = turn.finish();
                    }
                    let _ = ran.send(ticket);
                }),
            };
            assert!(worker.submit(job).is_ok());
        }
        let order: Vec<u64> = (0..3)
            .map(|_| {
                jobs_done
                    .recv_timeout(Duration::from_secs(20))
                    .expect("the job ran")
            })
            .collect();
        assert_eq!(order, [1, 2, 3], "in issue order");
        wait_until("a look after each job", || {
            looks.load(Ordering::SeqCst) >= 3
        });
    }
}
