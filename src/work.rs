//! Handles on operations running in the background.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use ringccl_collectives::{Backend, Deadline};

use crate::sequencer::Sequencer;
use crate::Error;

/// Where a queued operation stands in its group's issue order, so that its `Work` can
/// give it up at its deadline.
pub(crate) struct Queued {
    pub(crate) ticket: u64,
    pub(crate) deadline: Deadline,
    pub(crate) sequencer: Arc<Sequencer>,
    pub(crate) backend: Arc<dyn Backend>,
}

/// A handle on an operation queued with one of the `*_async` methods of
/// [`ProcessGroup`](crate::ProcessGroup). It owns the result — for data-carrying
/// operations, the buffer the operation was given, handed back when it is done.
///
/// While the operation runs, the group's background worker owns the buffer, so the
/// caller cannot touch that memory: safe Rust enforces it.
///
/// **Dropping a `Work`** before it finished is safe: the operation still runs to
/// completion (every rank must run it, or the group would fall out of step), then its
/// buffer is freed. Later operations are not affected.
pub struct Work<T> {
    result: Receiver<Result<T, Error>>,
    taken: bool,
    rank: usize,
    queued: Queued,
}

impl<T> Work<T> {
    pub(crate) fn new(result: Receiver<Result<T, Error>>, rank: usize, queued: Queued) -> Work<T> {
        Work {
            result,
            taken: false,
            rank,
            queued,
        }
    }

    /// At the operation's deadline: if it is still queued behind an earlier one, gives it
    /// up (aborting the group) and returns why; `None` if it is running or done.
    fn give_up(&self) -> Option<Error> {
        let Queued {
            ticket,
            deadline,
            sequencer,
            backend,
        } = &self.queued;
        let refusal = sequencer.give_up(*ticket, *deadline)?;
        Some(refusal.settle(&**backend))
    }

    fn worker_gone(&self) -> Error {
        Error::GroupBroken {
            rank: self.rank,
            cause: "the group's background worker stopped before finishing this operation".into(),
        }
    }

    fn already_taken(&self) -> Error {
        Error::InvalidArgument("this Work's result was already taken by wait_timeout".into())
    }

    /// Waits for the operation and returns its result (the buffer, for data-carrying
    /// operations). Returns within the operation's deadline, counted from when it was
    /// queued: if it is still queued behind an earlier operation then, it fails with
    /// [`Error::QueueTimeout`] (and the group is aborted).
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let work = pg.barrier_async()?;
    /// work.wait()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn wait(self) -> Result<T, Error> {
        if self.taken {
            return Err(self.already_taken());
        }
        match self.result.recv_deadline(self.queued.deadline.at()) {
            Ok(result) => return result,
            Err(RecvTimeoutError::Disconnected) => return Err(self.worker_gone()),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(error) = self.give_up() {
            return Err(error);
        }
        // Running (bounded by its own deadline) or just finished.
        self.result
            .recv()
            .unwrap_or_else(|_| Err(self.worker_gone()))
    }

    /// Waits at most `timeout`. `None` means the operation is still running (the `Work`
    /// stays valid); `Some` carries its result, after which the `Work` is spent.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let mut work = pg.barrier_async()?;
    /// let result = work.wait_timeout(Duration::from_secs(30));
    /// assert!(matches!(result, Some(Ok(()))));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<T, Error>> {
        if self.taken {
            return Some(Err(self.already_taken()));
        }
        let until = Instant::now().checked_add(timeout);
        let deadline = self.queued.deadline.at();
        let first = until.map_or(deadline, |until| until.min(deadline));
        let mut outcome = self.result.recv_deadline(first);
        if matches!(outcome, Err(RecvTimeoutError::Timeout)) && self.queued.deadline.has_passed() {
            if let Some(error) = self.give_up() {
                self.taken = true;
                return Some(Err(error));
            }
            // Running (bounded by its own deadline): wait out the rest of `timeout`.
            outcome = match until {
                Some(until) => self.result.recv_deadline(until),
                None => self.result.recv().map_err(RecvTimeoutError::from),
            };
        }
        let result = match outcome {
            Ok(result) => result,
            Err(RecvTimeoutError::Disconnected) => Err(self.worker_gone()),
            Err(RecvTimeoutError::Timeout) => return None,
        };
        self.taken = true;
        Some(result)
    }

    /// Whether the operation has finished (successfully or not). Never blocks.
    pub fn is_completed(&self) -> bool {
        self.taken || !self.result.is_empty()
    }
}

impl<T> fmt::Debug for Work<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("rank", &self.rank)
            .field("completed", &self.is_completed())
            .finish()
    }
}
