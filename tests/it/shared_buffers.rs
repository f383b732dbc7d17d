//! Buffers in shared memory from the start (`ProcessGroup::shared_buffer`): processes of
//! one host all-reduce them by reading each other's buffers in place. Exact,
//! bit-identical results at every offset and length, the in-place path really taken,
//! a rank passing an ordinary buffer among shared ones named at once, and a rank killed
//! while its buffer is read named by the others.

use crate::common;

use std::time::{Duration, Instant};

use common::elements::{reference, TestElem};
use common::matrix::assert_identical;
use common::reading_peers;
use common::{digest, heavy_lock, RESULT_PREFIX};
use ringccl::{Error, ProcessGroup, ReduceOp};

const ENV: &[(&str, &str)] = &[("RINGCCL_TRANSPORT", "shm")];

/// All-reduces `count` elements at `offset` into a shared buffer, checks them against the
/// reference, and returns the case with a digest of the result.
fn check_shared<T: TestElem>(
    pg: &ProcessGroup,
    offset: usize,
    count: usize,
    op: ReduceOp,
) -> String {
    let (rank, n) = (pg.rank(), pg.world_size());
    let mut shared = pg
        .shared_buffer::<T>(offset + count)
        .expect("a shared buffer");
    assert!(
        shared.is_shared(),
        "rank {rank}: processes of one host share memory"
    );
    let buf = &mut shared[offset..];
    for (i, x) in buf.iter_mut().enumerate() {
        *x = T::input(rank, i, op);
    }
    let case = format!(
        "shared all_reduce {} {op} offset={offset} count={count}",
        T::DTYPE
    );
    pg.all_reduce(buf, op)
        .unwrap_or_else(|e| panic!("rank {rank}: {case}: {e}"));
    for (i, got) in buf.iter().enumerate() {
        let want: T = reference(n, i, op);
        assert!(
            bytemuck::bytes_of(got) == bytemuck::bytes_of(&want),
            "rank {rank}: {case}: element {i} is {got:?}, expected {want:?}"
        );
    }
    format!("{case} {:016x}", digest(bytemuck::cast_slice(buf)))
}

#[test]
fn shared_buffers_are_reduced_in_place_exactly_and_bit_identically() {
    const NAME: &str = "shared_buffers_are_reduced_in_place_exactly_and_bit_identically";
    if let Some(pg) = common::child_group(NAME) {
        let mut lines = Vec::new();
        let mut shared_calls = 0;
        // Around 16 KiB (the default crossover), odd counts that split unevenly over
        // three ranks, offsets inside the buffer, and a large one.
        for (offset, count) in [
            (0, 4096),
            (7, 4097),
            (1, 100_003),
            (4096, 1 << 20),
            (0, 3 << 20),
        ] {
            lines.push(check_shared::<f32>(&pg, offset, count, ReduceOp::Sum));
            lines.push(check_shared::<f32>(&pg, offset, count, ReduceOp::Avg));
            shared_calls += 2;
        }
        lines.push(check_shared::<f64>(&pg, 3, 50_001, ReduceOp::Max));
        lines.push(check_shared::<i32>(&pg, 0, 65_537, ReduceOp::Sum));
        lines.push(check_shared::<i64>(&pg, 5, 30_000, ReduceOp::Product));
        shared_calls += 3;
        // An ordinary buffer between them still goes through the rings.
        lines.push(common::matrix::check_all_reduce::<f32>(
            &pg,
            100_003,
            ReduceOp::Sum,
        ));
        lines.push(check_shared::<f32>(&pg, 0, 4096, ReduceOp::Sum));
        shared_calls += 1;
        let read = reading_peers::calls_reading_peers(&pg);
        lines.push(format!("read in place: {read} of {shared_calls}"));
        pg.barrier().expect("final barrier");
        for line in lines {
            println!("{RESULT_PREFIX}{line}");
        }
        return;
    }
    let _guard = heavy_lock();
    let started = Instant::now();
    let lines = common::run_processes_with_env(NAME, 3, ENV);
    assert_identical(&lines);
    let last = lines[0].last().expect("lines");
    assert_eq!(last, "read in place: 14 of 14", "{:?}", lines[0]);
    eprintln!("{} cases in {:?}", lines[0].len(), started.elapsed());
}

