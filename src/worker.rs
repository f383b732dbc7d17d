//! The group's background worker: runs queued operations, one at a time, in issue order.

use std::fmt;
use std::sync::Arc;
use std::thread;

use crossbeam_channel::{Receiver, Sender};
use ringccl_collectives::{Backend, Deadline};

use crate::process_group::settle;
use crate::sequencer::{Sequencer, Turn};
use crate::Error;

/// Runs one queued operation on the backend, once it has its turn (or reports why it
/// will not run), and hands the result to its `Work`.
pub(crate) type RunOnBackend =
    Box<dyn for<'a> FnOnce(Result<(&'a dyn Backend, Turn<'a>), Error>) + Send>;

/// A queued operation: its ticket, its deadline (fixed when it was issued) and the
/// closure that runs it.
pub(crate) struct Job {
    pub(crate) ticket: u64,
    pub(crate) deadline: Deadline,
    pub(crate) run: RunOnBackend,
}

/// Handle on the worker thread; dropping it lets the worker finish the queue and exit.
pub(crate) struct Worker {
    queue: Sender<Job>,
}

impl Worker {
    pub(crate) fn start(
        backend: Arc<dyn Backend>,
        sequencer: Arc<Sequencer>,
    ) -> Result<Worker, Error> {
        let (queue, jobs) = crossbeam_channel::unbounded::<Job>();
        let rank = backend.rank();
        thread::Builder::new()
            .name(format!("ringccl-worker-{rank}"))
            .spawn(move || work(&*backend, &sequencer, &jobs))
            .map_err(|source| Error::Io {
                rank,
                context: "starting the process group's background worker".into(),
                source,
            })?;
        Ok(Worker { queue })
    }

    /// Queues `job`; gives it back if the worker is gone.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        self.queue.send(job).map_err(|e| e.into_inner())
    }
}

fn work(backend: &dyn Backend, sequencer: &Sequencer, jobs: &Receiver<Job>) {
    // Ends when the group (the only sender) is dropped and the queue is drained.
    for job in jobs.iter() {
        let turn = sequencer
            .turn(job.ticket, job.deadline)
            .map(|turn| (backend, turn))
            .map_err(|refusal| settle(backend, refusal));
        (job.run)(turn);
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("queued", &self.queue.len())
            .finish()
    }
}
