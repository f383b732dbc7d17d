//! Watching the running ranks until the job ends: all succeed, one fails, or ringrun gets
//! a signal to forward.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::thread;
use std::time::Duration;

use crate::signals;
use crate::spawn::Rank;

const POLL: Duration = Duration::from_millis(20);

/// How a run of the job ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    /// Every rank exited with status 0.
    Succeeded,
    /// `rank` exited unsuccessfully (the first one seen).
    Failed { rank: usize, status: ExitStatus },
    /// ringrun got this signal (SIGINT, SIGTERM or SIGHUP).
    Interrupted(i32),
}

/// Watches `ranks` until one fails, all succeed, or a signal arrives. It is bounded by the
/// job itself: the user's program decides how long a rank runs.
pub(crate) fn supervise(ranks: &mut [Rank]) -> Outcome {
    loop {
        if let Some(signal) = signals::take_pending() {
            return Outcome::Interrupted(signal);
        }
        for r in ranks.iter_mut() {
            if let Some(status) = r.poll().filter(|status| !status.success()) {
                return Outcome::Failed {
                    rank: r.rank,
                    status,
                };
            }
        }
        if ranks.iter_mut().all(|r| r.poll().is_some()) {
            return Outcome::Succeeded;
        }
        thread::sleep(POLL);
    }
}

/// "exit code 3" or "killed by signal 9".
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}
