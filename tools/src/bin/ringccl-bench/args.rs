//! The command line: its options, and the sizes and operators they stand for.

use std::path::PathBuf;

use clap::Parser;
use ringccl::ReduceOp;

/// A byte count with an optional K, M or G suffix (powers of 1024).
fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<usize>()
        .map(|v| v * mult)
        .map_err(|e| format!("bad size {text:?}: {e}"))
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "ringccl-bench",
    version,
    about = "Collective microbenchmark in the nccl-tests format"
)]
pub(crate) struct Args {
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub(crate) min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    pub(crate) max_bytes: usize,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    pub(crate) factor: usize,
    /// Timed iterations per size (default: as many as fit in --budget seconds).
    #[arg(short = 'n', long = "iters")]
    pub(crate) iters: Option<usize>,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub(crate) warmup: usize,
    /// Check iterations per size (each compares against the exact result).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub(crate) check: usize,
    /// Reduction: sum, prod, min, max, avg or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub(crate) op: String,
    /// Element type: float, double, half, bfloat16, int8, uint8, int32, int64 or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub(crate) dtype: String,
    /// Backend: gloo or nccl.
    #[arg(long, default_value = "gloo")]
    pub(crate) backend: String,
    /// Where the buffers live: host (the heap), shared (`ProcessGroup::shared_buffer`:
    /// shared memory when the ranks are processes of one host), device (GPU memory, as
    /// nccl-tests) or auto (device under nccl, host otherwise).
    #[arg(long, default_value = "auto")]
    pub(crate) memory: String,
    /// Spawn this many ranks locally (default 4, unless running under a launcher).
    #[arg(long)]
    pub(crate) np: Option<usize>,
    /// Collective: all_reduce, broadcast, barrier, reduce, all_gather, reduce_scatter,
    /// all_to_all, all_reduce_bucketed, all_reduce_separate, all_reduce_async.
    #[arg(long, default_value = "all_reduce")]
    pub(crate) coll: String,
    /// All-reduce algorithm: auto, ring, rd (recursive doubling), hd (halving-doubling),
    /// hier (hierarchical) or pm (peer memory: threads with --transport memory;
    /// processes reading each other's memory through the kernel with --transport shm).
    #[arg(long)]
    pub(crate) algo: Option<String>,
    /// Transport of the gloo backend: tcp, shm (one host), or memory (the ranks on
    /// threads of this process).
    #[arg(long)]
    pub(crate) transport: Option<String>,
    /// Also write one JSON object per row to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Seconds of timed iterations per size when -n is not given.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) budget: f64,
    /// Largest frame the pipelined algorithms send.
    #[arg(long, value_parser = parse_size)]
    pub(crate) chunk: Option<usize>,
    /// Tensors per call for all_reduce_bucketed / all_reduce_separate.
    #[arg(long, default_value_t = 1000)]
    pub(crate) tensors: usize,
    /// Fusion bucket size for all_reduce_bucketed.
    #[arg(long, default_value = "25M", value_parser = parse_size)]
    pub(crate) bucket: usize,
    /// With --memory device under nccl, all_reduce only: each call returns once NCCL has
    /// it on its stream (`all_reduce_device_enqueued`), and a batch of calls is timed up
    /// to the host's wait for the last (nccl-tests' way), instead of each call waited for.
    #[arg(long)]
    pub(crate) stream_ordered: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
}

/// The `-o` operators.
pub(crate) fn parse_ops(text: &str) -> Result<Vec<ReduceOp>, String> {
    Ok(match text {
        "sum" => vec![ReduceOp::Sum],
        "prod" => vec![ReduceOp::Product],
        "min" => vec![ReduceOp::Min],
        "max" => vec![ReduceOp::Max],
        "avg" => vec![ReduceOp::Avg],
        "all" => ReduceOp::ALL.to_vec(),
        other => {
            return Err(format!(
                "unknown -o {other:?}: use sum, prod, min, max, avg or all"
            ))
        }
    })
}

/// The `-b`..`-e` sizes, ×`-f` apart, always ending at `-e`.
pub(crate) fn sizes(args: &Args) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut s = args.min_bytes.max(1);
    while s <= args.max_bytes {
        sizes.push(s);
        s = s.saturating_mul(args.factor.max(2));
    }
    if sizes.last() != Some(&args.max_bytes) && args.max_bytes >= args.min_bytes {
        sizes.push(args.max_bytes);
    }
    sizes
}
