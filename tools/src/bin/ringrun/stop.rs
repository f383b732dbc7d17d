//! Stopping ranks: a signal to each rank's whole process group, SIGKILL to what is left
//! after the grace period, and confirmation that every process is gone.

use std::thread;
use std::time::{Duration, Instant};

use crate::process_group::{self, Pid};
use crate::signals;
use crate::spawn::Rank;
use crate::watchdog::Watchdog;

/// How long ranks get to exit after the first signal before they are killed.
pub(crate) const GRACE: Duration = Duration::from_secs(5);
/// How long ringrun waits for killed processes to disappear before giving up on them.
const KILL_WAIT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(20);

/// Stops every process of `ranks`: the ranks still running and whatever any rank started
/// in its process group. Sends `signal`, waits up to [`GRACE`] (less if another signal
/// reaches ringrun meanwhile), then SIGKILLs what is left. Groups seen empty are
/// withdrawn from the watchdog. Returns the signal that cut the grace period short, if
/// one did, so that the caller does not restart a job the user asked to stop.
pub(crate) fn stop(ranks: &mut [Rank], signal: i32, watchdog: &mut Watchdog) -> Option<i32> {
    for r in ranks.iter_mut() {
        if r.poll().is_some() && !r.is_gone() {
            crate::say!(
                "rank {} exited but left processes running in its process group {}; stopping them",
                r.rank,
                r.pgid
            );
        }
    }
    for r in ranks.iter_mut() {
        r.signal(signal);
    }
    let ended = wait_until_gone(ranks, GRACE, true);
    if ended != Wait::Gone {
        let why = match ended {
            Wait::Interrupted(received) => format!("got {}", signals::name(received)),
            _ => format!("{GRACE:?} after {}", signals::name(signal)),
        };
        crate::say!("{why}: sending SIGKILL to rank(s) {}", still_running(ranks));
        for r in ranks.iter_mut() {
            r.signal(libc::SIGKILL);
        }
        if wait_until_gone(ranks, KILL_WAIT, false) != Wait::Gone {
            crate::say!(
                "rank(s) {} still have live processes {KILL_WAIT:?} after SIGKILL (stuck in \
                 the kernel?); see `ps -o pid,stat,wchan,cmd -g PGID`",
                still_running(ranks)
            );
        }
    }
    for r in ranks.iter_mut() {
        if r.is_gone() {
            watchdog.forget(r.pgid);
        }
    }
    match ended {
        Wait::Interrupted(received) => Some(received),
        _ => None,
    }
}

/// How waiting for ranks to disappear ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Gone,
    TimedOut,
    Interrupted(i32),
}

/// Polls until every rank is reaped and its group empty, or `limit` passes. With
/// `escalate`, a signal reaching ringrun ends the wait early (a second Ctrl-C kills).
fn wait_until_gone(ranks: &mut [Rank], limit: Duration, escalate: bool) -> Wait {
    let deadline = Instant::now() + limit;
    loop {
        if all_gone(ranks) {
            return Wait::Gone;
        }
        if escalate {
            if let Some(received) = signals::take_pending() {
                return Wait::Interrupted(received);
            }
        }
        if Instant::now() >= deadline {
            return Wait::TimedOut;
        }
        thread::sleep(POLL);
    }
}

/// Whether every rank is reaped and its group empty (one look at `/proc` for all).
fn all_gone(ranks: &mut [Rank]) -> bool {
    if ranks.iter_mut().any(|r| r.poll().is_none()) {
        return false;
    }
    let groups: Vec<Pid> = ranks.iter().map(|r| r.pgid).collect();
    process_group::live_groups(&groups).is_empty()
}

/// "1 (process group 1234), 3 (process group 1240)".
fn still_running(ranks: &mut [Rank]) -> String {
    ranks
        .iter_mut()
        .filter_map(|r| (!r.is_gone()).then(|| format!("{} (process group {})", r.rank, r.pgid)))
        .collect::<Vec<_>>()
        .join(", ")
}
