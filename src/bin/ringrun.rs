//! `ringrun`: starts the ranks of a ringccl (or torch.distributed) job on this node, with
//! torchrun's environment variables.
//!
//! ```text
//! ringrun --nproc-per-node N [--nnodes M --node-rank K --master-addr H --master-port P]
//!         [--max-restarts R] -- PROGRAM ARGS...
//! ```
//!
//! Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
//! MASTER_PORT, TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS. Every output
//! line is prefixed with `[rank R]`. Ctrl-C and SIGTERM are forwarded to every rank. When a
//! rank fails, the others are stopped and ringrun names the rank and its exit status;
//! with `--max-restarts R` the whole group is restarted up to R times instead.

#![deny(unsafe_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

/// How long ranks get to exit after SIGTERM before they are killed.
const GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);

#[derive(Parser, Debug)]
#[command(
    name = "ringrun",
    version,
    about = "Start the ranks of a distributed job on this node (torchrun-compatible environment)"
)]
struct Args {
    /// Ranks to start on this node.
    #[arg(long = "nproc-per-node", alias = "nproc_per_node")]
    nproc_per_node: usize,
    /// Number of nodes in the job.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This node's index, 0..nnodes.
    #[arg(long = "node-rank", alias = "node_rank", default_value_t = 0)]
    node_rank: usize,
    /// Address of the node that runs rank 0.
    #[arg(
        long = "master-addr",
        alias = "master_addr",
        default_value = "127.0.0.1"
    )]
    master_addr: String,
    /// Port of rank 0's rendezvous store (default: a free port on a single node, 29500 otherwise).
    #[arg(long = "master-port", alias = "master_port")]
    master_port: Option<u16>,
    /// Restart the whole group up to this many times when a rank fails.
    #[arg(long = "max-restarts", alias = "max_restarts", default_value_t = 0)]
    max_restarts: u32,
    /// The program and its arguments (torchrun style: everything from the program on is
    /// passed to it; a `--` before the program is accepted too).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<String>,
}

mod signals {
    //! Ctrl-C / SIGTERM: remembered by an async-signal-safe handler, forwarded by the
    //! supervision loop.

    // signal(2) and kill(2) are FFI calls.
    #![allow(unsafe_code)]

    use std::sync::atomic::{AtomicI32, Ordering};

    pub(crate) static PENDING: AtomicI32 = AtomicI32::new(0);

    extern "C" fn remember(signal: libc::c_int) {
        PENDING.store(signal, Ordering::SeqCst);
    }

    pub(crate) fn install() {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: `remember` only stores to an atomic, which is async-signal-safe, and
            // has the `extern "C" fn(c_int)` signature `signal` expects.
            unsafe {
                libc::signal(signal, remember as *const () as libc::sighandler_t);
            }
        }
    }

    /// Sends `signal` to process `pid`.
    pub(crate) fn send(pid: u32, signal: i32) {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill(2) has no memory-safety preconditions; a stale pid is an error
            // we ignore (the child has exited).
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

struct Rank {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
}

enum Outcome {
    Succeeded,
    Failed { rank: usize, status: ExitStatus },
    Interrupted(i32),
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

/// How long ringrun waits, after the ranks exit, for their last output lines.
const DRAIN: Duration = Duration::from_secs(2);

/// Copies a rank's output, prefixed, and reports on `done` when the stream ends.
fn forward_lines(
    rank: usize,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    done: mpsc::Sender<()>,
) {
    thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if to_stderr {
                let _ = writeln!(io::stderr().lock(), "[rank {rank}] {line}");
            } else {
                let _ = writeln!(io::stdout().lock(), "[rank {rank}] {line}");
            }
        }
        let _ = done.send(());
    });
}

