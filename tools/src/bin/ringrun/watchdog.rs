//! The watchdog: a copy of ringrun, started before any rank, that kills the ranks' process
//! groups if ringrun dies without stopping them — SIGKILL included.
//!
//! The kernel's parent-death signal (see `spawn`) kills each rank's own process when
//! ringrun dies, but not what the rank started: a fork does not inherit that setting. The
//! watchdog covers them. ringrun tells it, on a pipe, each process group it starts
//! (`+PGID`) and each one it has seen empty (`-PGID`). The pipe's write end lives only in
//! ringrun, so the watchdog reads end-of-file exactly when ringrun has exited, however it
//! died; it then SIGKILLs every group still listed. After a normal exit that list is
//! empty and the watchdog kills nothing.
//!
//! The watchdog runs in a process group of its own and ignores SIGINT, SIGTERM and SIGHUP,
//! so a Ctrl-C or a `kill` aimed at ringrun's group does not take it away first.

use std::collections::BTreeSet;
use std::io::{self, BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::process_group::{self, Pid};
use crate::signals;

/// The argument that makes `ringrun` run as the watchdog (not for users).
pub(crate) const WATCHDOG_ARG: &str = "--internal-watchdog";

/// How long the watchdog waits for killed groups to disappear before giving up on them.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long ringrun waits for the watchdog to exit after ringrun closes its pipe.
const EXIT_WAIT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(20);

/// ringrun's handle on its watchdog.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts the watchdog (ringrun itself, re-executed with [`WATCHDOG_ARG`]).
    pub(crate) fn start() -> io::Result<Self> {
        // /proc/self/exe still names this binary if its file was replaced meanwhile.
        let mut child = Command::new("/proc/self/exe")
            .arg0("ringrun")
            .arg(WATCHDOG_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        Ok(Self { child, pipe })
    }

    /// Asks the watchdog to kill group `pgid` should ringrun die.
    pub(crate) fn watch(&mut self, pgid: Pid) {
        self.tell(&format!("+{pgid}"));
    }

    /// Tells the watchdog that group `pgid` is empty: it must not be signalled any more.
    pub(crate) fn forget(&mut self, pgid: Pid) {
        self.tell(&format!("-{pgid}"));
    }

    fn tell(&mut self, line: &str) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        // A line of a few bytes is written atomically; the watchdog reads as fast as
        // ringrun starts processes, so the pipe never fills.
        if let Err(e) = writeln!(pipe, "{line}") {
            crate::say!(
                "the watchdog (pid {}) is gone ({e}): if ringrun is killed now, processes the \
                 ranks started may survive it",
                self.child.id()
            );
            self.pipe = None;
        }
    }

    /// Closes the pipe (the watchdog kills whatever is still listed, normally nothing) and
    /// waits briefly for the watchdog to exit.
    pub(crate) fn finish(mut self) {
        self.pipe = None;
        let deadline = Instant::now() + EXIT_WAIT;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            thread::sleep(POLL);
        }
    }
}

/// The watchdog's own main: reads `+PGID` / `-PGID` lines until ringrun's end, then kills
/// every group still listed.
pub(crate) fn run() -> ExitCode {
    signals::ignore_forwarded();
    let mut groups = BTreeSet::new();
    // The read ends when ringrun has exited, for any reason; an I/O error ends it too.
    for line in io::stdin().lock().lines().map_while(Result::ok) {
        if let Some(Ok(pgid)) = line.strip_prefix('+').map(str::parse::<Pid>) {
            groups.insert(pgid);
        } else if let Some(Ok(pgid)) = line.strip_prefix('-').map(str::parse::<Pid>) {
            groups.remove(&pgid);
        }
    }
    let groups: Vec<Pid> = groups.into_iter().collect();
    let alive = process_group::live_groups(&groups);
    if alive.is_empty() {
        return ExitCode::SUCCESS;
    }
    say_watchdog(&format!(
        "ringrun exited without stopping its ranks; killing process groups {alive:?}"
    ));
    for &pgid in &alive {
        process_group::signal_group(pgid, libc::SIGKILL);
    }
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let left = process_group::live_groups(&alive);
        if left.is_empty() {
            return ExitCode::SUCCESS;
        }
        if Instant::now() >= deadline {
            say_watchdog(&format!(
                "process groups {left:?} still have live processes {KILL_WAIT:?} after SIGKILL \
                 (stuck in the kernel?); see `ps -o pid,stat,wchan,cmd -g PGID`"
            ));
            return ExitCode::FAILURE;
        }
        thread::sleep(POLL);
    }
}

fn say_watchdog(message: &str) {
    let _ = writeln!(io::stderr().lock(), "ringrun (watchdog): {message}");
}