#[test]
fn a_rank_passing_an_ordinary_buffer_among_shared_ones_is_named() {
    const NAME: &str = "a_rank_passing_an_ordinary_buffer_among_shared_ones_is_named";
    if let Some(pg) = common::child_group(NAME) {
        let rank = pg.rank();
        let count = 1 << 18;
        let mut heap = vec![1.0f32; count];
        let mut shared = pg.shared_buffer::<f32>(count).expect("a shared buffer");
        let started = Instant::now();
        let result = if rank == 1 {
            pg.all_reduce(&mut heap, ReduceOp::Sum)
        } else {
            pg.all_reduce(&mut shared[..], ReduceOp::Sum)
        };
        let took = started.elapsed();
        let error = result.expect_err("a mismatch cannot succeed");
        eprintln!("rank {rank} in {took:?}: {error}");
        // The rank that detects it names rank 1; the others quote its abort.
        let names_rank_1 = match &error {
            Error::Protocol { peer, .. } => *peer == 1,
            other => other.to_string().contains("protocol error from rank 1"),
        };
        println!("{RESULT_PREFIX}names rank 1: {names_rank_1}");
        println!(
            "{RESULT_PREFIX}within 5 s: {}",
            took < Duration::from_secs(5)
        );
        return;
    }
    let _guard = heavy_lock();
    let lines = common::run_processes_with_env(NAME, 3, ENV);
    for (rank, lines) in lines.iter().enumerate() {
        assert!(
            lines.contains(&"names rank 1: true".to_string()),
            "rank {rank}: {lines:?}"
        );
        assert!(
            lines.contains(&"within 5 s: true".to_string()),
            "rank {rank}: {lines:?}"
        );
    }
}

#[test]
fn a_rank_killed_while_its_shared_buffer_is_read_is_named_by_the_others() {
    const NAME: &str = "a_rank_killed_while_its_shared_buffer_is_read_is_named_by_the_others";
    if let Some(pg) = common::child_group(NAME) {
        let mut buf = pg.shared_buffer::<f32>(4 << 20).expect("a shared buffer");
        buf.fill(pg.rank() as f32);
        reading_peers::stream_until_killed(&pg, 2, || pg.all_reduce(&mut buf[..], ReduceOp::Max));
        return;
    }
    let _guard = heavy_lock();
    let lines = common::run_processes_one_killed(NAME, 3, ENV, 2);
    reading_peers::assert_named_by_survivors(&lines, 2);
}

#[test]
fn bucketed_all_reduce_between_processes_runs_in_place_exactly() {
    const NAME: &str = "bucketed_all_reduce_between_processes_runs_in_place_exactly";
    if let Some(pg) = common::child_group(NAME) {
        let (rank, n) = (pg.rank(), pg.world_size());
        let lens: Vec<usize> = (0..40).map(|i| 1 + (i * 7919) % 30_000).collect();
        let mut lines = Vec::new();
        for round in 0..3 {
            let mut tensors: Vec<Vec<f32>> = lens
                .iter()
                .enumerate()
                .map(|(t, &len)| {
                    (0..len)
                        .map(|i| f32::input(rank, i + t, ReduceOp::Sum))
                        .collect()
                })
                .collect();
            let mut views: Vec<&mut [f32]> = tensors.iter_mut().map(|t| &mut t[..]).collect();
            pg.all_reduce_bucketed(&mut views, ReduceOp::Sum, 256 << 10)
                .unwrap_or_else(|e| panic!("rank {rank}: round {round}: {e}"));
            for (t, tensor) in tensors.iter().enumerate() {
                for (i, got) in tensor.iter().enumerate() {
                    let want: f32 = reference(n, i + t, ReduceOp::Sum);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "rank {rank}: tensor {t} element {i}"
                    );
                }
            }
            let all: Vec<f32> = tensors.concat();
            lines.push(format!(
                "round {round} {:016x}",
                digest(bytemuck::cast_slice(&all))
            ));
        }
        lines.push(format!(
            "read in place: {}",
            reading_peers::calls_reading_peers(&pg) > 0
        ));
        pg.barrier().expect("final barrier");
        for line in lines {
            println!("{RESULT_PREFIX}{line}");
        }
        return;
    }
    let _guard = heavy_lock();
    let lines = common::run_processes_with_env(NAME, 3, ENV);
    assert_identical(&lines);
    assert_eq!(
        lines[0].last().map(String::as_str),
        Some("read in place: true"),
        "{:?}",
        lines[0]
    );
}
