//! ringrun's command line.

use clap::Parser;

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
running 5 s later are killed."
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
    /// The program and its arguments (torchrun style: everything from the program on is
    /// passed to it; a `--` before the program is accepted too).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(crate) program: Vec<String>,
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
