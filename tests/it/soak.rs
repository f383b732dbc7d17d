//! Soak: random collectives with random sizes, types, operators and roots across 4
//! ranks, for `RINGCCL_SOAK_SECS` seconds (default 6 here; `scripts/soak.sh` runs 60).
//! Pass: no error, every result exact and bit-identical on every rank, and resident
//! memory flat between the first quarter of the run and its end.

use crate::common;

use std::time::{Duration, Instant};

use common::elements::{reference, TestElem};
use common::{digest, heavy_lock, run_threads, GROUP_TIMEOUT};
use ringccl::half::{bf16, f16};
use ringccl::{ProcessGroup, ReduceOp};

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Product,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

/// The same stream of choices on every rank.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }

    /// Log-uniform-ish element counts from 0 to about 1M.
    fn count(&mut self) -> usize {
        let bits = self.below(21) as u32;
        self.below(1u64 << bits)
    }
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn bytes<T: TestElem>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// One random operation on type `T`; returns a digest of this rank's result, which must
/// agree across ranks for the replicated collectives (`None` otherwise).
fn one_op<T: TestElem>(pg: &ProcessGroup, rng: &mut Rng) -> Option<u64> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let mut op = OPS[rng.below(5)];
    if op == ReduceOp::Avg && !T::DTYPE.is_float() {
        op = ReduceOp::Sum;
    }
    let count = rng.count();
    let mine = |len: usize| -> Vec<T> { (0..len).map(|i| T::input(rank, i, op)).collect() };
    match rng.below(7) {
        0 | 1 => {
            let mut buf = mine(count);
            pg.all_reduce(&mut buf, op).unwrap();
            let want: Vec<T> = (0..count).map(|i| reference(n, i, op)).collect();
            assert_eq!(
                bytes(&buf),
                bytes(&want),
                "all_reduce {op} {} x {count}",
                T::DTYPE
            );
            Some(digest(bytes(&buf)))
        }
        2 => {
            let root = rng.below(n as u64);
            let mut buf = mine(count);
            pg.broadcast(&mut buf, root).unwrap();
            let want: Vec<T> = (0..count).map(|i| T::input(root, i, op)).collect();
            assert_eq!(bytes(&buf), bytes(&want), "broadcast root {root}");
            Some(digest(bytes(&buf)))
        }
        3 => {
            let per = count / n;
            let mut out = mine(per * n);
            pg.all_gather(&mine(per), &mut out).unwrap();
            let want: Vec<T> = (0..per * n)
                .map(|j| T::input(j / per, j % per, op))
                .collect();
            assert_eq!(bytes(&out), bytes(&want), "all_gather {} x {per}", T::DTYPE);
            Some(digest(bytes(&out)))
        }
        4 => {
            let per = count / n;
            let mut out = mine(per);
            pg.reduce_scatter(&mine(per * n), &mut out, op).unwrap();
            let want: Vec<T> = (0..per).map(|i| reference(n, rank * per + i, op)).collect();
            assert_eq!(bytes(&out), bytes(&want), "reduce_scatter {op}");
            None
        }
        5 => {
            let work = pg.all_reduce_async(mine(count), op).unwrap();
            let buf = work.wait().unwrap();
            let want: Vec<T> = (0..count).map(|i| reference(n, i, op)).collect();
            assert_eq!(bytes(&buf), bytes(&want), "all_reduce_async {op}");
            Some(digest(bytes(&buf)))
        }
        _ => {
            pg.barrier().unwrap();
            None
        }
    }
}

#[test]
fn random_collectives_stay_exact_identical_and_flat() {
    let secs: f64 = std::env::var("RINGCCL_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6.0);
    let _heavy = heavy_lock();
    let reports = run_threads(4, GROUP_TIMEOUT, |pg| {
        let mut rng = Rng(0x50A_C0FFEE);
        let started = Instant::now();
        let budget = Duration::from_secs_f64(secs);
        let mut iterations = 0u64;
        let mut rss_quarter = None;
        loop {
            // Rank 0 decides, for everyone, whether to go on.
            let mut go = [u8::from(started.elapsed() < budget)];
            pg.broadcast(&mut go, 0).unwrap();
            if go[0] == 0 {
                break;
            }
            let result = match rng.below(8) {
                0 => one_op::<f32>(&pg, &mut rng),
                1 => one_op::<f64>(&pg, &mut rng),
                2 => one_op::<f16>(&pg, &mut rng),
                3 => one_op::<bf16>(&pg, &mut rng),
                4 => one_op::<i8>(&pg, &mut rng),
                5 => one_op::<u8>(&pg, &mut rng),
                6 => one_op::<i32>(&pg, &mut rng),
                _ => one_op::<i64>(&pg, &mut rng),
            };
            if let Some(d) = result {
                // Bit-identical on every rank.
                let mut all = [0i64; 4];
                pg.all_gather(&[d as i64], &mut all).unwrap();
                assert!(all.iter().all(|&x| x == all[0]), "ranks differ: {all:x?}");
            }
            iterations += 1;
            if rss_quarter.is_none() && started.elapsed() >= budget / 4 {
                rss_quarter = Some(resident_bytes());
            }
        }
        (iterations, rss_quarter.unwrap_or(0), resident_bytes())
    });
    let (iterations, quarter, end) = reports[0];
    println!(
        "soak: {iterations} random collectives in {secs}s on 4 ranks; resident memory {:.1} MiB at 1/4, {:.1} MiB at the end",
        quarter as f64 / 1048576.0,
        end as f64 / 1048576.0
    );
    assert!(iterations > 10, "only {iterations} iterations");
    assert!(
        end <= quarter + (48 << 20),
        "resident memory grew from {quarter} to {end} bytes"
    );
}
