//! Timing, the same way the peer scripts in `shared/peers` time: warm-up, calibration,
//! back-to-back iterations; the slowest rank's time per iteration, median over
//! iterations.

use std::time::Instant;

use ringccl::{Error, ProcessGroup, ReduceOp};

/// One row's timing, identical on every rank.
pub(crate) struct Timing {
    pub(crate) median_us: f64,
    pub(crate) loop_us: f64,
    pub(crate) iters: usize,
}

/// How many iterations to time.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Iterations {
    /// Exactly this many (`-n`).
    Fixed(usize),
    /// As many as fit in about this many seconds (calibrated).
    Budget(f64),
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// How many iterations to time: `Fixed` as given, or as many as fit the `Budget`,
/// calibrated with `batch(k)` (the slowest rank's seconds for `k` calls back to back,
/// doubling `k` until a batch takes 0.1 s).
fn calibrated(
    iterations: Iterations,
    mut batch: impl FnMut(usize) -> Result<f64, Error>,
) -> Result<usize, Error> {
    Ok(match iterations {
        Iterations::Fixed(n) => n.max(1),
        Iterations::Budget(budget) => {
            let mut k = 1usize;
            let per_call = loop {
                let elapsed = batch(k)?;
                if elapsed >= 0.1 || k >= 20_000 {
                    break elapsed / k as f64;
                }
                k *= 2;
            };
            ((budget / per_call.max(1e-9)) as usize).clamp(5, 20_000)
        }
    })
}

/// Times `op`; every rank returns the same figures.
pub(crate) fn time_op(
    pg: &ProcessGroup,
    warmup: usize,
    iterations: Iterations,
    mut op: impl FnMut() -> Result<(), Error>,
) -> Result<Timing, Error> {
    for _ in 0..warmup {
        op()?;
    }
    let iters = calibrated(iterations, |k| {
        pg.barrier()?;
        let t0 = Instant::now();
        for _ in 0..k {
            op()?;
        }
        let mut elapsed = [t0.elapsed().as_secs_f64()];
        pg.all_reduce(&mut elapsed, ReduceOp::Max)?;
        Ok(elapsed[0])
    })?;
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
    Ok(Timing {
        median_us: median(times) * 1e6,
        loop_us: loop_time[0] * 1e6,
        iters,
    })
}

/// Times `enqueue`, a stream-ordered device call, as nccl-tests does: batches of calls
/// back to back, each batch timed up to the host's wait for its last call
/// ([`ProcessGroup::synchronize_device`]); the slowest rank's time per call. The median
/// and the loop figure are both that time.
#[cfg(feature = "nccl")]
pub(crate) fn time_batches(
    pg: &ProcessGroup,
    warmup: usize,
    iterations: Iterations,
    mut enqueue: impl FnMut() -> Result<(), Error>,
) -> Result<Timing, Error> {
    let mut batch = |k: usize| -> Result<f64, Error> {
        pg.barrier()?;
        let t0 = Instant::now();
        for _ in 0..k {
            enqueue()?;
        }
        pg.synchronize_device()?;
        let mut elapsed = [t0.elapsed().as_secs_f64()];
        pg.all_reduce(&mut elapsed, ReduceOp::Max)?;
        Ok(elapsed[0])
    };
    batch(warmup)?;
    let iters = calibrated(iterations, &mut batch)?;
    let per_call_us = batch(iters)? / iters as f64 * 1e6;
    Ok(Timing {
        median_us: per_call_us,
        loop_us: per_call_us,
        iters,
    })
}

/// Slowest rank's time for `f`, median of `reps` repetitions, in microseconds.
pub(crate) fn slowest_median_us(
    pg: &ProcessGroup,
    reps: usize,
    mut f: impl FnMut() -> Result<(), Error>,
) -> Result<f64, Error> {
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
