//! A row of the timeline (a Chrome trace thread): where spans are recorded.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::chrome::Record;
use super::file::TraceFile;
use super::span::{Span, SpanArgs};

/// One row of a rank's timeline: a cheap, clonable handle that records spans into its
/// [`TraceFile`]. Spans of one row should not overlap unless nested (viewers draw a row
/// as a stack); give concurrent activities rows of their own.
///
/// ```
/// use std::time::Instant;
/// use ringccl_observe::timeline::{Span, SpanArgs, TraceFile};
///
/// let file = TraceFile::to_writer(std::io::sink(), 0)?;
/// let row = file.row("trainer");
/// let start = Instant::now();
/// row.record(Span::new("forward", start, Instant::now(), SpanArgs::None));
/// {
///     let _backward = row.span("backward"); // recorded when dropped
/// }
/// assert_eq!(file.dropped(), 0);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone)]
pub struct Timeline {
    file: Arc<TraceFile>,
    tid: u32,
}

impl Timeline {
    pub(super) fn new(file: Arc<TraceFile>, tid: u32) -> Timeline {
        Timeline { file, tid }
    }

    /// Records `span` on this row. Never blocks: when the writer has fallen behind and
    /// the buffer is full, the span is dropped (and counted).
    ///
    /// ```
    /// # use std::time::Instant;
    /// # use ringccl_observe::timeline::{Span, SpanArgs, TraceFile};
    /// let row = TraceFile::to_writer(std::io::sink(), 0)?.row("r");
    /// let now = Instant::now();
    /// row.record(Span::new("tick", now, now, SpanArgs::None));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn record(&self, span: Span) {
        self.file.buffer.push(
            Record::Span {
                tid: self.tid,
                span,
            },
            false,
        );
    }

    /// Opens `span` on this row, its end not known yet: if it stays open past
    /// [`UNFINISHED_AFTER`](super::buffer::UNFINISHED_AFTER), the file shows it as
    /// unfinished up to the moment of writing. [`Timeline::close_open`] closes it (the
    /// caller records the finished span itself).
    pub(crate) fn open(&self, span: Span) -> u64 {
        self.file.buffer.open_span(self.tid, span)
    }

    /// Closes a span opened by [`Timeline::open`].
    pub(crate) fn close_open(&self, id: u64) {
        self.file.buffer.close_span(id);
    }

    /// A span called `name` from now until the returned guard is dropped (or
    /// [`SpanGuard::end`]ed).
    ///
    /// ```
    /// let row = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?.row("r");
    /// let guard = row.span("backward");
    /// // ... the backward pass ...
    /// guard.end();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn span(&self, name: impl Into<Cow<'static, str>>) -> SpanGuard {
        SpanGuard {
            row: Some(self.clone()),
            name: name.into(),
            start: Instant::now(),
            args: SpanArgs::None,
        }
    }

    /// The row's thread id in the trace (1 for the first row of a file).
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_eq!(file.row("first").tid(), 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// The file this row is in.
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 4)?;
    /// assert_eq!(file.row("r").file().pid(), 4);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn file(&self) -> &Arc<TraceFile> {
        &self.file
    }
}

impl fmt::Debug for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timeline")
            .field("pid", &self.file.pid())
            .field("tid", &self.tid)
            .finish()
    }
}

/// A span being timed: recorded when dropped. A guard made by [`SpanGuard::off`] records
/// nothing (what a caller gets when tracing is off).
#[must_use = "the span ends when the guard is dropped"]
pub struct SpanGuard {
    row: Option<Timeline>,
    name: Cow<'static, str>,
    start: Instant,
    args: SpanArgs,
}

impl SpanGuard {
    /// A guard that records nothing.
    ///
    /// ```
    /// let guard = ringccl_observe::timeline::SpanGuard::off();
    /// assert!(!guard.is_on());
    /// ```
    pub fn off() -> SpanGuard {
        SpanGuard {
            row: None,
            name: Cow::Borrowed(""),
            start: Instant::now(),
            args: SpanArgs::None,
        }
    }

    /// Whether the span will be recorded.
    ///
    /// ```
    /// let row = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?.row("r");
    /// assert!(row.span("x").is_on());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_on(&self) -> bool {
        self.row.is_some()
    }

    /// Attaches `args` to the span.
    ///
    /// ```
    /// use ringccl_observe::timeline::{SpanArgs, TraceFile};
    /// let row = TraceFile::to_writer(std::io::sink(), 0)?.row("r");
    /// let _step = row.span("step").with_args(SpanArgs::Numbers(vec![("step".into(), 7)]));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn with_args(mut self, args: SpanArgs) -> SpanGuard {
        self.args = args;
        self
    }

    /// Ends the span now (the same as dropping the guard).
    ///
    /// ```
    /// ringccl_observe::timeline::SpanGuard::off().end();
    /// ```
    pub fn end(self) {}
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        if let Some(row) = self.row.take() {
            let args = std::mem::replace(&mut self.args, SpanArgs::None);
            let name = std::mem::take(&mut self.name);
            row.record(Span::new(name, self.start, Instant::now(), args));
        }
    }
}

impl fmt::Debug for SpanGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpanGuard")
            .field("name", &self.name)
            .field("on", &self.is_on())
            .finish()
    }
}
