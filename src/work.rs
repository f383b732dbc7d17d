//! Handles on operations running in the background.

use std::fmt;
use std::time::Duration;

use crate::Error;
use crossbeam_channel::{Receiver, RecvTimeoutError};

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
}

impl<T> Work<T> {
    pub(crate) fn new(result: Receiver<Result<T, Error>>, rank: usize) -> Work<T> {
        Work {
            result,
            taken: false,
            rank,
        }
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
    /// operations). Returns within the operation's deadline (plus the deadlines of the
    /// operations queued before it).
    pub fn wait(self) -> Result<T, Error> {
        if self.taken {
            return Err(self.already_taken());
        }
        self.result
            .recv()
            .unwrap_or_else(|_| Err(self.worker_gone()))
    }

    /// Waits at most `timeout`. `None` means the operation is still running (the `Work`
    /// stays valid); `Some` carries its result, after which the `Work` is spent.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<Result<T, Error>> {
        if self.taken {
            return Some(Err(self.already_taken()));
        }
        match self.result.recv_timeout(timeout) {
            Ok(result) => {
                self.taken = true;
                Some(result)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                self.taken = true;
                Some(Err(self.worker_gone()))
            }
        }
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