/// Waits (boundedly: a rank's own children may keep its pipes open) until every
/// forwarded stream has been printed to the end.
fn drain(streams: usize, done: &mpsc::Receiver<()>) {
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

fn free_port(addr: &str) -> io::Result<u16> {
    Ok(TcpListener::bind((addr, 0))?.local_addr()?.port())
}

fn spawn_group(
    args: &Args,
    port: u16,
    restart: u32,
    done: &mpsc::Sender<()>,
) -> io::Result<Vec<Rank>> {
    let world = args.nnodes * args.nproc_per_node;
    let mut ranks = Vec::with_capacity(args.nproc_per_node);
    for local in 0..args.nproc_per_node {
        let rank = args.node_rank * args.nproc_per_node + local;
        let mut child = Command::new(&args.program[0])
            .args(&args.program[1..])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc_per_node.to_string())
            .env("GROUP_RANK", args.node_rank.to_string())
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_RESTART_COUNT", restart.to_string())
            .env("TORCHELASTIC_MAX_RESTARTS", args.max_restarts.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("starting {:?} for rank {rank}: {e}", args.program[0]),
                )
            })?;
        if let Some(out) = child.stdout.take() {
            forward_lines(rank, out, false, done.clone());
        }
        if let Some(err) = child.stderr.take() {
            forward_lines(rank, err, true, done.clone());
        }
        ranks.push(Rank {
            rank,
            child,
            status: None,
        });
    }
    Ok(ranks)
}

fn supervise(ranks: &mut [Rank]) -> Outcome {
    loop {
        let signal = signals::PENDING.swap(0, Ordering::SeqCst);
        if signal != 0 {
            return Outcome::Interrupted(signal);
        }
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            if let Ok(Some(status)) = r.child.try_wait() {
                r.status = Some(status);
                if !status.success() {
                    return Outcome::Failed {
                        rank: r.rank,
                        status,
                    };
                }
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            return Outcome::Succeeded;
        }
        thread::sleep(POLL);
    }
}

/// Sends `signal` to every rank still running, waits up to [`GRACE`], then kills.
fn stop_all(ranks: &mut [Rank], signal: i32) {
    for r in ranks.iter().filter(|r| r.status.is_none()) {
        signals::send(r.child.id(), signal);
    }
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            if let Ok(Some(status)) = r.child.try_wait() {
                r.status = Some(status);
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            return;
        }
        thread::sleep(POLL);
    }
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        let _ = r.child.kill();
        r.status = r.child.wait().ok();
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    if args.nproc_per_node == 0 || args.nnodes == 0 || args.node_rank >= args.nnodes {
        return Err("need --nproc-per-node >= 1, --nnodes >= 1 and --node-rank < --nnodes".into());
    }
    signals::install();
    for restart in 0..=args.max_restarts {
        let port = match args.master_port {
            Some(port) => port,
            None if args.nnodes == 1 => free_port(&args.master_addr)
                .map_err(|e| format!("finding a free port on {}: {e}", args.master_addr))?,
            None => 29500,
        };
        let (done, streams_done) = mpsc::channel();
        let mut ranks = spawn_group(args, port, restart, &done).map_err(|e| e.to_string())?;
        let outcome = supervise(&mut ranks);
        match outcome {
            Outcome::Succeeded => {}
            Outcome::Interrupted(signal) => {
                eprintln!("ringrun: got signal {signal}, forwarding it to every rank");
                stop_all(&mut ranks, signal);
            }
            Outcome::Failed { rank, status } => {
                eprintln!(
                    "ringrun: rank {rank} failed ({}); stopping the other ranks",
                    describe(status)
                );
                stop_all(&mut ranks, libc::SIGTERM);
            }
        }
        // Print every rank's last lines before deciding what comes next.
        drain(2 * ranks.len(), &streams_done);
        match outcome {
            Outcome::Succeeded => return Ok(ExitCode::SUCCESS),
            Outcome::Interrupted(signal) => {
                return Ok(ExitCode::from(128u8.saturating_add(signal as u8)));
            }
            Outcome::Failed { .. } if restart < args.max_restarts => {
                eprintln!(
                    "ringrun: restarting the group (restart {} of {})",
                    restart + 1,
                    args.max_restarts
                );
            }
            Outcome::Failed { .. } => {
                if args.max_restarts > 0 {
                    eprintln!("ringrun: giving up after {} restarts", args.max_restarts);
                }
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::FAILURE)
}

fn main() -> ExitCode {
    ringccl::logging::init_from_env();
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ringrun: {e}");
            ExitCode::from(2)
        }
    }
}
