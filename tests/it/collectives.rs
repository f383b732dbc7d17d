//! The collective matrix: every dtype and op, world sizes 1, 2, 3, 4, 5 and 8, counts
//! from 0 to a few MiB, as threads and as separate processes. Every rank checks its
//! result against a reference and the harness checks that all ranks are bit-identical.

use crate::common;

use std::time::{Duration, Instant, SystemTime};

use common::matrix::{all_reduce_matrix, assert_identical, matrix};
use common::{
    digest, heavy_lock, run_processes, run_threads, run_threads_with, GROUP_TIMEOUT, RESULT_PREFIX,
};
use ringccl::half::{bf16, f16};
use ringccl::{AllReduceAlgo, ReduceOp};

/// As threads: the whole matrix with the ring forced, then the all-reduce matrix again
/// with recursive doubling forced, and with halving-doubling forced (at every size up to
/// the multi-chunk one, which only the ring runs at in practice). The process variant
/// runs with the automatic choice.
fn threads_matrix(n: usize) {
    let _guard = heavy_lock();
    let started = Instant::now();
    let algo = |a: AllReduceAlgo| move |opts: ringccl::InitOptions| opts.all_reduce_algo(a);
    let lines = run_threads_with(n, GROUP_TIMEOUT, algo(AllReduceAlgo::Ring), |pg| {
        matrix(&pg)
    });
    assert_identical(&lines);
    let rd = run_threads_with(
        n,
        GROUP_TIMEOUT,
        algo(AllReduceAlgo::RecursiveDoubling),
        |pg| all_reduce_matrix(&pg, false),
    );
    assert_identical(&rd);
    // Same exact inputs, same results whichever algorithm ran.
    let ring: std::collections::HashSet<&String> = lines[0].iter().collect();
    for case in &rd[0] {
        assert!(
            ring.contains(case),
            "ring and recursive doubling disagree: {case}"
        );
    }
    let hd = run_threads_with(
        n,
        GROUP_TIMEOUT,
        algo(AllReduceAlgo::HalvingDoubling),
        |pg| all_reduce_matrix(&pg, false),
    );
    assert_identical(&hd);
    assert_eq!(
        hd[0][..],
        rd[0][..],
        "halving-doubling and recursive doubling disagree"
    );
    eprintln!(
        "threads n={n}: {} + {} + {} cases in {:?}",
        lines[0].len(),
        rd[0].len(),
        hd[0].len(),
        started.elapsed()
    );
}

fn processes_matrix(test_name: &str, n: usize) {
    if let Some(pg) = common::child_group(test_name) {
        for line in matrix(&pg) {
            println!("{RESULT_PREFIX}{line}");
        }
        return;
    }
    let _guard = heavy_lock();
    let started = Instant::now();
    let lines = run_processes(test_name, n);
    assert_identical(&lines);
    eprintln!(
        "processes n={n}: {} cases in {:?}",
        lines[0].len(),
        started.elapsed()
    );
}

macro_rules! world_sizes {
    ($($n:literal => $threads:ident, $procs:ident;)*) => {$(
        #[test]
        fn $threads() {
            threads_matrix($n);
        }
        #[test]
        fn $procs() {
            processes_matrix(stringify!($procs), $n);
        }
    )*};
}

world_sizes! {
    1 => threads_world_1, processes_world_1;
    2 => threads_world_2, processes_world_2;
    3 => threads_world_3, processes_world_3;
    4 => threads_world_4, processes_world_4;
    5 => threads_world_5, processes_world_5;
    8 => threads_world_8, processes_world_8;
}

