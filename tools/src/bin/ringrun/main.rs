//! `ringrun`: starts the ranks of a ringccl (or torch.distributed) job on this node, with
//! torchrun's environment variables, and cleans up after them.
//!
//! ```text
//! ringrun --nproc-per-node N [--nnodes M --node-rank K --master-addr H --master-port P]
//!         [--max-restarts R] [--trace DIR] [--hang-timeout SECS [--hang-action report|stop]]
//!         -- PROGRAM ARGS...
//! ringrun diagnose DIR
//! ```
//!
//! - **Environment.** Each rank gets torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE,
//!   LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK,
//!   ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT and
//!   TORCHELASTIC_MAX_RESTARTS, so `ringrun -- python train.py` runs a torch script as
//!   torchrun would. Every output line is prefixed with `[rank R]`.
//! - **Process groups.** Each rank runs in a process group of its own. Stopping a rank
//!   signals the whole group, so what the rank started (data loaders, `sh -c '... &'`)
//!   stops with it. Processes that leave the group (`setsid`, daemons) are not followed.
//! - **Signals.** SIGINT, SIGTERM and SIGHUP are forwarded to every rank's group; whatever
//!   is still running [`stop::GRACE`] later is SIGKILLed, at once on a second signal.
//!   ringrun then exits with 128 + the signal's number.
//! - **Failures.** When a rank fails, its last output lines (its error) are printed, then
//!   the others are stopped and ringrun names the rank and its exit status. A rank that cannot be started stops the ranks already started,
//!   and ringrun exits non-zero naming it and the reason. When every rank succeeds,
//!   processes they left running are stopped too.
//! - **Restarts.** With `--max-restarts R` a failed job is stopped and started again, up
//!   to R times *for the whole job*: each restart uses one from the budget, whichever rank
//!   failed. TORCHELASTIC_RESTART_COUNT tells the ranks how many restarts came before
//!   (0 at the first start), as under torchrun. Each node's ringrun counts the restarts of
//!   the ranks it started; a failure on one node normally fails the ranks of every node
//!   (their peer is lost), so the nodes' counts move together.
//! - **Timeline.** With `--trace DIR` every rank writes a Chrome trace (RINGCCL_TRACE);
//!   when the job ends, however it ends, ringrun merges them into `DIR/trace.json` (see
//!   [`trace`]); a call that never finished shows there as a span marked unfinished.
//! - **Hangs.** With `--hang-timeout SECS` every rank gets RINGCCL_FLIGHT_DIR, and
//!   ringrun polls the ranks' progress beacons there (see [`hang_watch`]). When no rank
//!   has finished a collective for SECS while some rank has one in flight, it asks every
//!   live rank for a flight dump (SIGUSR1), and prints one diagnosis naming who is stuck
//!   where and why (see [`diagnosis`]); `--hang-action stop` then stops the job as if a
//!   rank had failed. A failed rank gets the same diagnosis, from the live ranks' fresh
//!   dumps and the last dumps of the ranks that exited. `ringrun diagnose DIR` runs the
//!   analysis offline on the dumps in DIR.
//! - **ringrun's own death.** The ranks are started with `PR_SET_PDEATHSIG`: if ringrun
//!   dies, even by SIGKILL, the kernel kills them. A watchdog process (see [`watchdog`])
//!   then kills whatever they had started.

#![deny(unsafe_code)]

/// Prints a `ringrun: ...` message on stderr. Unlike `eprintln!`, never panics when
/// stderr is closed.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "ringrun: {}", format_args!($($arg)*));
    }};
}
pub(crate) use say;

mod args;
mod diagnose_command;
mod diagnosis;
mod flight_dir;
mod hang_watch;
mod output;
mod process_group;
mod signals;
mod spawn;
mod stop;
mod supervise;
mod trace;
mod watchdog;

use std::io;
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::mpsc;

use clap::Parser;

use args::Args;
use diagnosis::HangCheck;
use flight_dir::FlightDir;
use spawn::{Launch, Rank};
use supervise::Outcome;
use watchdog::Watchdog;

/// A job that could not be started whole: the ranks started before the failure.
struct StartFailure {
    started: Vec<Rank>,
    rank: usize,
    error: io::Error,
}

fn free_port(addr: &str) -> io::Result<u16> {
    Ok(TcpListener::bind((addr, 0))?.local_addr()?.port())
}

/// Starts every rank of this node, in order, forwarding their output; registers each
/// one's process group with the watchdog. Stops at the first rank that cannot start.
fn start_ranks(
    args: &Args,
    launch: &Launch<'_>,
    done: &mpsc::Sender<usize>,
    watchdog: &mut Watchdog,
) -> Result<Vec<Rank>, StartFailure> {
    let mut ranks = Vec::with_capacity(args.nproc_per_node);
    for local in 0..args.nproc_per_node {
        let mut rank = match spawn::spawn_rank(args, local, launch) {
            Ok(rank) => rank,
            Err(error) => {
                return Err(StartFailure {
                    started: ranks,
                    rank: args.global_rank(local),
                    error,
                })
            }
        };
        watchdog.watch(rank.pgid);
        if let Some(out) = rank.child.stdout.take() {
            output::forward_lines(rank.rank, out, false, done.clone());
        }
        if let Some(err) = rank.child.stderr.take() {
            output::forward_lines(rank.rank, err, true, done.clone());
        }
        ranks.push(rank);
    }
    Ok(ranks)
}

