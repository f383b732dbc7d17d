//! The ranks' output: every line copied to ringrun's stdout or stderr with a `[rank R]`
//! prefix.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How long ringrun waits, after the ranks exit, for their last output lines.
const DRAIN: Duration = Duration::from_secs(2);

/// Copies a rank's output, prefixed, and reports on `done` when the stream ends.
pub(crate) fn forward_lines(
    rank: usize,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    done: mpsc::Sender<()>,
) {
    let copy = move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if to_stderr {
                let _ = writeln!(io::stderr().lock(), "[rank {rank}] {line}");
            } else {
                let _ = writeln!(io::stdout().lock(), "[rank {rank}] {line}");
            }
        }
        let _ = done.send(());
    };
    if let Err(e) = thread::Builder::new()
        .name(format!("rank-{rank}-output"))
        .spawn(copy)
    {
        crate::say!("cannot copy rank {rank}'s output (no thread: {e}); it is lost");
    }
}

/// Waits (boundedly: a process that left the rank's group may keep its pipes open) until
/// every forwarded stream has been printed to the end.
pub(crate) fn drain(streams: usize, done: &mpsc::Receiver<()>) {
    let deadline = Instant::now() + DRAIN;
    for _ in 0..streams {
        if done
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_err()
        {
            return;
        }
    }
}
