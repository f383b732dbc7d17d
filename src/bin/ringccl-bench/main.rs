//! `ringccl-bench`: collective microbenchmark in the nccl-tests format.
//!
//! With no arguments it runs the embedded default: the gloo backend on loopback, 4 ranks
//! spawned locally, float32 sum all-reduce from 8 B to 64 MiB in steps of ×4. It prints
//! `size(B) count(elements) type redop root time(us) algbw(GB/s) busbw(GB/s) #wrong` per
//! size (plus `loop(us)` and `iters`) and an "Avg bus bandwidth" footer.
//!
//! Under `ringrun` or `torchrun` (RANK set, no `--np`) each process is one rank.
//!
//! Method (the same as `shared/peers`' scripts, so figures compare side by side): per size,
//! warm-up calls, then `-n` iterations or, by default, a calibrated ~`--budget` seconds of
//! back-to-back calls. `time` is the median over iterations of the slowest rank's time for
//! that iteration; `loop` is the slowest rank's loop time divided by the iterations.
//! algbw = bytes / time; busbw uses the nccl-tests factors (all-reduce 2(N−1)/N;
//! all-gather, reduce-scatter, all-to-all (N−1)/N; broadcast, reduce 1). `#wrong` counts,
//! over all ranks, the elements that differ from the exact expected result after `-c`
//! check iterations with rank-dependent, exactly representable inputs.

#![deny(unsafe_code)]

#[cfg(feature = "nccl")]
mod device;
mod elements;
mod launch;
mod measure;

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use elements::{expected, input, BenchElem, DTYPE_NAMES};
use launch::{launch, CHILD_VAR, PORT_PREFIX};
use measure::{overlap_rows, time_op, Iterations, Timing};
use ringccl::half::{bf16, f16};
use ringccl::{init_process_group, Error, InitOptions, ProcessGroup, ReduceOp, StoreListener};
use serde::{Serialize, Serializer};

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
struct Args {
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    factor: usize,
    /// Timed iterations per size (default: as many as fit in --budget seconds).
    #[arg(short = 'n', long = "iters")]
    iters: Option<usize>,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Check iterations per size (each compares against the exact result).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: usize,
    /// Reduction: sum, prod, min, max, avg or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: String,
    /// Element type: float, double, half, bfloat16, int8, uint8, int32, int64 or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Backend: gloo or nccl.
    #[arg(long, default_value = "gloo")]
    backend: String,
    /// Where the buffers live: host, device (GPU memory, as nccl-tests) or auto (device
    /// under nccl, host otherwise).
    #[arg(long, default_value = "auto")]
    memory: String,
    /// Spawn this many ranks locally (default 4, unless running under a launcher).
    #[arg(long)]
    np: Option<usize>,
    /// Collective: all_reduce, broadcast, barrier, reduce, all_gather, reduce_scatter,
    /// all_to_all, all_reduce_bucketed, all_reduce_separate, all_reduce_async.
    #[arg(long, default_value = "all_reduce")]
    coll: String,
    /// All-reduce algorithm: auto, ring or rd.
    #[arg(long)]
    algo: Option<String>,
    /// Transport of the gloo backend: tcp or shm (one host).
    #[arg(long)]
    transport: Option<String>,
    /// Also write one JSON object per row to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seconds of timed iterations per size when -n is not given.
    #[arg(long, default_value_t = 1.0)]
    budget: f64,
    /// Largest frame the pipelined algorithms send.
    #[arg(long, value_parser = parse_size)]
    chunk: Option<usize>,
    /// Tensors per call for all_reduce_bucketed / all_reduce_separate.
    #[arg(long, default_value_t = 1000)]
    tensors: usize,
    /// Fusion bucket size for all_reduce_bucketed.
    #[arg(long, default_value = "25M", value_parser = parse_size)]
    bucket: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coll {
    AllReduce,
    Broadcast,
    Barrier,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Bucketed,
    Separate,
    Async,
}

impl Coll {
    fn parse(name: &str) -> Result<Coll, String> {
        Ok(match name {
            "all_reduce" => Coll::AllReduce,
            "broadcast" => Coll::Broadcast,
            "barrier" => Coll::Barrier,
            "reduce" => Coll::Reduce,
            "all_gather" => Coll::AllGather,
            "reduce_scatter" => Coll::ReduceScatter,
            "all_to_all" => Coll::AllToAll,
            "all_reduce_bucketed" => Coll::Bucketed,
            "all_reduce_separate" => Coll::Separate,
            "all_reduce_async" => Coll::Async,
            other => return Err(format!("unknown --coll {other:?}")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Broadcast => "broadcast",
            Coll::Barrier => "barrier",
            Coll::Reduce => "reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
            Coll::Bucketed => "all_reduce_bucketed",
            Coll::Separate => "all_reduce_separate",
            Coll::Async => "all_reduce_async",
        }
    }

    /// nccl-tests' bus-bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce | Coll::Bucketed | Coll::Separate | Coll::Async => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce => 1.0,
            Coll::Barrier => 0.0,
        }
    }

