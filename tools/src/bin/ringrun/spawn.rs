//! Starting one rank: torchrun's environment, its own process group, and death with
//! ringrun (`PR_SET_PDEATHSIG`).

// pre_exec(2) runs code between fork and exec; prctl(2) and getppid(2) are FFI calls.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::SystemTime;

use crate::args::Args;
use crate::process_group::{self, Pid};

/// One started rank: its process (the leader of its own process group) and, once reaped,
/// how it ended.
#[derive(Debug)]
pub(crate) struct Rank {
    /// Job-wide rank.
    pub(crate) rank: usize,
    /// The rank's process, whose pid is also its process-group id.
    pub(crate) child: Child,
    /// The rank's process group.
    pub(crate) pgid: Pid,
    /// How the rank's process ended, once reaped.
    pub(crate) status: Option<ExitStatus>,
    /// When ringrun saw it end.
    pub(crate) ended_at: Option<SystemTime>,
}

impl Rank {
    /// Reaps the rank's process if it has exited; returns its status.
    pub(crate) fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.status = Some(status);
                self.ended_at = Some(SystemTime::now());
            }
        }
        self.status
    }

    /// Whether the rank's process has been reaped and nothing in its group is alive.
    pub(crate) fn is_gone(&mut self) -> bool {
        self.poll().is_some() && !process_group::has_live_members(self.pgid)
    }

    /// Sends `signal` to the rank's whole process group, and to the rank itself if it
    /// moved to another group. A reaped rank's empty group is left alone (its number may
    /// belong to someone else by now).
    pub(crate) fn signal(&mut self, signal: i32) {
        if self.poll().is_none() {
            process_group::signal_group(self.pgid, signal);
            if process_group::group_of(self.pgid).is_some_and(|g| g != self.pgid) {
                process_group::signal_process(self.pgid, signal);
            }
        } else if process_group::has_live_members(self.pgid) {
            process_group::signal_group(self.pgid, signal);
        }
    }
}

/// When a rank waiting at start-up first says whom it waits for.
const STARTUP_REPORT: &str = "RINGCCL_STARTUP_REPORT";

/// What one rank is started with.
#[derive(Debug, Clone)]
pub(crate) struct Launch<'a> {
    /// The store's port (MASTER_PORT).
    pub(crate) port: u16,
    /// Restarts of the job so far (TORCHELASTIC_RESTART_COUNT).
    pub(crate) restart: u32,
    /// Where the ranks write their traces (RINGCCL_TRACE), with `--trace`.
    pub(crate) trace: Option<&'a std::path::Path>,
    /// RINGCCL_FLIGHT_DIR for the ranks, when ringrun watches for hangs.
    pub(crate) flight_dir: Option<PathBuf>,
}

/// Starts this node's `local`-th rank: stdin from /dev/null, stdout and stderr piped to
/// ringrun, in a new process group of its own, killed by the kernel if ringrun dies.
/// Call from the main thread: the kernel's parent-death signal fires when the *thread*
/// that forked the child ends.
pub(crate) fn spawn_rank(args: &Args, local: usize, launch: &Launch<'_>) -> io::Result<Rank> {
    let rank = args.global_rank(local);
    let program = args.program.first().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "no program to start was given")
    })?;
    let mut command = Command::new(program);
    command
        .args(args.program.iter().skip(1))
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", local.to_string())
        .env("WORLD_SIZE", args.world_size().to_string())
        .env("LOCAL_WORLD_SIZE", args.nproc_per_node.to_string())
        .env("GROUP_RANK", args.node_rank.to_string())
        .env("GROUP_WORLD_SIZE", args.nnodes.to_string())
        .env("ROLE_NAME", "default")
        .env("ROLE_RANK", rank.to_string())
        .env("ROLE_WORLD_SIZE", args.world_size().to_string())
        .env("MASTER_ADDR", &args.master_addr)
        .env("MASTER_PORT", launch.port.to_string())
        .env("TORCHELASTIC_RESTART_COUNT", launch.restart.to_string())
        .env("TORCHELASTIC_MAX_RESTARTS", args.max_restarts.to_string());
    if let Some(dir) = launch.trace {
        command.env("RINGCCL_TRACE", dir);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(dir) = &launch.flight_dir {
        command.env("RINGCCL_FLIGHT_DIR", dir);
    }
    // Start-up is watched too: a rank still waiting after SECS names whom it waits for.
    if let Some(after) = args.hang_timeout {
        if std::env::var_os(STARTUP_REPORT).is_none() {
            command.env(STARTUP_REPORT, format!("{}", after.as_secs_f64()));
        }
    }
    die_with_launcher(&mut command);
    let child = command
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("{program:?}: {e}")))?;
    let pgid = Pid::try_from(child.id()).map_err(|_| {
        io::Error::other(format!(
            "rank {rank}'s pid {} does not fit pid_t",
            child.id()
        ))
    })?;
    Ok(Rank {
        rank,
        child,
        pgid,
        status: None,
        ended_at: None,
    })
}

/// Makes the kernel SIGKILL the child when ringrun dies, whatever kills ringrun.
fn die_with_launcher(command: &mut Command) {
    // SAFETY: getpid(2) has no preconditions.
    let launcher = unsafe { libc::getpid() };
    let hook = move || {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no memory of
        // ours; it is async-signal-safe, as code between fork and exec must be.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // If ringrun died between fork and prctl, the signal will never come: the child
        // has already been re-parented. Give up instead of running unsupervised.
        // SAFETY: getppid(2) has no preconditions and is async-signal-safe.
        if unsafe { libc::getppid() } != launcher {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook only makes async-signal-safe system calls and allocates nothing
    // (io::Error from an OS code is a plain integer), as pre_exec requires.
    unsafe {
        command.pre_exec(hook);
    }
}
