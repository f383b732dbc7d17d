//! One rank's run: join the group, then measure what the command line asks for. Or, with
//! `--transport memory`, every rank on a thread of this process (`ringccl::local_groups`).

use std::time::Duration;

use ringccl::{
    init_process_group, local_groups_with, run_local_ranks, Error, InitOptions, ProcessGroup,
    ReduceOp, StoreListener,
};

use super::args::{parse_ops, Args};
use super::bench_op::BenchOp;
use super::elements::DTYPE_NAMES;
use super::launch::PORT_PREFIX;
use super::memory::device_stream;
use super::overlap::run_overlap;
use super::report::Report;
use super::sweep::sweep_dtype;

/// The `--transport` that puts the ranks on threads of one process.
pub(crate) const IN_PROCESS: &str = "memory";

/// Runs this process as one rank; `own_launcher` when `--np` started it.
pub(crate) fn run_rank(args: &Args, own_launcher: bool) -> Result<(), String> {
    let pg = join_group(args, own_launcher)?;
    measure_on(args, &pg, own_launcher)
}

/// Runs `n` ranks on threads of this process, connected in memory.
pub(crate) fn run_threads(args: &Args, n: usize) -> Result<(), String> {
    let opts = tuned(args, InitOptions::new(0, n, "127.0.0.1:0"))?;
    let groups = local_groups_with(&args.backend, n, opts).map_err(|e| e.to_string())?;
    run_local_ranks(groups, |pg| measure_on(args, &pg, false)).map_err(|e| e.to_string())?;
    Ok(())
}

/// Measures what the command line asks for, as one rank of `pg`.
fn measure_on(args: &Args, pg: &ProcessGroup, own_launcher: bool) -> Result<(), String> {
    let coll = BenchOp::parse(&args.coll)?;
    let ops = if coll.reduces() {
        parse_ops(&args.op)?
    } else {
        vec![ReduceOp::Sum]
    };
    let dtypes: Vec<&str> = if args.dtype == "all" {
        DTYPE_NAMES.to_vec()
    } else {
        vec![args.dtype.as_str()]
    };
    let n = pg.world_size();
    let rank0 = pg.rank() == 0;
    let err = |e: Error| e.to_string();
    let on_device = device_stream(args, pg, coll)?;
    if rank0 {
        println!(
            "# ringccl-bench {}: backend {}, {n} ranks, {} memory, transport {}, all-reduce algorithm {}",
            coll.name(),
            pg.backend(),
            match (&on_device, args.memory.as_str()) {
                (Some(_), _) => "device",
                (None, "shared") => "shared",
                _ => "host",
            },
            args.transport
                .as_deref()
                .or(std::env::var("RINGCCL_TRANSPORT").ok().as_deref())
                .unwrap_or("auto"),
            args.algo.as_deref().unwrap_or("auto")
        );
    }
    if coll == BenchOp::Async {
        return run_overlap(pg, args);
    }
    let mut report = Report::create(rank0, own_launcher, args.json.as_deref())?;
    report.print_header(coll, args.tensors);
    for dtype in dtypes {
        for &op in &ops {
            let is_float = matches!(dtype, "float" | "double" | "half" | "bfloat16");
            if op == ReduceOp::Avg && !is_float {
                if rank0 {
                    println!("# skipped: avg is not defined for {dtype}");
                }
                continue;
            }
            sweep_dtype(pg, args, coll, dtype, op, on_device.as_ref(), &mut report).map_err(err)?;
        }
    }
    report.print_footer();
    pg.barrier().map_err(err)?;
    if report.wrong() > 0 {
        return Err(format!("{} wrong elements", report.wrong()));
    }
    Ok(())
}

/// Joins the group: from the environment, or as rank 0 of a group this binary launched
/// (which binds the store and announces its port).
fn join_group(args: &Args, own_launcher: bool) -> Result<ProcessGroup, String> {
    let mut opts = if own_launcher && std::env::var("RANK").as_deref() == Ok("0") {
        // Rank 0 binds the store on a free port and tells the launcher, which passes
        // the real port to the other ranks.
        let listener = StoreListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("{PORT_PREFIX}{}", addr.port());
        let world: usize = std::env::var("WORLD_SIZE")
            .ok()
            .and_then(|w| w.parse().ok())
            .ok_or("WORLD_SIZE not set by the launcher")?;
        InitOptions::new(0, world, &addr.to_string()).store_listener(listener)
    } else {
        InitOptions::from_env().map_err(|e| e.to_string())?
    };
    opts = tuned(args, opts)?;
    if let Some(transport) = &args.transport {
        opts = opts.transport(transport.parse().map_err(|e: Error| e.to_string())?);
    }
    init_process_group(&args.backend, opts).map_err(|e| e.to_string())
}

/// `opts` with the deadline, chunk and algorithm the command line asks for.
fn tuned(args: &Args, mut opts: InitOptions) -> Result<InitOptions, String> {
    opts = opts.timeout(Duration::from_secs(600));
    if let Some(chunk) = args.chunk {
        opts = opts.chunk_bytes(chunk);
    }
    if let Some(algo) = &args.algo {
        opts = opts.all_reduce_algo(
            algo.parse()
                .map_err(|e: ringccl::RuntimeError| e.to_string())?,
        );
    }
    Ok(opts)
}
