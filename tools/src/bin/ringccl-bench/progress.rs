//! The "which size now" line: shown only when stderr is a terminal, always on one line
//! that is cleared before anything else is printed, so it never lands inside the table.
//!
//! Rank 0 started by `--np` does not own the terminal: it sends its progress to the
//! launcher through its stdout, in order with the table rows, marked with
//! [`PROGRESS_PREFIX`], and the launcher shows it.

use std::io::{IsTerminal, Write};

/// Marks a progress line in rank 0's stdout, for the launcher.
pub(crate) const PROGRESS_PREFIX: &str = "RINGCCL_BENCH_PROGRESS=";

/// Erases the current terminal line and returns to its start.
const CLEAR_LINE: &str = "\r\x1b[2K";

/// Where progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    /// This process's stderr, a terminal.
    Terminal,
    /// The launcher, through stdout.
    Launcher,
    /// Nowhere: stderr is a file or a pipe.
    Nowhere,
}

/// The progress line of one process.
#[derive(Debug)]
pub(crate) struct Progress {
    sink: Sink,
    /// Whether a progress line is on the terminal now.
    shown: bool,
}

impl Progress {
    /// Progress for a rank: to the launcher when one started it, else to stderr if it is
    /// a terminal.
    pub(crate) fn for_rank(launched: bool) -> Progress {
        let sink = match (launched, std::io::stderr().is_terminal()) {
            (true, _) => Sink::Launcher,
            (false, true) => Sink::Terminal,
            (false, false) => Sink::Nowhere,
        };
        Progress { sink, shown: false }
    }

    /// Progress for the launcher, which shows its rank 0's progress on its own stderr.
    pub(crate) fn for_launcher() -> Progress {
        let sink = if std::io::stderr().is_terminal() {
            Sink::Terminal
        } else {
            Sink::Nowhere
        };
        Progress { sink, shown: false }
    }

    /// Replaces the progress line with `text`.
    pub(crate) fn show(&mut self, text: &str) {
        match self.sink {
            Sink::Terminal => {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "{CLEAR_LINE}{text}");
                let _ = err.flush();
                self.shown = true;
            }
            Sink::Launcher => {
                println!("{PROGRESS_PREFIX}{text}");
                let _ = std::io::stdout().flush();
            }
            Sink::Nowhere => {}
        }
    }

    /// Erases the progress line, if one is shown: call before printing anything else.
    pub(crate) fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{CLEAR_LINE}");
            let _ = err.flush();
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nothing_is_shown_or_cleared_without_a_terminal() {
        let mut progress = super::Progress {
            sink: super::Sink::Nowhere,
            shown: false,
        };
        progress.show("all_reduce 8 B");
        assert!(!progress.shown);
        progress.clear();
        assert!(!progress.shown);
    }

    #[test]
    fn the_launcher_sink_never_marks_the_terminal() {
        let mut progress = super::Progress {
            sink: super::Sink::Launcher,
            shown: false,
        };
        progress.show("x");
        assert!(!progress.shown, "rank 0's terminal is the launcher's");
    }
}
