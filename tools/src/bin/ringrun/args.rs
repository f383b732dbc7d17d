//! ringrun's command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// The launcher's flags, named as torchrun names them (both `--nproc-per-node` and
/// `--nproc_per_node` are accepted).
#[derive(Parser, Debug)]
#[command(
    name = "ringrun",
    version,
    about = "Start the ranks of a distributed job on this node (torchrun-compatible environment)",
    after_help = "Each rank runs in its own process group: stopping a rank stops the processes it \
started too. If ringrun dies, even by SIGKILL, its ranks and their children are killed. \
SIGINT, SIGTERM and SIGHUP are forwarded to every rank's process group; ranks still \
running 5 s later are killed.

Diagnosing a stuck job: with --hang-timeout SECS, ringrun watches the ranks' progress \
beacons; when no rank has finished a collective for SECS while some rank has one in flight, \
it gathers every rank's flight record and prints one diagnosis (lines starting with \
`ringrun: DIAGNOSIS:`). `ringrun diagnose DIR` runs the same analysis on a directory of \
dumps (RINGCCL_FLIGHT_DIR)."
)]
pub(crate) struct Args {
    /// Ranks to start on this node.
    #[arg(long = "nproc-per-node", alias = "nproc_per_node")]
    pub(crate) nproc_per_node: usize,
    /// Number of nodes in the job.
    #[arg(long, default_value_t = 1)]
    pub(crate) nnodes: usize,
    /// This node's index, 0..nnodes.
    #[arg(long = "node-rank", alias = "node_rank", default_value_t = 0)]
    pub(crate) node_rank: usize,
    /// Address of the node that runs rank 0.
    #[arg(
        long = "master-addr",
        alias = "master_addr",
        default_value = "127.0.0.1"
    )]
    pub(crate) master_addr: String,
    /// Port of rank 0's rendezvous store (default: a free port on a single node, 29500 otherwise).
    #[arg(long = "master-port", alias = "master_port")]
    pub(crate) master_port: Option<u16>,
    /// Restarts allowed for the whole job. When any rank fails, every rank is stopped and
    /// all are started again; each such restart uses one from this budget, whichever rank
    /// failed (it is not a per-rank budget). Ranks see the restarts so far in
    /// TORCHELASTIC_RESTART_COUNT (0 at the first start) and this value in
    /// TORCHELASTIC_MAX_RESTARTS. A rank that cannot be started at all ends the job
    /// without a restart.
    #[arg(
        long = "max-restarts",
        alias = "max_restarts",
        default_value_t = 0,
        verbatim_doc_comment
    )]
    pub(crate) max_restarts: u32,
    /// Every rank writes a Chrome trace of its collectives to DIR/rank-<r>.json (through
    /// RINGCCL_TRACE); when the job ends, ringrun merges them into DIR/trace.json, one row
    /// per rank, for Perfetto (ui.perfetto.dev) or chrome://tracing. The files an earlier
    /// job left in DIR for this node's ranks, and DIR/trace.json, are removed first.
    #[arg(long, value_name = "DIR", verbatim_doc_comment)]
    pub(crate) trace: Option<std::path::PathBuf>,
    /// Watch progress: when no rank has finished a collective for SECS (seconds, decimals
    /// allowed) while some rank has one in flight, print a diagnosis of who is stuck
    /// where. Start-up is watched too: a rank still waiting at start-up after SECS names
    /// the ranks it waits for (RINGCCL_STARTUP_REPORT, unless set already). Sets
    /// RINGCCL_FLIGHT_DIR for every rank (a fresh directory under the system's temporary
    /// directory, unless RINGCCL_FLIGHT_DIR is set already).
    #[arg(long = "hang-timeout", alias = "hang_timeout", value_name = "SECS", value_parser = parse_seconds)]
    pub(crate) hang_timeout: Option<Duration>,
    /// What to do after a hang diagnosis: `report` only, or `stop` the job as if a rank
    /// had failed (restarting it if --max-restarts allows, else exiting non-zero).
    #[arg(
        long = "hang-action",
        alias = "hang_action",
        value_enum,
        default_value_t = HangAction::Report,
        requires = "hang_timeout"
    )]
    pub(crate) hang_action: HangAction,
    /// The program and its arguments (torchrun style: everything from the program on is
    /// passed to it; a `--` before the program is accepted too).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) program: Vec<String>,
}

/// What ringrun does once it has diagnosed a hang.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum HangAction {
    /// Print the diagnosis and keep watching.
    Report,
    /// Print the diagnosis and stop the job.
    Stop,
}

/// `--hang-timeout`'s value: positive seconds, at most a year.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(seconds > 0.0 && seconds <= 365.0 * 86_400.0) {
        return Err(format!("{text} s: give a number of seconds above 0"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `ringrun diagnose DIR`: the analysis of a directory of flight dumps, offline.
#[derive(Parser, Debug)]
#[command(
    name = "ringrun diagnose",
    about = "Diagnose a stuck or failed job from its flight dumps (the files in RINGCCL_FLIGHT_DIR)",
    after_help = "Exits with 0 when the dumps show a cause (a rank holding the others up, a \
mismatch, a failure), 1 when they show none, 2 when DIR cannot be read."
)]
pub(crate) struct DiagnoseArgs {
    /// The directory holding the ranks' `rank-*.json` dumps (and `rank-*.beacon` beacons).
    pub(crate) dir: PathBuf,
}

impl Args {
    /// Checks the numbers that clap cannot: at least one rank and node, a node rank
    /// inside the job, and a world size that fits in memory's arithmetic.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.nproc_per_node == 0 || self.nnodes == 0 || self.node_rank >= self.nnodes {
            return Err(
                "need --nproc-per-node >= 1, --nnodes >= 1 and --node-rank < --nnodes".into(),
            );
        }
        if self.nnodes.checked_mul(self.nproc_per_node).is_none() {
            return Err(format!(
                "--nnodes {} x --nproc-per-node {} ranks is too many",
                self.nnodes, self.nproc_per_node
            ));
        }
        Ok(())
    }

    /// Ranks in the whole job (every node). Call after [`Args::validate`].
    pub(crate) fn world_size(&self) -> usize {
        self.nnodes.saturating_mul(self.nproc_per_node)
    }

    /// The job-wide rank of this node's `local`-th rank. Call after [`Args::validate`].
    pub(crate) fn global_rank(&self, local: usize) -> usize {
        self.node_rank
            .saturating_mul(self.nproc_per_node)
            .saturating_add(local)
    }
}
