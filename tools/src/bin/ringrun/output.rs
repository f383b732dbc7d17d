//! The ranks' output: every line copied to ringrun's stdout or stderr with a `[rank R]`
//! prefix.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How long ringrun waits, after the ranks exit, for their last output lines.
const DRAIN: Duration = Duration::from_secs(2);
/// How long ringrun waits for a failed rank's last lines before it says the rank failed
/// (a process the rank started may hold its pipes open after it exits).
pub(crate) const FAILED_RANK_DRAIN: Duration = Duration::from_secs(1);

/// Copies a rank's output, prefixed, and reports the rank on `done` when the stream ends.
pub(crate) fn forward_lines(
    rank: usize,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    done: mpsc::Sender<usize>,
) {
    let copy = move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if to_stderr {
                let _ = writeln!(io::stderr().lock(), "[rank {rank}] {line}");
            } else {
                let _ = writeln!(io::stdout().lock(), "[rank {rank}] {line}");
            }
        }
        let _ = done.send(rank);
    };
    if let Err(e) = thread::Builder::new()
        .name(format!("rank-{rank}-output"))
        .spawn(copy)
    {
        crate::say!("cannot copy rank {rank}'s output (no thread: {e}); it is lost");
    }
}

/// The ends of one run's forwarded streams (each rank's stdout and stderr), as
/// [`forward_lines`] reports them.
#[derive(Debug)]
pub(crate) struct StreamEnds {
    done: mpsc::Receiver<usize>,
    /// The rank of every stream that has ended so far.
    ended: Vec<usize>,
}

impl StreamEnds {
    /// Watches the streams that report on `done`.
    pub(crate) fn new(done: mpsc::Receiver<usize>) -> StreamEnds {
        StreamEnds {
            done,
            ended: Vec::new(),
        }
    }

    /// Takes the ends reported until `enough` of them are in, or until `deadline`.
    fn wait_until(&mut self, deadline: Instant, enough: impl Fn(&[usize]) -> bool) {
        while !enough(&self.ended) {
            match self
                .done
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(rank) => self.ended.push(rank),
                Err(_) => return,
            }
        }
    }

    /// Waits (at most `limit`) until both of `rank`'s streams have been printed to the
    /// end: its last lines (its error) then come before what ringrun says about it.
    pub(crate) fn drain_rank(&mut self, rank: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        self.wait_until(deadline, |ended| {
            ended.iter().filter(|&&r| r == rank).count() >= 2
        });
    }

    /// Waits (boundedly: a process that left the rank's group may keep its pipes open)
    /// until `streams` forwarded streams in all have been printed to the end.
    pub(crate) fn drain(&mut self, streams: usize) {
        let deadline = Instant::now() + DRAIN;
        self.wait_until(deadline, |ended| ended.len() >= streams);
    }
}