/// Runs the job, restarting it as `--max-restarts` allows; returns ringrun's exit code.
/// With a flight directory, hangs are watched for and failures diagnosed; `diagnosed`
/// tells whether any diagnosis was printed.
fn run_job(
    args: &Args,
    trace: Option<&std::path::Path>,
    watchdog: &mut Watchdog,
    flight: Option<&FlightDir>,
    diagnosed: &mut bool,
) -> Result<ExitCode, String> {
    for restart in 0..=args.max_restarts {
        let port = match args.master_port {
            Some(port) => port,
            None if args.nnodes == 1 => free_port(&args.master_addr)
                .map_err(|e| format!("finding a free port on {}: {e}", args.master_addr))?,
            None => 29500,
        };
        let (done, streams_done) = mpsc::channel();
        let mut streams = output::StreamEnds::new(streams_done);
        let launch = Launch {
            port,
            restart,
            trace,
            flight_dir: flight.map(|f| f.path.clone()),
        };
        let mut hang = match (flight, args.hang_timeout) {
            (Some(flight), Some(timeout)) => {
                Some(HangCheck::new(&flight.path, timeout, args.hang_action))
            }
            _ => None,
        };
        let mut ranks = match start_ranks(args, &launch, &done, watchdog) {
            Ok(ranks) => ranks,
            Err(StartFailure {
                mut started,
                rank,
                error,
            }) => {
                if started.is_empty() {
                    say!("rank {rank} could not be started ({error})");
                } else {
                    let list: Vec<String> = started
                        .iter()
                        .map(|r| format!("rank {} (pid {})", r.rank, r.pgid))
                        .collect();
                    say!(
                        "rank {rank} could not be started ({error}); stopping the ranks already \
                         started: {}",
                        list.join(", ")
                    );
                }
                stop::stop(&mut started, libc::SIGTERM, watchdog);
                streams.drain(2 * started.len());
                return Ok(ExitCode::FAILURE);
            }
        };
        let outcome = supervise::supervise(&mut ranks, hang.as_mut());
        match outcome {
            Outcome::Succeeded => {}
            Outcome::Interrupted(signal) => {
                say!("got {}, forwarding it to every rank", signals::name(signal))
            }
            Outcome::Failed { rank, status } => {
                // Its own last lines (its error) first, then ringrun's verdict.
                streams.drain_rank(rank, output::FAILED_RANK_DRAIN);
                say!(
                    "rank {rank} failed ({}); stopping the other ranks",
                    supervise::describe(status)
                );
                if let Some(hang) = hang.as_mut() {
                    hang.after_failure(&mut ranks, rank);
                }
            }
            Outcome::Hung => {}
        }
        if hang.as_ref().is_some_and(HangCheck::diagnosed) {
            *diagnosed = true;
        }
        let signal = match outcome {
            Outcome::Interrupted(signal) => signal,
            _ => libc::SIGTERM,
        };
        // Every process of this run is gone before the next run starts or ringrun exits.
        let interrupted = stop::stop(&mut ranks, signal, watchdog);
        // Print every rank's last lines before deciding what comes next.
        streams.drain(2 * ranks.len());
        // A signal while a failed run was being stopped means: stop, do not restart.
        let outcome = match (outcome, interrupted) {
            (Outcome::Failed { .. } | Outcome::Hung, Some(signal)) => Outcome::Interrupted(signal),
            (outcome, _) => outcome,
        };
        match outcome {
            Outcome::Succeeded => return Ok(ExitCode::SUCCESS),
            Outcome::Interrupted(signal) => {
                let code = u8::try_from(signal).map_or(u8::MAX, |s| 128u8.saturating_add(s));
                return Ok(ExitCode::from(code));
            }
            Outcome::Failed { .. } | Outcome::Hung if restart < args.max_restarts => say!(
                "restarting the job (restart {} of {})",
                restart + 1,
                args.max_restarts
            ),
            Outcome::Failed { .. } | Outcome::Hung => {
                if args.max_restarts > 0 {
                    say!(
                        "giving up after {} (the budget counts restarts of the whole job)",
                        restarts(args.max_restarts)
                    );
                }
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::FAILURE)
}

/// `"1 restart"`, `"3 restarts"`.
fn restarts(n: u32) -> String {
    if n == 1 {
        "1 restart".into()
    } else {
        format!("{n} restarts")
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    args.validate()?;
    let trace = args
        .trace
        .as_deref()
        .map(|dir| {
            let first = args.global_rank(0);
            trace::prepare(dir, first..first.saturating_add(args.nproc_per_node))
        })
        .transpose()
        .map_err(|e| format!("--trace: cannot prepare the trace directory: {e}"))?;
    signals::install();
    let mut watchdog = Watchdog::start().map_err(|e| {
        format!("could not start the watchdog that stops the ranks if ringrun is killed: {e}")
    })?;
    let flight = match args.hang_timeout {
        Some(_) => {
            let flight = FlightDir::prepare()?;
            say!(
                "watching for hangs; the ranks' flight records go to {} (RINGCCL_FLIGHT_DIR)",
                flight.path.display()
            );
            Some(flight)
        }
        None => None,
    };
    let mut diagnosed = false;
    let result = run_job(
        args,
        trace.as_deref(),
        &mut watchdog,
        flight.as_ref(),
        &mut diagnosed,
    );
    watchdog.finish();
    if let Some(dir) = &trace {
        trace::merge_and_report(dir);
    }
    if let Some(flight) = flight {
        let succeeded = matches!(&result, Ok(code) if *code == ExitCode::SUCCESS);
        flight.finish(diagnosed || !succeeded);
    }
    result
}

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == watchdog::WATCHDOG_ARG)
    {
        return watchdog::run();
    }
    ringccl::logging::init_from_env();
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == diagnose_command::COMMAND)
    {
        return diagnose_command::run(std::env::args_os().skip(2));
    }
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            say!("{e}");
            ExitCode::from(2)
        }
    }
}
