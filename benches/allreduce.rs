//! All-reduce microbenchmark in the nccl-tests format.
//!
//! `cargo bench --bench allreduce` runs the embedded default: the gloo backend on
//! loopback, 4 ranks spawned locally as processes, float32 sum, sizes from 8 B to 64 MiB
//! in steps of ×4.
//!
//! Flags (after `--`): `--np N` ranks, `-b BYTES` / `-e BYTES` (suffixes K, M, G), `-f FACTOR`,
//! `-w WARMUP`, `--budget SECONDS` of timed iterations per size, `--chunk BYTES`,
//! `--coll all_reduce|broadcast|barrier|reduce|all_gather|reduce_scatter|all_to_all|
//! all_reduce_bucketed|all_reduce_separate|all_reduce_async`, `--algo auto|ring|rd`,
//! `--tensors K` and `--bucket BYTES` (bucketed / separate: K tensors per call).
//!
//! Method (the same as `shared/peers`' scripts, so figures compare side by side): per size,
//! warm-up calls, a calibration loop, then back-to-back calls for about `--budget` seconds.
//! `time` is the median over iterations of the slowest rank's time for that iteration;
//! `loop` is the slowest rank's loop time divided by the iterations. algbw = bytes / time;
//! busbw = algbw · 2(N−1)/N. `#wrong` counts elements that differ from the exact expected
//! result of a check iteration with rank-dependent inputs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringccl::{init_process_group, InitOptions, ProcessGroup, ReduceOp, StoreListener};

const CHILD_VAR: &str = "RINGCCL_BENCH_CHILD";
const PORT_PREFIX: &str = "RINGCCL_BENCH_PORT=";
const RUN_LIMIT: Duration = Duration::from_secs(1800);

#[derive(Clone, Debug)]
struct Args {
    np: usize,
    min_bytes: usize,
    max_bytes: usize,
    factor: usize,
    warmup: usize,
    budget: f64,
    chunk: Option<usize>,
    coll: Coll,
    algo: Option<String>,
    tensors: usize,
    bucket: usize,
}

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

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        np: 4,
        min_bytes: 8,
        max_bytes: 64 << 20,
        factor: 4,
        warmup: 5,
        budget: 1.0,
        chunk: None,
        coll: Coll::AllReduce,
        algo: None,
        tensors: 1000,
        bucket: 25 << 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--bench" => {}
            "--np" => args.np = value()?.parse().map_err(|e| format!("--np: {e}"))?,
            "-b" | "--minbytes" => args.min_bytes = parse_size(&value()?)?,
            "-e" | "--maxbytes" => args.max_bytes = parse_size(&value()?)?,
            "-f" | "--stepfactor" => {
                args.factor = value()?.parse().map_err(|e| format!("-f: {e}"))?
            }
            "-w" | "--warmup_iters" => {
                args.warmup = value()?.parse().map_err(|e| format!("-w: {e}"))?
            }
            "--budget" => args.budget = value()?.parse().map_err(|e| format!("--budget: {e}"))?,
            "--chunk" => args.chunk = Some(parse_size(&value()?)?),
            "--coll" => args.coll = Coll::parse(&value()?)?,
            "--algo" => args.algo = Some(value()?),
            "--tensors" => {
                args.tensors = value()?.parse().map_err(|e| format!("--tensors: {e}"))?
            }
            "--bucket" => args.bucket = parse_size(&value()?)?,
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    if args.np == 0 || args.factor < 2 || args.min_bytes == 0 || args.min_bytes > args.max_bytes {
        return Err("need --np >= 1, -f >= 2 and 0 < -b <= -e".into());
    }
    Ok(args)
}

fn sizes(args: &Args) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut s = args.min_bytes;
    while s <= args.max_bytes {
        sizes.push(s);
        s *= args.factor;
    }
    if sizes.last() != Some(&args.max_bytes) {
        sizes.push(args.max_bytes);
    }
    sizes
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("allreduce bench: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if std::env::var_os(CHILD_VAR).is_some() {
        run_rank(&args)
    } else {
        launch(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allreduce bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------- launcher (parent)

fn spawn_rank(rank: usize, np: usize, port: u16) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    Command::new(exe)
        .args(std::env::args().skip(1))
        .env(CHILD_VAR, "1")
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", np.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawning rank {rank}: {e}"))
}

