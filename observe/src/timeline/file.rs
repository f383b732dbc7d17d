//! One process's trace file for one rank: the bounded buffer, the writer thread that
//! empties it in batches, the rows, and the end of the file.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use super::buffer::{Buffer, BATCH_INTERVAL, BUFFER_CAPACITY};
use super::chrome::{self, Record};
use super::clock;
use super::row::Timeline;

/// How long closing a file waits for the writer to write what is left and end the
/// array; past it the file is left without its closing `]` (which readers tolerate).
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// One rank's Chrome trace (Trace Event JSON, which Perfetto and chrome://tracing open):
/// one process (`pid` = the rank, named `rank <r>`) whose rows ([`Timeline`]s) hold the
/// spans.
///
/// Recording never blocks and never does I/O: spans go into a bounded buffer of
/// [`BUFFER_CAPACITY`] records, which a writer thread empties every 100 ms (sooner when
/// it is half full). When the disk cannot keep up, the buffer fills and further spans are
/// dropped and counted (the file's last event, `ringccl_trace_summary`, says how many).
///
/// The file is finished (its closing `]` written) by [`TraceFile::close`], when the last
/// [`TraceHold`] is dropped (a group holds one), or when the last handle goes. A process
/// that dies first leaves a file that lacks the `]` and at most the last 100 ms of spans;
/// every complete line is still one event (see the `chrome` module).
///
/// ```
/// use std::time::Instant;
/// use ringccl_observe::timeline::{Span, SpanArgs, TraceFile};
///
/// let dir = std::env::temp_dir().join(format!("ringccl-doc-trace-{}", std::process::id()));
/// let file = TraceFile::create(&dir, 0)?;
/// let row = file.row("trainer");
/// let start = Instant::now();
/// row.record(Span::new("step", start, Instant::now(), SpanArgs::None));
/// assert!(file.close());
/// let text = std::fs::read_to_string(file.path().unwrap())?;
/// let events: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
/// assert!(events.iter().any(|e| e["name"] == "step" && e["ph"] == "X"));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct TraceFile {
    pid: usize,
    path: Option<PathBuf>,
    pub(super) buffer: Arc<Buffer>,
    /// Row names; row `i` has thread id `i + 1`.
    rows: Mutex<Vec<String>>,
    holds: AtomicUsize,
}

/// Paths this process has already written a trace to: a second group of the same rank
/// gets a file of its own (`rank-0.2.json`) instead of overwriting the first.
static USED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Every file of this process, for [`TraceFile::close_all`].
static OPEN: Mutex<Vec<Weak<TraceFile>>> = Mutex::new(Vec::new());

impl TraceFile {
    /// Creates `dir` if needed and starts writing rank `rank`'s trace to
    /// `dir/rank-<rank>.json` (replacing a file left by an earlier run). If this process
    /// already wrote that file, the next free `rank-<rank>.<n>.json` is used.
    ///
    /// ```
    /// let dir = std::env::temp_dir().join(format!("ringccl-doc-create-{}", std::process::id()));
    /// let file = ringccl_observe::timeline::TraceFile::create(&dir, 3)?;
    /// assert!(file.path().unwrap().ends_with("rank-3.json"));
    /// # file.close();
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn create(dir: &Path, rank: usize) -> io::Result<Arc<TraceFile>> {
        fs::create_dir_all(dir)?;
        let path = {
            let mut used = USED.lock().unwrap_or_else(|p| p.into_inner());
            let path = (1..)
                .map(|n| match n {
                    1 => dir.join(format!("rank-{rank}.json")),
                    n => dir.join(format!("rank-{rank}.{n}.json")),
                })
                .find(|path| !used.contains(path))
                .unwrap_or_else(|| dir.join(format!("rank-{rank}.json")));
            used.push(path.clone());
            path
        };
        let file = File::create(&path)?;
        TraceFile::start(BufWriter::new(file), rank, Some(path))
    }

