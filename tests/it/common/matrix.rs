//! The collective matrix: every collective, dtype and op over counts from 0 to a few
//! MiB, each rank checking its result against a reference; one line per case, with a
//! digest of the result, for the harness to check that all ranks are bit-identical.

use crate::common::digest;
use crate::common::elements::{reference, TestElem};
use ringccl::half::{bf16, f16};
use ringccl::{Error, ProcessGroup, ReduceOp};

/// The counts a matrix runs for `n` ranks: empty, one, odd, one per rank, one crossing
/// the small-message thresholds, and, with `largest`, one of several chunks (3 MiB).
pub fn counts(n: usize, elem_size: usize, largest: bool) -> Vec<usize> {
    let mut counts = vec![0, 1, 7, n - 1, 65_537];
    if largest {
        counts.push(largest_count(elem_size));
    }
    counts.sort_unstable();
    counts.dedup();
    counts
}

/// The multi-chunk count: 3 MiB and a few elements.
pub fn largest_count(elem_size: usize) -> usize {
    (3 << 20) / elem_size + 3
}

/// Whether the multi-chunk count runs every operator at `n` ranks: up to 4 ranks it
/// does; above, the operators (which do not change how the data moves) are covered at
/// the smaller counts, and the multi-chunk count runs the sum alone.
fn every_op_at_largest(n: usize) -> bool {
    n <= 4
}

pub fn check_all_reduce<T: TestElem>(pg: &ProcessGroup, count: usize, op: ReduceOp) -> String {
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

pub fn check_broadcast<T: TestElem>(pg: &ProcessGroup, count: usize, root: usize) -> String {
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

pub fn same_bits<T: TestElem>(got: &T, want: &T) -> bool {
    bytemuck::bytes_of(got) == bytemuck::bytes_of(want)
}

/// reduce (to a rotating root), all_gather, reduce_scatter, all_to_all and
/// point-to-point send/recv for one dtype, over per-rank block sizes from 0 to 100003.
pub fn new_ops<T: TestElem>(pg: &ProcessGroup) -> Vec<String> {
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

pub fn for_each_new_op_dtype(pg: &ProcessGroup) -> Vec<String> {
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

pub fn for_each_dtype(largest: bool, mut f: impl FnMut(&dyn Fn(&ProcessGroup) -> Vec<String>)) {
    fn all_ops<T: TestElem>(pg: &ProcessGroup, largest: bool) -> Vec<String> {
        let mut lines = Vec::new();
        let n = pg.world_size();
        for count in counts(n, T::DTYPE.size(), largest) {
            for op in ReduceOp::ALL {
                let large = count == largest_count(T::DTYPE.size());
                if large && op != ReduceOp::Sum && !every_op_at_largest(n) {
                    continue;
                }
                lines.push(check_all_reduce::<T>(pg, count, op));
            }
        }
        lines
    }
    f(&|pg| all_ops::<f32>(pg, largest));
    f(&|pg| all_ops::<f64>(pg, largest));
    f(&|pg| all_ops::<f16>(pg, largest));
    f(&|pg| all_ops::<bf16>(pg, largest));
    f(&|pg| all_ops::<i8>(pg, largest));
    f(&|pg| all_ops::<u8>(pg, largest));
    f(&|pg| all_ops::<i32>(pg, largest));
    f(&|pg| all_ops::<i64>(pg, largest));
}

/// All-reduce over every dtype, op and count (with `largest`, the multi-chunk count too);
/// one line per case, with a digest.
pub fn all_reduce_matrix(pg: &ProcessGroup, largest: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for_each_dtype(largest, |run| lines.extend(run(pg)));
    lines
}

/// Everything one rank runs; returns one line per case, with a digest of the result.
pub fn matrix(pg: &ProcessGroup) -> Vec<String> {
    let mut lines = all_reduce_matrix(pg, true);
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

pub fn assert_identical(lines: &[Vec<String>]) {
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