    fn reduces(self) -> bool {
        !matches!(
            self,
            Coll::Broadcast | Coll::Barrier | Coll::AllGather | Coll::AllToAll
        )
    }
}

fn parse_ops(text: &str) -> Result<Vec<ReduceOp>, String> {
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

fn sizes(args: &Args) -> Vec<usize> {
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

pub(crate) fn main() -> ExitCode {
    ringccl::logging::init_from_env();
    let args = Args::parse();
    let result = if std::env::var_os(CHILD_VAR).is_some() {
        run_rank(&args, true)
    } else if let Some(np) = args.np {
        if np == 0 {
            Err("--np must be at least 1".into())
        } else {
            launch(np)
        }
    } else if std::env::var_os("RANK").is_some() {
        run_rank(&args, false)
    } else {
        launch(4)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringccl-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

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
    if let Some(transport) = &args.transport {
        opts = opts.transport(transport.parse().map_err(|e: Error| e.to_string())?);
    }
    init_process_group(&args.backend, opts).map_err(|e| e.to_string())
}

/// Where device buffers live (a CUDA stream), when the benchmark uses them.
#[cfg(feature = "nccl")]
type DeviceStream = std::sync::Arc<ringccl::cudarc::driver::CudaStream>;
/// Without the `nccl` feature there are no device buffers.
#[cfg(not(feature = "nccl"))]
enum DeviceStream {}

/// The stream for `--memory device` (or `auto` under nccl), or `None` for host buffers.
fn device_stream(
    args: &Args,
    pg: &ProcessGroup,
    coll: Coll,
) -> Result<Option<DeviceStream>, String> {
    let wanted = match args.memory.as_str() {
        "host" => false,
        "device" => true,
        // Collectives without a device method are measured on host buffers.
        "auto" => pg.backend() == "nccl" && cfg!(feature = "nccl") && device_capable(coll),
        other => {
            return Err(format!(
                "unknown --memory {other:?}: use host, device or auto"
            ))
        }
    };
    if !wanted {
        return Ok(None);
    }
    if !device_capable(coll) {
        return Err(format!(
            "--memory device does not support --coll {}",
            coll.name()
        ));
    }
    #[cfg(feature = "nccl")]
    return device::stream_for(pg).map(Some).map_err(|e| e.to_string());
    #[cfg(not(feature = "nccl"))]
    Err("--memory device needs ringccl built with its `nccl` feature".into())
}

fn device_capable(coll: Coll) -> bool {
    #[cfg(feature = "nccl")]
    return device::supports(coll);
    #[cfg(not(feature = "nccl"))]
    {
        let _ = coll;
        false
    }
}

/// One row of the table; also one line (a JSON object) of the `--json` file.
#[derive(Serialize)]
struct Row<'a> {
    coll: &'static str,
    backend: &'a str,
    nranks: usize,
    size: usize,
    count: usize,
    #[serde(rename = "type")]
    dtype: &'static str,
    redop: &'static str,
    root: i64,
    #[serde(serialize_with = "three_decimals")]
    time_us: f64,
    #[serde(serialize_with = "six_decimals")]
    algbw_gbps: f64,
    #[serde(serialize_with = "six_decimals")]
    busbw_gbps: f64,
    wrong: i64,
    #[serde(serialize_with = "three_decimals")]
    loop_us: f64,
    iters: usize,
}

/// Rounds for the JSON file to the precision it has always had (µs to ns, GB/s to KB/s).
fn rounded<S: Serializer>(value: f64, decimals: i32, out: S) -> Result<S::Ok, S::Error> {
    let scale = 10f64.powi(decimals);
    out.serialize_f64((value * scale).round() / scale)
}

fn three_decimals<S: Serializer>(value: &f64, out: S) -> Result<S::Ok, S::Error> {
    rounded(*value, 3, out)
}

fn six_decimals<S: Serializer>(value: &f64, out: S) -> Result<S::Ok, S::Error> {
    rounded(*value, 6, out)
}

/// What one rank prints and records.
struct Report {
    rank0: bool,
    json: Option<File>,
    busbw_sum: f64,
    rows: usize,
    wrong: i64,
}

impl Report {
    fn row(&mut self, row: &Row<'_>) -> Result<(), String> {
        self.busbw_sum += row.busbw_gbps;
        self.rows += 1;
        self.wrong += row.wrong;
        if !self.rank0 {
            return Ok(());
        }
        println!(
            "{:>12} {:>12} {:>8} {:>6} {:>5} {:>10.1} {:>10.3} {:>10.3} {:>7} {:>10.1} {:>7}",
            row.size,
            row.count,
            row.dtype,
            row.redop,
            row.root,
            row.time_us,
            row.algbw_gbps,
            row.busbw_gbps,
            row.wrong,
            row.loop_us,
            row.iters
        );
        let _ = std::io::stdout().flush();
        if let Some(file) = &mut self.json {
            let line =
                serde_json::to_string(row).map_err(|e| format!("encoding a JSON row: {e}"))?;
            writeln!(file, "{line}").map_err(|e| format!("writing the JSON file: {e}"))?;
        }
        Ok(())
    }
}

fn count_wrong<T: BenchElem>(got: &[T], want: impl Fn(usize) -> T) -> i64 {
    got.iter()
        .enumerate()
        .filter(|&(i, x)| bytemuck::bytes_of(x) != bytemuck::bytes_of(&want(i)))
        .count() as i64
}

/// Test hook: `RINGCCL_BENCH_INJECT_FAULT=1` makes rank 0 corrupt one element of each
/// check result, to prove that `#wrong` notices.
fn inject_fault<T: BenchElem>(rank: usize, buf: &mut [T]) {
    if rank == 0 && std::env::var_os("RINGCCL_BENCH_INJECT_FAULT").is_some() {
        if let Some(first) = buf.first_mut() {
            *first = T::combine(*first, T::from_small(1), ReduceOp::Sum);
        }
    }
}

/// One check iteration of `coll` on `count` elements; wrong elements summed over ranks.
fn check<T: BenchElem>(
    pg: &ProcessGroup,
    coll: Coll,
    count: usize,
    op: ReduceOp,
    tensors: usize,
) -> Result<i64, Error> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let mine: Vec<T> = (0..count).map(|i| input(rank, i, op)).collect();
    let per = count / n;
    let wrong = match coll {
        Coll::AllReduce | Coll::Async => {
            let mut buf = mine;
            pg.all_reduce(&mut buf, op)?;
            inject_fault(rank, &mut buf);
            count_wrong(&buf, |i| expected(n, i, op))
        }
        Coll::Bucketed | Coll::Separate => {
            let len = (count / tensors.max(1)).max(1);
            let mut parts: Vec<Vec<T>> = mine.chunks(len).map(<[T]>::to_vec).collect();
            let mut views: Vec<&mut [T]> = parts.iter_mut().map(|p| &mut p[..]).collect();
            pg.all_reduce_bucketed(&mut views, op, 25 << 20)?;
            let mut flat = parts.concat();
            inject_fault(rank, &mut flat);
            count_wrong(&flat, |i| expected(n, i, op))
        }
        Coll::Broadcast => {
            let mut buf = mine;
            pg.broadcast(&mut buf, 0)?;
            inject_fault(rank, &mut buf);
            count_wrong(&buf, |i| input(0, i, op))
        }
        Coll::Reduce => {
            let mut buf = mine;
            pg.reduce(&mut buf, op, 0)?;
            inject_fault(rank, &mut buf);
            if rank == 0 {
                count_wrong(&buf, |i| expected(n, i, op))
            } else {
                0
            }
        }
        Coll::AllGather => {
            let mut out = vec![T::from_small(0); per * n];
            pg.all_gather(&mine[..per], &mut out)?;
            inject_fault(rank, &mut out);
            count_wrong(&out, |j| input(j / per.max(1), j % per.max(1), op))
        }
        Coll::ReduceScatter => {
            let mut out = vec![T::from_small(0); per];
            pg.reduce_scatter(&mine[..per * n], &mut out, op)?;
            inject_fault(rank, &mut out);
            count_wrong(&out, |i| expected(n, rank * per + i, op))
        }
        Coll::AllToAll => {
            let mut out = vec![T::from_small(0); per * n];
            pg.all_to_all(&mine[..per * n], &mut out)?;
            inject_fault(rank, &mut out);
            count_wrong(&out, |j| {
                input(j / per.max(1), rank * per + j % per.max(1), op)
            })
        }
        Coll::Barrier => 0,
    };
    let mut total = [wrong];
    pg.all_reduce(&mut total, ReduceOp::Sum)?;
    Ok(total[0])
}

/// Every size for one element type and operator.
fn sweep<T: BenchElem>(
    pg: &ProcessGroup,
    args: &Args,
    coll: Coll,
    op: ReduceOp,
    on_device: Option<&DeviceStream>,
    report: &mut Report,
) -> Result<(), Error> {
    let (n, rank0) = (pg.world_size(), pg.rank() == 0);
    let es = T::DTYPE.size();
    let iterations = match args.iters {
        Some(n) => Iterations::Fixed(n),
        None => Iterations::Budget(args.budget),
    };
    let all_sizes = if coll == Coll::Barrier {
        vec![0]
    } else {
        sizes(args)
    };
    let total = all_sizes.len();
    for (k, bytes) in all_sizes.into_iter().enumerate() {
        if rank0 && total > 1 {
            eprintln!(
                "ringccl-bench: {} {} {} {bytes} B ({}/{total})",
                coll.name(),
                T::NAME,
                op,
                k + 1
            );
        }
        let mut count = (bytes / es).max(usize::from(coll != Coll::Barrier));
        if matches!(coll, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll) {
            count = (count / n).max(1) * n;
        }
        let (wrong, timing) = match on_device {
            #[cfg(feature = "nccl")]
            Some(device) => device::measure::<T>(
                pg,
                device,
                coll,
                count,
                op,
                args.check,
                args.warmup,
                iterations,
            )?,
            #[cfg(not(feature = "nccl"))]
            Some(device) => match *device {},
            None => measure_host::<T>(pg, args, coll, count, op, iterations)?,
        };
        let root = if matches!(coll, Coll::Broadcast | Coll::Reduce) {
            0
        } else {
            -1
        };
        let size = count * es;
        let algbw_gbps = size as f64 / timing.median_us / 1e3;
        report
            .row(&Row {
                coll: coll.name(),
                backend: pg.backend(),
                nranks: n,
                size,
                count,
                dtype: T::NAME,
                redop: if coll.reduces() { op.name() } else { "none" },
                root,
                time_us: timing.median_us,
                algbw_gbps,
                busbw_gbps: algbw_gbps * coll.bus_factor(n),
                wrong,
                loop_us: timing.loop_us,
                iters: timing.iters,
            })
            .map_err(Error::InvalidArgument)?;
    }
    Ok(())
}

/// Checks and times `coll` on host buffers of `count` elements: the wrong elements
/// summed over ranks, and the timing.
fn measure_host<T: BenchElem>(
    pg: &ProcessGroup,
    args: &Args,
    coll: Coll,
    count: usize,
    op: ReduceOp,
    iterations: Iterations,
) -> Result<(i64, Timing), Error> {
    let mut wrong = 0;
    for _ in 0..args.check {
        wrong += check::<T>(pg, coll, count, op, args.tensors)?;
    }
    let per = count / pg.world_size();
    let mut buf: Vec<T> = (0..count).map(|i| input(pg.rank(), i, op)).collect();
    let mut out = vec![T::from_small(0); count];
    let tensor_len = (count / args.tensors.max(1)).max(1);
    let timing = time_op(pg, args.warmup, iterations, || match coll {
        Coll::AllReduce | Coll::Async => pg.all_reduce(&mut buf, op),
        Coll::Broadcast => pg.broadcast(&mut buf, 0),
        Coll::Barrier => pg.barrier(),
        Coll::Reduce => pg.reduce(&mut buf, op, 0),
        Coll::AllGather => pg.all_gather(&buf[..per], &mut out),
        Coll::ReduceScatter => pg.reduce_scatter(&buf, &mut out[..per], op),
        Coll::AllToAll => pg.all_to_all(&buf, &mut out),
        Coll::Bucketed => {
            let mut views: Vec<&mut [T]> = buf.chunks_mut(tensor_len).collect();
            pg.all_reduce_bucketed(&mut views, op, args.bucket)
        }
        Coll::Separate => buf
            .chunks_mut(tensor_len)
            .try_for_each(|t| pg.all_reduce(t, op)),
    })?;
    Ok((wrong, timing))
}

fn sweep_dtype(
    pg: &ProcessGroup,
    args: &Args,
    coll: Coll,
    dtype: &str,
    op: ReduceOp,
    on_device: Option<&DeviceStream>,
    report: &mut Report,
) -> Result<(), Error> {
    let d = on_device;
    match dtype {
        "float" => sweep::<f32>(pg, args, coll, op, d, report),
        "double" => sweep::<f64>(pg, args, coll, op, d, report),
        "half" => sweep::<f16>(pg, args, coll, op, d, report),
        "bfloat16" => sweep::<bf16>(pg, args, coll, op, d, report),
        "int8" => sweep::<i8>(pg, args, coll, op, d, report),
        "uint8" => sweep::<u8>(pg, args, coll, op, d, report),
        "int32" => sweep::<i32>(pg, args, coll, op, d, report),
        "int64" => sweep::<i64>(pg, args, coll, op, d, report),
        other => Err(Error::InvalidArgument(format!(
            "unknown -d {other:?}: use one of {} or all",
            DTYPE_NAMES.join(", ")
        ))),
    }
}

fn run_rank(args: &Args, own_launcher: bool) -> Result<(), String> {
    let coll = Coll::parse(&args.coll)?;
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
    let pg = join_group(args, own_launcher)?;
    let n = pg.world_size();
    let rank0 = pg.rank() == 0;
    let err = |e: Error| e.to_string();
    let on_device = device_stream(args, &pg, coll)?;
    if rank0 {
        println!(
            "# ringccl-bench {}: backend {}, {n} ranks, {} memory, transport {}, all-reduce algorithm {}",
            coll.name(),
            pg.backend(),
            if on_device.is_some() { "device" } else { "host" },
            args.transport
                .as_deref()
                .or(std::env::var("RINGCCL_TRANSPORT").ok().as_deref())
                .unwrap_or("auto"),
            args.algo.as_deref().unwrap_or("auto")
        );
    }
    if coll == Coll::Async {
        if rank0 {
            println!("# overlap: compute calibrated to about the all-reduce's time; times are medians of the slowest rank");
            println!(
                "#{:>11} {:>8} {:>12} {:>12} {:>14} {:>14} {:>10}",
                "size(B)",
                "compute",
                "comm(us)",
                "compute(us)",
                "sequential(us)",
                "overlapped(us)",
                "speedup"
            );
        }
        for bytes in sizes(args) {
            let count = (bytes / 4).max(1);
            let wrong = check::<f32>(&pg, coll, count, ReduceOp::Sum, args.tensors).map_err(err)?;
            if wrong > 0 {
                return Err(format!("{wrong} wrong elements"));
            }
            for row in overlap_rows(&pg, count, 7).map_err(err)? {
                if rank0 {
                    println!("{row}");
                }
            }
        }
        return pg.barrier().map_err(err);
    }
    let json = match (&args.json, rank0) {
        (Some(path), true) => {
            Some(File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?)
        }
        _ => None,
    };
    let mut report = Report {
        rank0,
        json,
        busbw_sum: 0.0,
        rows: 0,
        wrong: 0,
    };
    if rank0 {
        if matches!(coll, Coll::Bucketed | Coll::Separate) {
            println!(
                "# {} tensors per call, size = all tensors together",
                args.tensors
            );
        }
        println!("# time = median over iterations of the slowest rank; loop = slowest rank's loop time / iterations");
        println!(
            "#{:>11} {:>12} {:>8} {:>6} {:>5} {:>10} {:>10} {:>10} {:>7} {:>10} {:>7}",
            "size(B)",
            "count",
            "type",
            "redop",
            "root",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            "#wrong",
            "loop(us)",
            "iters"
        );
    }
    for dtype in dtypes {
        for &op in &ops {
            let is_float = matches!(dtype, "float" | "double" | "half" | "bfloat16");
            if op == ReduceOp::Avg && !is_float {
                if rank0 {
                    println!("# skipped: avg is not defined for {dtype}");
                }
                continue;
            }
            sweep_dtype(&pg, args, coll, dtype, op, on_device.as_ref(), &mut report)
                .map_err(err)?;
        }
    }
    if rank0 {
        println!(
            "# Out of bounds values : {} {}",
            report.wrong,
            if report.wrong == 0 { "OK" } else { "FAILED" }
        );
        println!(
            "# Avg bus bandwidth    : {:.4}",
            report.busbw_sum / report.rows.max(1) as f64
        );
    }
    pg.barrier().map_err(err)?;
    if report.wrong > 0 {
        return Err(format!("{} wrong elements", report.wrong));
    }
    Ok(())
}
