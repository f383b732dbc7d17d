//! The collective matrix: every dtype and op, world sizes 1, 2, 3, 4, 5 and 8, counts
//! from 0 to a few MiB, as threads and as separate processes. Every rank checks its
//! result against a reference and the harness checks that all ranks are bit-identical.

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::elements::{reference, TestElem};
use common::{
    digest, heavy_lock, run_processes, run_threads, run_threads_with, GROUP_TIMEOUT, RESULT_PREFIX,
};
use ringccl::half::{bf16, f16};
use ringccl::{AllReduceAlgo, Error, ProcessGroup, ReduceOp};

fn counts(n: usize, elem_size: usize) -> Vec<usize> {
    let mut counts = vec![0, 1, 7, n - 1, 1_000_003, (3 << 20) / elem_size + 3];
    counts.sort_unstable();
    counts.dedup();
    counts
}

fn check_all_reduce<T: TestElem>(pg: &ProcessGroup, count: usize, op: ReduceOp) -> String {
    let (rank, n) = (pg.rank(), pg.world_size());
    let mut buf: Vec<T> = (0..count).map(|i| T::input(rank, i, op)).collect();
    let result = pg.all_reduce(&mut buf, op);
    let case = format!("all_reduce {} {op} count={count} n={n}", T::DTYPE);
    if op == ReduceOp::Avg && !T::DTYPE.is_float() {
        match result {
            Err(Error::UnsupportedOp { .. }) => return format!("{case} rejected"),
            other => panic!("rank {rank}: {case}: expected UnsupportedOp, got {other:?}"),
        }
    }
    if let Err(e) = result {
        panic!("rank {rank}: {case}: {e}");
    }
    for (i, got) in buf.iter().enumerate() {
        let want: T = reference(n, i, op);
        assert!(
            bytemuck::bytes_of(got) == bytemuck::bytes_of(&want),
            "rank {rank}: {case}: element {i} is {got:?}, expected {want:?}"
        );
    }
    format!("{case} {:016x}", digest(bytemuck::cast_slice(&buf)))
}

fn check_broadcast<T: TestElem>(pg: &ProcessGroup, count: usize, root: usize) -> String {
    let rank = pg.rank();
    let mut buf: Vec<T> = (0..count)
        .map(|i| T::input(rank, i, ReduceOp::Sum))
        .collect();
    let case = format!("broadcast {} root={root} count={count}", T::DTYPE);
    pg.broadcast(&mut buf, root)
        .unwrap_or_else(|e| panic!("rank {rank}: {case}: {e}"));
    for (i, got) in buf.iter().enumerate() {
        let want = T::input(root, i, ReduceOp::Sum);
        assert!(
            bytemuck::bytes_of(got) == bytemuck::bytes_of(&want),
            "rank {rank}: {case}: element {i} is {got:?}, expected {want:?}"
        );
    }
    format!("{case} {:016x}", digest(bytemuck::cast_slice(&buf)))
}

fn same_bits<T: TestElem>(got: &T, want: &T) -> bool {
    bytemuck::bytes_of(got) == bytemuck::bytes_of(want)
}