    /// Writes rank `rank`'s trace to `out` instead of a file (tests, tools).
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_eq!(file.path(), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn to_writer(out: impl Write + Send + 'static, rank: usize) -> io::Result<Arc<TraceFile>> {
        TraceFile::start(out, rank, None)
    }

    fn start(
        mut out: impl Write + Send + 'static,
        pid: usize,
        path: Option<PathBuf>,
    ) -> io::Result<Arc<TraceFile>> {
        clock::start();
        let labels = format!("host {}, pid {}", host_name(), std::process::id());
        chrome::write_header(&mut out, pid, &labels)?;
        out.flush()?;
        let buffer = Arc::new(Buffer::new(BUFFER_CAPACITY));
        let shared = Arc::clone(&buffer);
        let name = path
            .as_deref()
            .map_or_else(|| "a trace writer".to_string(), |p| p.display().to_string());
        thread::Builder::new()
            .name(format!("ringccl-trace-{pid}"))
            .spawn(move || write_batches(out, pid, &shared, &name))?;
        let file = Arc::new(TraceFile {
            pid,
            path,
            buffer,
            rows: Mutex::new(Vec::new()),
            holds: AtomicUsize::new(0),
        });
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|f| f.strong_count() > 0);
        open.push(Arc::downgrade(&file));
        Ok(file)
    }

    /// Finishes every trace file of this process that is still open (see
    /// [`TraceFile::close`]), one after the other: for exit paths that skip destructors
    /// (`std::process::exit`), which the `ringccl` crate hooks with `atexit`.
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// ringccl_observe::timeline::TraceFile::close_all();
    /// assert!(!file.is_open());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn close_all() {
        let open: Vec<Arc<TraceFile>> = OPEN
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for file in open {
            if file.is_open() {
                file.close();
            }
        }
    }

    /// Where the trace is written (`None` for [`TraceFile::to_writer`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The process id in the trace: the rank that opened the file.
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 5)?;
    /// assert_eq!(file.pid(), 5);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> usize {
        self.pid
    }

    /// The row called `name`, created (below the rows already there) if it does not
    /// exist yet.
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_eq!(file.row("ddp").tid(), file.row("ddp").tid());
    /// assert_ne!(file.row("ddp").tid(), file.row("trainer").tid());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn row(self: &Arc<Self>, name: &str) -> Timeline {
        self.row_inner(name, false)
    }

    /// A new row, named `name` or, if that name is taken, `name (2)`, `name (3)`, …: for
    /// spans that must not share a row with others (each group's collectives).
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_ne!(file.new_row("collectives").tid(), file.new_row("collectives").tid());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new_row(self: &Arc<Self>, name: &str) -> Timeline {
        self.row_inner(name, true)
    }

    fn row_inner(self: &Arc<Self>, name: &str, fresh: bool) -> Timeline {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let existing = rows.iter().position(|r| r == name);
        let index = match existing {
            Some(index) if !fresh => index,
            _ => {
                let unique = (1..)
                    .map(|n| match n {
                        1 => name.to_string(),
                        n => format!("{name} ({n})"),
                    })
                    .find(|candidate| !rows.contains(candidate))
                    .unwrap_or_else(|| name.to_string());
                rows.push(unique.clone());
                let tid = rows.len() as u32;
                self.buffer.push(Record::Row { tid, name: unique }, true);
                rows.len() - 1
            }
        };
        Timeline::new(Arc::clone(self), index as u32 + 1)
    }

    /// Keeps the file open until the returned hold (and every other) is dropped; the
    /// last hold to go finishes the file. A process group holds its file this way, so
    /// that dropping the group finishes the file even while other handles remain (a
    /// background thread still finishing a call).
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// let hold = file.hold();
    /// drop(hold); // the last hold: the file is finished
    /// assert!(!file.is_open());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn hold(self: &Arc<Self>) -> TraceHold {
        self.holds.fetch_add(1, Ordering::AcqRel);
        TraceHold(Arc::clone(self))
    }

    /// Finishes the file: refuses further spans, waits (at most [`CLOSE_WAIT`]) for the
    /// writer to write what is buffered, the summary and the closing `]`. Returns whether
    /// the file was finished in time. Idempotent.
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert!(file.close());
    /// assert!(file.close());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn close(&self) -> bool {
        self.buffer.close();
        let finished = self.buffer.wait_closed(CLOSE_WAIT);
        if !finished {
            tracing::warn!(
                rank = self.pid,
                path = ?self.path,
                "the trace writer did not finish within {CLOSE_WAIT:?}; the file may lack its \
                 last spans and its closing bracket (viewers accept that)"
            );
        }
        finished
    }

    /// Whether spans are still taken (the file has not been closed).
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert!(file.is_open());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_open(&self) -> bool {
        !self.buffer.is_closing()
    }

    /// Spans dropped so far because the buffer was full or the file closed.
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_eq!(file.dropped(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn dropped(&self) -> u64 {
        self.buffer.dropped()
    }

    /// The most spans the buffer holds ([`BUFFER_CAPACITY`]).
    ///
    /// ```
    /// use ringccl_observe::timeline::{TraceFile, BUFFER_CAPACITY};
    /// let file = TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_eq!(file.capacity(), BUFFER_CAPACITY);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.buffer.capacity()
    }

    /// Spans waiting for the writer right now (never more than [`TraceFile::capacity`],
    /// plus row names).
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert!(file.pending() <= file.capacity());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pending(&self) -> usize {
        self.buffer.pending()
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        if self.is_open() {
            self.close();
        }
    }
}