/// With inputs whose sums round differently depending on order, every rank must still
/// hold the same bits, and the result must be close to the exact sum.
#[test]
fn inexact_float_sums_are_bit_identical_on_every_rank() {
    let _guard = heavy_lock();
    fn value(rank: usize, i: usize) -> f64 {
        (common::elements::mix(rank, i) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
    for n in [3, 5, 8] {
        let count = 300_007;
        let results = run_threads(n, GROUP_TIMEOUT, |pg| {
            let rank = pg.rank();
            let mut a: Vec<f32> = (0..count).map(|i| value(rank, i) as f32).collect();
            let mut b: Vec<f16> = (0..count).map(|i| f16::from_f64(value(rank, i))).collect();
            let mut c: Vec<bf16> = (0..count).map(|i| bf16::from_f64(value(rank, i))).collect();
            let mut d: Vec<f64> = (0..count).map(|i| value(rank, i) * 1e-3 + 1.0).collect();
            pg.all_reduce(&mut a, ReduceOp::Sum).unwrap();
            pg.all_reduce(&mut b, ReduceOp::Avg).unwrap();
            pg.all_reduce(&mut c, ReduceOp::Sum).unwrap();
            pg.all_reduce(&mut d, ReduceOp::Product).unwrap();
            for (i, x) in a.iter().enumerate().step_by(97) {
                let exact: f64 = (0..n).map(|r| value(r, i) as f32 as f64).sum();
                assert!((*x as f64 - exact).abs() < 1e-5, "{x} vs {exact}");
            }
            [
                digest(bytemuck::cast_slice(&a)),
                digest(bytemuck::cast_slice(&b)),
                digest(bytemuck::cast_slice(&c)),
                digest(bytemuck::cast_slice(&d)),
            ]
        });
        for (rank, r) in results.iter().enumerate() {
            assert_eq!(r, &results[0], "n={n}: rank {rank} drifted from rank 0");
        }
    }
}

/// A rank that arrives late holds every other rank in the barrier.
#[test]
fn barrier_waits_for_the_last_rank() {
    let _guard = heavy_lock();
    let delay = Duration::from_millis(300);
    for n in [2, 3, 5, 8] {
        for late in [0, n - 1] {
            let times = run_threads(n, GROUP_TIMEOUT, |pg| {
                pg.barrier().unwrap();
                if pg.rank() == late {
                    std::thread::sleep(delay);
                }
                let entered = Instant::now();
                pg.barrier().unwrap();
                (entered, Instant::now())
            });
            let late_entry = times[late].0;
            for (rank, (_, left)) in times.iter().enumerate() {
                assert!(
                    *left >= late_entry,
                    "n={n}: rank {rank} left the barrier before rank {late} entered it"
                );
            }
        }
    }
}

/// The same across processes, comparing wall-clock times on this machine.
#[test]
fn barrier_waits_for_the_last_rank_across_processes() {
    const NAME: &str = "barrier_waits_for_the_last_rank_across_processes";
    let nanos = || {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    };
    if let Some(pg) = common::child_group(NAME) {
        pg.barrier().unwrap();
        if pg.rank() == 2 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let entered = nanos();
        pg.barrier().unwrap();
        println!("{RESULT_PREFIX}{entered} {}", nanos());
        return;
    }
    let _guard = heavy_lock();
    let lines = run_processes(NAME, 4);
    let parse = |rank: usize| -> (u128, u128) {
        let mut it = lines[rank][0]
            .split(' ')
            .map(|x| x.parse::<u128>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    let late_entry = parse(2).0;
    for rank in 0..4 {
        assert!(
            parse(rank).1 >= late_entry,
            "rank {rank} left before rank 2 entered"
        );
    }
}

// ---- the same matrix over the shared-memory transport

fn shm_threads_matrix(n: usize) {
    let _guard = heavy_lock();
    let started = Instant::now();
    let shm = |opts: ringccl::InitOptions| opts.transport(ringccl::TransportKind::SharedMemory);
    let lines = run_threads_with(n, GROUP_TIMEOUT, shm, |pg| matrix(&pg));
    assert_identical(&lines);
    eprintln!(
        "shm threads n={n}: {} cases in {:?}",
        lines[0].len(),
        started.elapsed()
    );
}

#[test]
fn shm_threads_world_2() {
    shm_threads_matrix(2);
}

#[test]
fn shm_threads_world_3() {
    shm_threads_matrix(3);
}

#[test]
fn shm_threads_world_5() {
    shm_threads_matrix(5);
}

#[test]
fn shm_processes_world_4() {
    const NAME: &str = "shm_processes_world_4";
    if let Some(pg) = common::child_group(NAME) {
        for line in matrix(&pg) {
            println!("{RESULT_PREFIX}{line}");
        }
        return;
    }
    let _guard = heavy_lock();
    let lines = common::run_processes_with_env(NAME, 4, &[("RINGCCL_TRANSPORT", "shm")]);
    assert_identical(&lines);
}
