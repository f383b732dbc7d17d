//! All-reduce microbenchmark in the nccl-tests format.
//!
//! `cargo bench --bench allreduce` runs the embedded default: the gloo backend on
//! loopback, 4 ranks spawned locally as processes, float32 sum, sizes from 8 B to 64 MiB
//! in steps of ×4.
//!
//! Flags (after `--`): `--np N` ranks, `-b BYTES` / `-e BYTES` (suffixes K, M, G), `-f FACTOR`,
//! `-w WARMUP`, `--budget SECONDS` of timed iterations per size, `--chunk BYTES`.
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

/// Runs one check iteration with exactly representable rank-dependent inputs and counts
/// the elements that differ from the exact sum.
fn check(pg: &ProcessGroup, count: usize) -> Result<i64, ringccl::Error> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let input = |r: usize, i: usize| ((r * 3 + i * 7) % 17) as f32 - 8.0;
    let mut buf: Vec<f32> = (0..count).map(|i| input(rank, i)).collect();
    pg.all_reduce(&mut buf, ReduceOp::Sum)?;
    let mut wrong = buf
        .iter()
        .enumerate()
        .filter(|&(i, &x)| x != (0..n).map(|r| input(r, i)).sum::<f32>())
        .count() as i64;
    let mut total = [wrong];
    pg.all_reduce(&mut total, ReduceOp::Sum)?;
    wrong = total[0];
    Ok(wrong)
}

fn run_rank(args: &Args) -> Result<(), String> {
    let pg = join_group(args)?;
    let n = pg.world_size();
    let rank0 = pg.rank() == 0;
    if rank0 {
        println!(
            "# ringccl all-reduce benchmark: backend {}, {n} ranks on loopback, float32 sum",
            pg.backend()
        );
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
    for bytes in sizes(args) {
        let count = (bytes / 4).max(1);
        let wrong = check(&pg, count).map_err(|e| e.to_string())?;
        total_wrong += wrong;
        let mut buf = vec![1.0f32; count];
        let timing = time_op(&pg, args, || pg.all_reduce(&mut buf, ReduceOp::Sum))
            .map_err(|e| e.to_string())?;
        let size = count * 4;
        let algbw = size as f64 / timing.median_us / 1e3;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        busbw_sum += busbw;
        rows += 1;
        if rank0 {
            println!(
                "{:>12} {:>12} {:>6} {:>6} {:>5} {:>10.1} {:>10.3} {:>10.3} {:>7} {:>10.1} {:>7}",
                size,
                count,
                "float",
                "sum",
                -1,
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
    pg.barrier().map_err(|e| e.to_string())?;
    if total_wrong > 0 {
        return Err(format!("{total_wrong} wrong elements"));
    }
    Ok(())
}