fn launch(args: &Args) -> Result<(), String> {
    let (tx, rx) = mpsc::channel::<Option<String>>();
    let mut children = vec![spawn_rank(0, args.np, 0)?];
    let stdout = children[0].stdout.take().ok_or("no stdout")?;
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    let deadline = Instant::now() + RUN_LIMIT;
    let kill = |children: &mut Vec<Child>| {
        for c in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(line)) => {
                if let Some(port) = line.strip_prefix(PORT_PREFIX) {
                    let port: u16 = port.parse().map_err(|e| format!("port line: {e}"))?;
                    for rank in 1..args.np {
                        let mut child = spawn_rank(rank, args.np, port)?;
                        // Other ranks print nothing on stdout; drain it anyway.
                        if let Some(out) = child.stdout.take() {
                            thread::spawn(move || {
                                for _ in BufReader::new(out).lines().map_while(Result::ok) {}
                            });
                        }
                        children.push(child);
                    }
                } else {
                    println!("{line}");
                    let _ = std::io::stdout().flush();
                }
            }
            Ok(None) => break,
            Err(_) => {
                kill(&mut children);
                return Err(format!("ranks did not finish within {RUN_LIMIT:?}"));
            }
        }
    }
    let mut failed = Vec::new();
    for (rank, child) in children.iter_mut().enumerate() {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => failed.push(format!("rank {rank}: {status}")),
            Err(e) => failed.push(format!("rank {rank}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

// ---------------------------------------------------------------- one rank

fn join_group(args: &Args) -> Result<ProcessGroup, String> {
    let mut opts = if std::env::var("RANK").as_deref() == Ok("0") {
        // Rank 0 binds the store on a free port and tells the launcher, which passes
        // the real port to the other ranks.
        let listener = StoreListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("{PORT_PREFIX}{}", addr.port());
        InitOptions::new(0, args.np, &addr.to_string()).store_listener(listener)
    } else {
        InitOptions::from_env().map_err(|e| e.to_string())?
    };
    opts = opts.timeout(Duration::from_secs(300));
    if let Some(chunk) = args.chunk {
        opts = opts.chunk_bytes(chunk);
    }
    if let Some(algo) = &args.algo {
        opts = opts.all_reduce_algo(algo.parse().map_err(|e: ringccl::Error| e.to_string())?);
    }
    init_process_group("gloo", opts).map_err(|e| e.to_string())
}

struct Timing {
    median_us: f64,
    loop_us: f64,
    iters: usize,
}

/// Times `op` the way the peer scripts do; every rank returns the same figures.
fn time_op(
    pg: &ProcessGroup,
    args: &Args,
    mut op: impl FnMut() -> Result<(), ringccl::Error>,
) -> Result<Timing, ringccl::Error> {
    for _ in 0..args.warmup {
        op()?;
    }
    let mut k = 1usize;
    let per_call = loop {
        pg.barrier()?;
        let t0 = Instant::now();
        for _ in 0..k {
            op()?;
        }
        let mut elapsed = [t0.elapsed().as_secs_f64()];
        pg.all_reduce(&mut elapsed, ReduceOp::Max)?;
        if elapsed[0] >= 0.1 || k >= 20_000 {
            break elapsed[0] / k as f64;
        }
        k *= 2;
    };
    let iters = ((args.budget / per_call.max(1e-9)) as usize).clamp(5, 20_000);
    let mut times = vec![0f64; iters];
    pg.barrier()?;
    let loop_start = Instant::now();
    for t in times.iter_mut() {
        let s = Instant::now();
        op()?;
        *t = s.elapsed().as_secs_f64();
    }
    let mut loop_time = [loop_start.elapsed().as_secs_f64() / iters as f64];
    pg.all_reduce(&mut times, ReduceOp::Max)?;
    pg.all_reduce(&mut loop_time, ReduceOp::Max)?;
    times.sort_by(f64::total_cmp);
    let median = if iters % 2 == 1 {
        times[iters / 2]
    } else {
        (times[iters / 2 - 1] + times[iters / 2]) / 2.0
    };
    Ok(Timing {
        median_us: median * 1e6,
        loop_us: loop_time[0] * 1e6,
        iters,
    })
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
    /// `--tensors` tensors fused by `all_reduce_bucketed`.
    Bucketed,
    /// `--tensors` tensors all-reduced one call each (the baseline for `Bucketed`).
    Separate,
    /// Compute overlapped with an async all-reduce, against the two one after the other.
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
}

fn input(rank: usize, i: usize) -> f32 {
    ((rank * 3 + i * 7) % 17) as f32 - 8.0
}

fn sum_of(n: usize, i: usize) -> f32 {
    (0..n).map(|r| input(r, i)).sum()
}

fn count_wrong(got: &[f32], want: impl Fn(usize) -> f32) -> i64 {
    got.iter()
        .enumerate()
        .filter(|&(i, &x)| x != want(i))
        .count() as i64
}

/// One check iteration of `coll` on `count` elements with exactly representable
/// rank-dependent inputs; returns the wrong elements summed over ranks.
fn check(
    pg: &ProcessGroup,
    coll: Coll,
    count: usize,
    tensors: usize,
) -> Result<i64, ringccl::Error> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let mine: Vec<f32> = (0..count).map(|i| input(rank, i)).collect();
    let mut wrong = match coll {
        Coll::AllReduce | Coll::Async => {
            let mut buf = mine;
            pg.all_reduce(&mut buf, ReduceOp::Sum)?;
            count_wrong(&buf, |i| sum_of(n, i))
        }
        Coll::Bucketed | Coll::Separate => {
            let per = (count / tensors).max(1);
            let mut parts: Vec<Vec<f32>> = mine.chunks(per).map(<[f32]>::to_vec).collect();
            let mut views: Vec<&mut [f32]> = parts.iter_mut().map(|p| &mut p[..]).collect();
            pg.all_reduce_bucketed(&mut views, ReduceOp::Sum, 25 << 20)?;
            count_wrong(&parts.concat(), |i| sum_of(n, i))
        }
        Coll::Broadcast => {
            let mut buf = mine;
            pg.broadcast(&mut buf, 0)?;
            count_wrong(&buf, |i| input(0, i))
        }
        Coll::Reduce => {
            let mut buf = mine;
            pg.reduce(&mut buf, ReduceOp::Sum, 0)?;
            if rank == 0 {
                count_wrong(&buf, |i| sum_of(n, i))
            } else {
                0
            }
        }
        Coll::AllGather => {
            let per = count / n;
            let mut out = vec![0f32; per * n];
            pg.all_gather(&mine[..per], &mut out)?;
            count_wrong(&out, |j| input(j / per.max(1), j % per.max(1)))
        }
        Coll::ReduceScatter => {
            let per = count / n;
            let mut out = vec![0f32; per];
            pg.reduce_scatter(&mine[..per * n], &mut out, ReduceOp::Sum)?;
            count_wrong(&out, |i| sum_of(n, rank * per + i))
        }
        Coll::AllToAll => {
            let per = count / n;
            let mut out = vec![0f32; per * n];
            pg.all_to_all(&mine[..per * n], &mut out)?;
            count_wrong(&out, |j| input(j / per.max(1), rank * per + j % per.max(1)))
        }
        Coll::Barrier => 0,
    };
    let mut total = [wrong];
    pg.all_reduce(&mut total, ReduceOp::Sum)?;
    wrong = total[0];
    Ok(wrong)
}

/// A fixed amount of floating-point work on a private buffer (the "backward pass" the
/// overlap benchmark hides communication behind). Values stay bounded.
fn compute(scratch: &mut [f32], rounds: usize) -> f32 {
    for _ in 0..rounds {
        for x in scratch.iter_mut() {
            *x = *x * 0.999_999 + 1e-6;
        }
    }
    scratch[0]
}

/// Work that leaves the CPU free, standing in for an accelerator's backward pass.
fn off_cpu(rounds: usize) {
    thread::sleep(Duration::from_micros(rounds as u64));
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Slowest rank's time for `f`, median of `reps` repetitions, in microseconds.
fn slowest_median_us(
    pg: &ProcessGroup,
    reps: usize,
    mut f: impl FnMut() -> Result<(), ringccl::Error>,
) -> Result<f64, ringccl::Error> {
    let mut times = vec![0f64; reps];
    for t in times.iter_mut() {
        pg.barrier()?;
        let s = Instant::now();
        f()?;
        *t = s.elapsed().as_secs_f64();
    }
    pg.all_reduce(&mut times, ReduceOp::Max)?;
    Ok(median(times) * 1e6)
}

/// Compute overlapped with a background all-reduce of `count` floats, against the two
/// one after the other. Compute is calibrated to take about as long as the all-reduce.
/// Two kinds of compute: CPU work (competes with the transport for the cores) and
/// off-CPU work (a sleep, standing in for work on an accelerator).
fn overlap_rows(
    pg: &ProcessGroup,
    count: usize,
    reps: usize,
) -> Result<Vec<String>, ringccl::Error> {
    let mut scratch = vec![1.0f32; 1 << 18];
    let mut buf = vec![1.0f32; count];
    let comm = slowest_median_us(pg, reps, || pg.all_reduce(&mut buf, ReduceOp::Sum))?;
    let one_round = slowest_median_us(pg, reps, || {
        std::hint::black_box(compute(&mut scratch, 1));
        Ok(())
    })?;
    let mut rounds = [((comm / one_round.max(1e-3)).round() as i64).max(1)];
    pg.broadcast(&mut rounds, 0)?;
    let cpu_rounds = rounds[0] as usize;
    let sleep_us = comm.round().max(1.0) as usize;
    let mut rows = Vec::new();
    for kind in ["cpu", "off-cpu"] {
        let work = |scratch: &mut [f32]| {
            if kind == "cpu" {
                std::hint::black_box(compute(scratch, cpu_rounds));
            } else {
                off_cpu(sleep_us);
            }
        };
        let comp = slowest_median_us(pg, reps, || {
            work(&mut scratch);
            Ok(())
        })?;
        let sequential = slowest_median_us(pg, reps, || {
            pg.all_reduce(&mut buf, ReduceOp::Sum)?;
            work(&mut scratch);
            Ok(())
        })?;
        let mut owned = Some(vec![1.0f32; count]);
        let overlapped = slowest_median_us(pg, reps, || {
            let pending = pg.all_reduce_async(owned.take().unwrap_or_default(), ReduceOp::Sum)?;
            work(&mut scratch);
            owned = Some(pending.wait()?);
            Ok(())
        })?;
        rows.push(format!(
            "{:>12} {:>8} {:>12.1} {:>12.1} {:>14.1} {:>14.1} {:>9.2}x",
            count * 4,
            kind,
            comm,
            comp,
            sequential,
            overlapped,
            sequential / overlapped
        ));
    }
    Ok(rows)
}

fn run_rank(args: &Args) -> Result<(), String> {
    let pg = join_group(args)?;
    let n = pg.world_size();
    let rank0 = pg.rank() == 0;
    let err = |e: ringccl::Error| e.to_string();
    let coll = args.coll;
    if rank0 {
        println!(
            "# ringccl {coll:?} benchmark: backend {}, {n} ranks on loopback, float32 sum, all-reduce algorithm {}",
            pg.backend(),
            args.algo.as_deref().unwrap_or("auto")
        );
    }
    if coll == Coll::Async {
        if rank0 {
            println!("# overlap: compute calibrated to about the all-reduce's time; times are medians of the slowest rank");
            println!(
                "#{:>11} {:>12} {:>12} {:>14} {:>14} {:>10}",
                "size(B)", "comm(us)", "compute(us)", "sequential(us)", "overlapped(us)", "speedup"
            );
        }
        for bytes in sizes(args) {
            let count = (bytes / 4).max(1);
            let wrong = check(&pg, coll, count, args.tensors).map_err(err)?;
            if wrong > 0 {
                return Err(format!("{wrong} wrong elements"));
            }
            let rows = overlap_rows(&pg, count, 7).map_err(err)?;
            if rank0 {
                for row in rows {
                    println!("{row}");
                }
            }
        }
        return pg.barrier().map_err(err);
    }
    if rank0 {
        if matches!(coll, Coll::Bucketed | Coll::Separate) {
            println!(
                "# {} tensors per call, size = all tensors together",
                args.tensors
            );
        }
        println!("# time = median over iterations of the slowest rank; loop = slowest rank's loop time / iterations");
        println!(
            "#{:>11} {:>12} {:>6} {:>6} {:>5} {:>10} {:>10} {:>10} {:>7} {:>10} {:>7}",
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
    let mut busbw_sum = 0.0;
    let mut rows = 0;
    let mut total_wrong = 0;
    let sweep = if coll == Coll::Barrier {
        vec![0]
    } else {
        sizes(args)
    };
    for bytes in sweep {
        let mut count = (bytes / 4).max(usize::from(coll != Coll::Barrier));
        if matches!(coll, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll) {
            count = (count / n).max(1) * n;
        }
        let wrong = check(&pg, coll, count, args.tensors).map_err(err)?;
        total_wrong += wrong;
        let per = count / n;
        let mut buf = vec![1.0f32; count];
        let mut out = vec![0.0f32; count];
        let tensor_len = (count / args.tensors.max(1)).max(1);
        let timing = time_op(&pg, args, || match coll {
            Coll::AllReduce => pg.all_reduce(&mut buf, ReduceOp::Sum),
            Coll::Broadcast => pg.broadcast(&mut buf, 0),
            Coll::Barrier => pg.barrier(),
            Coll::Reduce => pg.reduce(&mut buf, ReduceOp::Sum, 0),
            Coll::AllGather => pg.all_gather(&buf[..per], &mut out),
            Coll::ReduceScatter => pg.reduce_scatter(&buf, &mut out[..per], ReduceOp::Sum),
            Coll::AllToAll => pg.all_to_all(&buf, &mut out),
            Coll::Bucketed => {
                let mut views: Vec<&mut [f32]> = buf.chunks_mut(tensor_len).collect();
                pg.all_reduce_bucketed(&mut views, ReduceOp::Sum, args.bucket)
            }
            Coll::Separate => buf
                .chunks_mut(tensor_len)
                .try_for_each(|t| pg.all_reduce(t, ReduceOp::Sum)),
            Coll::Async => Ok(()),
        })
        .map_err(err)?;
        let size = count * 4;
        let algbw = size as f64 / timing.median_us / 1e3;
        let busbw = algbw * coll.bus_factor(n);
        busbw_sum += busbw;
        rows += 1;
        if rank0 {
            let root = if matches!(coll, Coll::Broadcast | Coll::Reduce) {
                0
            } else {
                -1
            };
            let redop = if matches!(
                coll,
                Coll::Broadcast | Coll::Barrier | Coll::AllGather | Coll::AllToAll
            ) {
                "none"
            } else {
                "sum"
            };
            println!(
                "{:>12} {:>12} {:>6} {:>6} {:>5} {:>10.1} {:>10.3} {:>10.3} {:>7} {:>10.1} {:>7}",
                size,
                count,
                "float",
                redop,
                root,
                timing.median_us,
                algbw,
                busbw,
                wrong,
                timing.loop_us,
                timing.iters
            );
            let _ = std::io::stdout().flush();
        }
    }
    if rank0 {
        println!(
            "# Out of bounds values : {total_wrong} {}",
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        println!("# Avg bus bandwidth    : {:.4}", busbw_sum / rows as f64);
    }
    pg.barrier().map_err(err)?;
    if total_wrong > 0 {
        return Err(format!("{total_wrong} wrong elements"));
    }
    Ok(())
}
