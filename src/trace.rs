//! The facade's part of the timeline (`RINGCCL_TRACE`): opening each rank's trace file at
//! start-up, the group's hold on it, finishing the files when the process exits, and
//! spans that callers mark themselves. The file, its rows and spans are
//! [`ringccl_observe::timeline`]'s.

// atexit(3) is an FFI call: the one way to run code on `std::process::exit`.
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::sync::{Arc, Once};

use ringccl_observe::timeline::{SpanGuard, TraceFile};
use ringccl_rendezvous::SetupError;

use crate::options::InitOptions;
use crate::{Error, ProcessGroup};

/// Opens this rank's trace file when `opts` (or `RINGCCL_TRACE`) asks for one. Done
/// before rendezvous, so that a directory that cannot be written fails this rank at once,
/// with the path and what to do.
pub(crate) fn open_trace(opts: &InitOptions) -> Result<Option<Arc<TraceFile>>, Error> {
    let Some(dir) = opts.resolved_trace_dir()? else {
        return Ok(None);
    };
    let rank = opts.rank;
    let file = TraceFile::create(&dir, rank).map_err(|source| SetupError::Io {
        rank,
        context: format!(
            "creating the trace file in {} (RINGCCL_TRACE or InitOptions::trace_dir): point \
             it at a writable directory, or unset it to turn tracing off",
            dir.display()
        ),
        source,
    })?;
    tracing::info!(rank, path = ?file.path(), "writing a Chrome trace");
    finish_files_at_exit();
    Ok(Some(file))
}

/// Registers, once per process, an `atexit` handler that finishes every open trace file:
/// a process that ends with `std::process::exit` (which skips destructors) while its
/// groups are still alive still leaves complete files. (A killed or crashing process
/// cannot; see [`TraceFile`].)
fn finish_files_at_exit() {
    extern "C" fn finish_files() {
        // Never unwind into C.
        let _ = std::panic::catch_unwind(TraceFile::close_all);
    }
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // SAFETY: `finish_files` is an `extern "C" fn()` with no arguments, as atexit
        // requires, that lives for the whole program and never unwinds.
        let failed = unsafe { libc::atexit(finish_files) } != 0;
        if failed {
            tracing::warn!("could not register the atexit handler that finishes trace files");
        }
    });
}

impl ProcessGroup {
    /// This rank's trace file (its timeline), when tracing is on (`RINGCCL_TRACE` or
    /// [`InitOptions::trace_dir`]). Groups formed from this one write to the same file,
    /// each on a row of its own.
    ///
    /// ```
    /// let dir = std::env::temp_dir().join(format!("ringccl-doc-pg-trace-{}", std::process::id()));
    /// let opts = ringccl::InitOptions::new(0, 1, "127.0.0.1:0").trace_dir(&dir);
    /// let pg = ringccl::init_process_group("gloo", opts)?;
    /// let path = pg.trace_file().and_then(|f| f.path()).map(|p| p.to_path_buf());
    /// assert_eq!(path, Some(dir.join("rank-0.json")));
    /// # drop(pg);
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn trace_file(&self) -> Option<&Arc<TraceFile>> {
        self.shared().trace.as_ref().map(|hold| hold.file())
    }

    /// A span called `name` on row `row` of this rank's timeline, from now until the
    /// returned guard is dropped; nothing is recorded when tracing is off. Spans of one
    /// row should follow each other (or nest), not overlap.
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// {
    ///     let _forward = pg.trace_span("trainer", "forward");
    ///     // ... the forward pass ...
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn trace_span(&self, row: &str, name: impl Into<Cow<'static, str>>) -> SpanGuard {
        match self.trace_file() {
            Some(file) => file.row(row).span(name),
            None => SpanGuard::off(),
        }
    }
}