/// reduce (to a rotating root), all_gather, reduce_scatter, all_to_all and
/// point-to-point send/recv for one dtype, over per-rank block sizes from 0 to 100003.
fn new_ops<T: TestElem>(pg: &ProcessGroup) -> Vec<String> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let dt = T::DTYPE;
    let mut lines = Vec::new();
    let mut blocks = vec![0, 1, 7, n - 1, 100_003];
    blocks.sort_unstable();
    blocks.dedup();
    for (case, c) in blocks.into_iter().enumerate() {
        // all_gather
        let input: Vec<T> = (0..c).map(|i| T::input(rank, i, ReduceOp::Sum)).collect();
        let mut output = vec![T::input(99, 0, ReduceOp::Sum); n * c];
        pg.all_gather(&input, &mut output)
            .unwrap_or_else(|e| panic!("rank {rank}: all_gather {dt} c={c}: {e}"));
        for (j, got) in output.iter().enumerate() {
            let want = T::input(j / c.max(1), j % c.max(1), ReduceOp::Sum);
            assert!(
                same_bits(got, &want),
                "rank {rank}: all_gather {dt} c={c}: element {j}"
            );
        }
        lines.push(format!(
            "all_gather {dt} c={c} {:016x}",
            digest(bytemuck::cast_slice(&output))
        ));

        // all_to_all: block q of rank r's input becomes block r of rank q's output.
        let input: Vec<T> = (0..n * c)
            .map(|j| T::input(rank, j, ReduceOp::Sum))
            .collect();
        let mut output = vec![T::input(99, 0, ReduceOp::Sum); n * c];
        pg.all_to_all(&input, &mut output)
            .unwrap_or_else(|e| panic!("rank {rank}: all_to_all {dt} c={c}: {e}"));
        for (j, got) in output.iter().enumerate() {
            let (q, i) = (j / c.max(1), j % c.max(1));
            let want = T::input(q, rank * c + i, ReduceOp::Sum);
            assert!(
                same_bits(got, &want),
                "rank {rank}: all_to_all {dt} c={c}: element {j}"
            );
        }

        for op in ReduceOp::ALL {
            let int_avg = op == ReduceOp::Avg && !dt.is_float();
            // reduce_scatter
            let input: Vec<T> = (0..n * c).map(|j| T::input(rank, j, op)).collect();
            let mut output = vec![T::input(99, 0, op); c];
            let result = pg.reduce_scatter(&input, &mut output, op);
            if int_avg {
                assert!(
                    matches!(result, Err(Error::UnsupportedOp { .. })),
                    "{result:?}"
                );
            } else {
                result
                    .unwrap_or_else(|e| panic!("rank {rank}: reduce_scatter {dt} {op} c={c}: {e}"));
                for (i, got) in output.iter().enumerate() {
                    let want: T = reference(n, rank * c + i, op);
                    assert!(
                        same_bits(got, &want),
                        "rank {rank}: reduce_scatter {dt} {op} c={c}: element {i}"
                    );
                }
            }

            // reduce, to a root that changes from case to case
            let root = (case + op.code() as usize) % n;
            let count = c * 3 + 1;
            let mut buf: Vec<T> = (0..count).map(|i| T::input(rank, i, op)).collect();
            let result = pg.reduce(&mut buf, op, root);
            if int_avg {
                assert!(
                    matches!(result, Err(Error::UnsupportedOp { .. })),
                    "{result:?}"
                );
            } else {
                result.unwrap_or_else(|e| panic!("rank {rank}: reduce {dt} {op} c={count}: {e}"));
                lines.push(format!("reduce {dt} {op} c={count} root={root}"));
                if rank == root {
                    for (i, got) in buf.iter().enumerate() {
                        let want: T = reference(n, i, op);
                        assert!(
                            same_bits(got, &want),
                            "rank {rank}: reduce {dt} {op} root={root}: element {i}"
                        );
                    }
                }
            }
        }

        // send/recv: rank 0 exchanges a message with every other rank, in turn.
        let tag = case as u32;
        if rank == 0 {
            for q in 1..n {
                let out: Vec<T> = (0..c).map(|i| T::input(q, i, ReduceOp::Max)).collect();
                pg.send(&out, q, tag).unwrap();
                let mut back = vec![T::input(99, 0, ReduceOp::Sum); c];
                pg.recv(&mut back, q, tag + 1000).unwrap();
                for (i, got) in back.iter().enumerate() {
                    assert!(
                        same_bits(got, &T::input(q + 7, i, ReduceOp::Max)),
                        "echo from {q}"
                    );
                }
            }
        } else {
            let mut got = vec![T::input(99, 0, ReduceOp::Sum); c];
            pg.recv(&mut got, 0, tag).unwrap();
            for (i, g) in got.iter().enumerate() {
                assert!(
                    same_bits(g, &T::input(rank, i, ReduceOp::Max)),
                    "rank {rank}: recv element {i}"
                );
            }
            let reply: Vec<T> = (0..c)
                .map(|i| T::input(rank + 7, i, ReduceOp::Max))
                .collect();
            pg.send(&reply, 0, tag + 1000).unwrap();
        }
    }
    lines
}