impl fmt::Debug for TraceFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceFile")
            .field("pid", &self.pid)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Keeps a [`TraceFile`] open; see [`TraceFile::hold`].
#[derive(Debug)]
pub struct TraceHold(Arc<TraceFile>);

impl TraceHold {
    /// The file held.
    ///
    /// ```
    /// let file = ringccl_observe::timeline::TraceFile::to_writer(std::io::sink(), 2)?;
    /// assert_eq!(file.hold().file().pid(), 2);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn file(&self) -> &Arc<TraceFile> {
        &self.0
    }
}

impl Drop for TraceHold {
    fn drop(&mut self) {
        if self.0.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.close();
        }
    }
}

/// The writer thread: batches out of the buffer into `out`, then the footer. An I/O
/// error stops the writing (logged once); what follows is counted as dropped.
fn write_batches(mut out: impl Write, pid: usize, buffer: &Buffer, name: &str) {
    let mut batch = Vec::new();
    let mut written: u64 = 0;
    let mut lost: u64 = 0;
    let mut failed = false;
    let mut next = Instant::now() + BATCH_INTERVAL;
    loop {
        let taken = buffer.take(&mut batch, next);
        next = Instant::now() + BATCH_INTERVAL;
        if !failed {
            let result = batch.iter().try_for_each(|record| {
                out.write_all(b",")?;
                chrome::write_record(&mut out, pid, record)?;
                written += u64::from(matches!(record, Record::Span { .. }));
                out.write_all(b"\n")
            });
            if let Err(error) = result.and_then(|()| out.flush()) {
                tracing::warn!(rank = pid, %error, "stopped writing the trace to {name}");
                failed = true;
            }
        }
        if failed {
            lost += batch.len() as u64;
        }
        batch.clear();
        if taken.closing {
            break;
        }
    }
    if !failed {
        let dropped = buffer.dropped() + lost;
        let result = chrome::write_footer(&mut out, pid, written, dropped);
        if let Err(error) = result.and_then(|()| out.flush()) {
            tracing::warn!(rank = pid, %error, "could not finish the trace {name}");
        }
    }
    drop(out);
    buffer.mark_closed();
}

/// This host's name, for the file's labels (empty if unknown).
fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
