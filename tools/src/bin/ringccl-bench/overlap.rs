//! `--coll all_reduce_async`: how much of a background all-reduce hides behind compute.

use std::thread;
use std::time::Duration;

use ringccl::{Error, ProcessGroup, ReduceOp};

use super::args::{sizes, Args};
use super::bench_op::BenchOp;
use super::check::check;
use super::measure::slowest_median_us;

/// Every size: a correctness check, then the overlap rows (printed by rank 0).
pub(crate) fn run_overlap(pg: &ProcessGroup, args: &Args) -> Result<(), String> {
    let rank0 = pg.rank() == 0;
    let err = |e: Error| e.to_string();
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
        let wrong =
            check::<f32>(pg, BenchOp::Async, count, ReduceOp::Sum, args.tensors).map_err(err)?;
        if wrong > 0 {
            return Err(format!("{wrong} wrong elements"));
        }
        for row in overlap_rows(pg, count, 7).map_err(err)? {
            if rank0 {
                println!("{row}");
            }
        }
    }
    pg.barrier().map_err(err)
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

/// Compute overlapped with a background all-reduce of `count` floats, against the two
/// one after the other. Compute is calibrated to take about as long as the all-reduce.
/// Two kinds of compute: CPU work (competes with the transport for the cores) and
/// off-CPU work (a sleep, standing in for work on an accelerator).
fn overlap_rows(pg: &ProcessGroup, count: usize, reps: usize) -> Result<Vec<String>, Error> {
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
    let sleep = Duration::from_micros(comm.round().max(1.0) as u64);
    let mut rows = Vec::new();
    for kind in ["cpu", "off-cpu"] {
        let work = |scratch: &mut [f32]| {
            if kind == "cpu" {
                std::hint::black_box(compute(scratch, cpu_rounds));
            } else {
                thread::sleep(sleep);
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
