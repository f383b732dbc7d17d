//! Processes that read each other's buffers: how many calls did, and a rank killed in
//! the middle of a stream of calls, named by the survivors.

use std::time::{Duration, Instant};

use ringccl::{Error, ProcessGroup};

use super::RESULT_PREFIX;

/// In a child process: rank `killed` SIGKILLs itself 150 ms into a stream of `call`s
/// (in the middle of one); every other rank runs `call` until it fails, then prints
/// whom its error names and whether that call failed within 10 s, for
/// [`assert_named_by_survivors`].
pub fn stream_until_killed(
    pg: &ProcessGroup,
    killed: usize,
    mut call: impl FnMut() -> Result<(), Error>,
) {
    let rank = pg.rank();
    if rank == killed {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            // SAFETY: sends SIGKILL to this process, which the harness expects.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
        loop {
            let _ = call();
        }
    }
    let mut calls = 0;
    let (error, took) = loop {
        let started = Instant::now();
        match call() {
            Ok(()) => calls += 1,
            Err(e) => break (e, started.elapsed()),
        }
    };
    let named = match &error {
        Error::PeerLost { rank, .. } => Some(*rank),
        Error::GroupAborted { by, cause, .. } => cause.as_ref().map(|c| c.rank).or(Some(*by)),
        other => other.likely_cause(),
    };
    eprintln!("rank {rank} after {calls} calls, in {took:?}: {error}");
    println!("{RESULT_PREFIX}named {named:?}");
    println!(
        "{RESULT_PREFIX}within 10 s: {}",
        took < Duration::from_secs(10)
    );
}

/// In the parent: every rank but `killed` named it, within 10 s.
pub fn assert_named_by_survivors(lines: &[Vec<String>], killed: usize) {
    for (rank, lines) in lines.iter().enumerate().filter(|&(r, _)| r != killed) {
        assert!(
            lines.contains(&format!("named Some({killed})")),
            "rank {rank}: {lines:?}"
        );
        assert!(
            lines.contains(&"within 10 s: true".to_string()),
            "rank {rank}: {lines:?}"
        );
    }
}

/// How many calls of this rank's group read the peers' buffers, from its flight recorder.
pub fn calls_reading_peers(pg: &ProcessGroup) -> usize {
    let recorder = pg.flight_recorder().expect("a flight recorder");
    recorder
        .snapshot("counted")
        .entries
        .iter()
        .filter(|e| e.algorithm.as_deref() == Some("peer_memory"))
        .count()
}
