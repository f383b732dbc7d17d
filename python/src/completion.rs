//! What an asynchronous call does when it ends: completes the torch future the Python
//! half returned for it (`Completion`).

use pyo3::prelude::*;

/// Said to the completion callback of a call the group's worker dropped unrun (it was
/// stopping).
const NEVER_RAN: &str = "the call never ran: the group's worker stopped first (the group was \
                         destroyed or broken; the earlier calls' errors say why)";

/// What an asynchronous call does when it ends: calls the Python half's `on_done(error)`
/// (`None` on success, the message otherwise), then lets go of the tensors it kept
/// alive. A call dropped without an outcome completes as failed.
pub(crate) struct Completion {
    /// Taken when the end is reported, so it is reported once.
    on_done: Option<Py<PyAny>>,
    keep: Vec<Py<PyAny>>,
}

impl Completion {
    pub(crate) fn new(on_done: Py<PyAny>, keep: Vec<Py<PyAny>>) -> Completion {
        Completion {
            on_done: Some(on_done),
            keep,
        }
    }

    /// Reports the call's end: `Err(message)` if it failed.
    pub(crate) fn finish(mut self, result: Result<(), String>) {
        self.report(result);
    }

    fn report(&mut self, result: Result<(), String>) {
        let on_done = self.on_done.take();
        let keep = std::mem::take(&mut self.keep);
        if on_done.is_none() && keep.is_empty() {
            return;
        }
        // An interpreter shutting down cannot be called into; the references are then
        // left to PyO3's pool.
        let _ = Python::try_attach(|py| {
            if let Some(on_done) = on_done {
                let error = result.err();
                if let Err(e) = on_done.call1(py, (error,)) {
                    e.write_unraisable(py, None);
                }
            }
            drop(keep);
        });
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        self.report(Err(NEVER_RAN.into()));
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("reported", &self.on_done.is_none())
            .field("keeps", &self.keep.len())
            .finish()
    }
}
