//! Watching the running ranks until the job ends: all succeed, one fails, or ringrun gets
//! a signal to forward.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::thread;
use std::time::Duration;

use crate::diagnosis::HangCheck;
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
    /// The hang watch diagnosed a hang and `--hang-action stop` asks to stop.
    Hung,
}

/// Watches `ranks` until one fails, all succeed, a signal arrives, or (with a hang check)
/// a hang is diagnosed and must stop the job. It is bounded by the job itself: the user's
/// program decides how long a rank runs.
pub(crate) fn supervise(ranks: &mut [Rank], mut hang: Option<&mut HangCheck>) -> Outcome {
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
        if hang.as_mut().is_some_and(|check| check.tick(ranks)) {
            return Outcome::Hung;
        }
        thread::sleep(POLL);
    }
}

/// "exit code 3" or "killed by signal 9 (SIGKILL)".
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => match signals::name(signal) {
            name if name.starts_with("SIG") => format!("killed by signal {signal} ({name})"),
            _ => format!("killed by signal {signal}"),
        },
        _ => status.to_string(),
    }
}
