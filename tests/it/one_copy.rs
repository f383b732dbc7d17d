//! Processes of one host that read each other's buffers through the kernel (the one-copy
//! all-reduce, `RINGCCL_ALGO=peer_memory` over shared memory): exact, bit-identical
//! results, and a rank killed in the middle of a call named by the others, never a hang
//! or a fault.

use crate::common;

use std::time::Instant;

use common::matrix::{all_reduce_matrix, assert_identical};
use common::reading_peers;
use common::{heavy_lock, RESULT_PREFIX};
use ringccl::ReduceOp;

const ENV: &[(&str, &str)] = &[
    ("RINGCCL_TRANSPORT", "shm"),
    ("RINGCCL_ALGO", "peer_memory"),
];

/// Why processes may not read each other's memory here, if they may not: Yama's
/// `ptrace_scope` above 0 forbids it between sibling processes.
fn reading_forbidden() -> Option<String> {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?;
    (scope.trim() != "0").then(|| format!("Yama's ptrace_scope is {}", scope.trim()))
}

#[test]
fn processes_reading_each_others_buffers_get_exact_bit_identical_results() {
    const NAME: &str = "processes_reading_each_others_buffers_get_exact_bit_identical_results";
    if let Some(pg) = common::child_group(NAME) {
        let mut lines = all_reduce_matrix(&pg, false);
        // Odd counts around the segment boundaries of three ranks, and a large one.
        for count in [1usize, 2, 3, 4, 1_000_001, 3 << 20] {
            lines.push(common::matrix::check_all_reduce::<f32>(
                &pg,
                count,
                ReduceOp::Sum,
            ));
        }
        let read = reading_peers::calls_reading_peers(&pg);
        lines.push(format!("read peers: {}", read > 0));
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
    let used = lines[0].iter().any(|l| l == "read peers: true");
    match reading_forbidden() {
        Some(why) if !used => eprintln!("skipped the check that peers' buffers were read: {why}"),
        _ => assert!(
            used,
            "no call read the peers' buffers: {:?}",
            lines[0].last()
        ),
    }
    eprintln!("{} cases in {:?}", lines[0].len(), started.elapsed());
}

#[test]
fn a_rank_killed_while_its_buffer_is_read_is_named_by_the_others() {
    const NAME: &str = "a_rank_killed_while_its_buffer_is_read_is_named_by_the_others";
    if let Some(pg) = common::child_group(NAME) {
        let mut buf = vec![pg.rank() as f32; 4 << 20];
        reading_peers::stream_until_killed(&pg, 2, || pg.all_reduce(&mut buf, ReduceOp::Sum));
        return;
    }
    let _guard = heavy_lock();
    let lines = common::run_processes_one_killed(NAME, 3, ENV, 2);
    reading_peers::assert_named_by_survivors(&lines, 2);
}