fn for_each_new_op_dtype(pg: &ProcessGroup) -> Vec<String> {
    let mut lines = new_ops::<f32>(pg);
    lines.extend(new_ops::<f64>(pg));
    lines.extend(new_ops::<f16>(pg));
    lines.extend(new_ops::<bf16>(pg));
    lines.extend(new_ops::<i8>(pg));
    lines.extend(new_ops::<u8>(pg));
    lines.extend(new_ops::<i32>(pg));
    lines.extend(new_ops::<i64>(pg));
    lines
}

fn for_each_dtype(mut f: impl FnMut(&dyn Fn(&ProcessGroup) -> Vec<String>)) {
    fn all_ops<T: TestElem>(pg: &ProcessGroup) -> Vec<String> {
        let mut lines = Vec::new();
        for count in counts(pg.world_size(), T::DTYPE.size()) {
            for op in ReduceOp::ALL {
                lines.push(check_all_reduce::<T>(pg, count, op));
            }
        }
        lines
    }
    f(&all_ops::<f32>);
    f(&all_ops::<f64>);
    f(&all_ops::<f16>);
    f(&all_ops::<bf16>);
    f(&all_ops::<i8>);
    f(&all_ops::<u8>);
    f(&all_ops::<i32>);
    f(&all_ops::<i64>);
}

/// All-reduce over every dtype, op and count; one line per case, with a digest.
fn all_reduce_matrix(pg: &ProcessGroup) -> Vec<String> {
    let mut lines = Vec::new();
    for_each_dtype(|run| lines.extend(run(pg)));
    lines
}

/// Everything one rank runs; returns one line per case, with a digest of the result.
fn matrix(pg: &ProcessGroup) -> Vec<String> {
    let mut lines = all_reduce_matrix(pg);
    lines.extend(for_each_new_op_dtype(pg));
    for root in 0..pg.world_size() {
        for count in [0, 1, 7, 100_003] {
            lines.push(check_broadcast::<f32>(pg, count, root));
            lines.push(check_broadcast::<bf16>(pg, count, root));
            lines.push(check_broadcast::<u8>(pg, count, root));
            lines.push(check_broadcast::<i64>(pg, count, root));
        }
    }
    // Large, chunk-pipelined broadcasts from two roots, two element sizes.
    for root in [0, pg.world_size() - 1] {
        lines.push(check_broadcast::<f64>(pg, 1_000_003, root));
        lines.push(check_broadcast::<i8>(pg, (3 << 20) + 5, root));
    }
    pg.barrier().expect("final barrier");
    lines
}

fn assert_identical(lines: &[Vec<String>]) {
    assert!(!lines[0].is_empty(), "rank 0 reported nothing");
    for (rank, l) in lines.iter().enumerate().skip(1) {
        assert_eq!(
            l.len(),
            lines[0].len(),
            "rank {rank} ran a different number of cases"
        );
        for (a, b) in lines[0].iter().zip(l) {
            assert_eq!(a, b, "rank {rank} differs from rank 0");
        }
    }
}

/// As threads: the whole matrix with the ring forced, then the all-reduce matrix again
/// with recursive doubling forced, and with halving-doubling forced (at every size). The
/// process variant runs with the automatic choice.
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
        |pg| all_reduce_matrix(&pg),
    );
    assert_identical(&rd);
    // Same exact inputs, same results whichever algorithm ran.
    assert_eq!(
        rd[0][..],
        lines[0][..rd[0].len()],
        "ring and recursive doubling disagree"
    );
    let hd = run_threads_with(
        n,
        GROUP_TIMEOUT,
        algo(AllReduceAlgo::HalvingDoubling),
        |pg| all_reduce_matrix(&pg),
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
