//! Async operations (`Work`), issue order across sync and async calls, and bucketed
//! all-reduce.

use crate::common;

use std::thread;
use std::time::{Duration, Instant};

use common::elements::mix;
use common::{digest, heavy_lock, run_processes, run_threads, GROUP_TIMEOUT, RESULT_PREFIX};
use ringccl::half::bf16;
use ringccl::{Error, ProcessGroup, ReduceOp, Work};

fn exact(rank: usize, i: usize) -> f32 {
    ((rank * 5 + i * 3) % 13) as f32
}

fn interleaved(pg: &ProcessGroup) -> Vec<String> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let sum = |i: usize| (0..n).map(|r| exact(r, i)).sum::<f32>();
    let a: Vec<f32> = (0..1000).map(|i| exact(rank, i)).collect();
    let w1 = pg.all_reduce_async(a, ReduceOp::Sum).unwrap();
    let mut b: Vec<i64> = vec![rank as i64 + 1; 77];
    pg.all_reduce(&mut b, ReduceOp::Product).unwrap();
    let c: Vec<u8> = vec![rank as u8; 300_000];
    let w2 = pg.broadcast_async(c, n - 1).unwrap();
    pg.barrier().unwrap();
    let w3 = pg.barrier_async().unwrap();
    let d: Vec<f32> = (0..200_000).map(|i| exact(rank, i)).collect();
    let w4 = pg.all_reduce_async(d, ReduceOp::Max).unwrap();
    let mut e = vec![rank as f64; 10];
    pg.broadcast(&mut e, 0).unwrap();

    let a = w1.wait().unwrap();
    assert!(a.iter().enumerate().all(|(i, &x)| x == sum(i)));
    assert_eq!(b, vec![(1..=n as i64).product::<i64>(); 77]);
    assert_eq!(w2.wait().unwrap(), vec![(n - 1) as u8; 300_000]);
    w3.wait().unwrap();
    let d = w4.wait().unwrap();
    assert!(d
        .iter()
        .enumerate()
        .all(|(i, &x)| x == (0..n).map(|r| exact(r, i)).fold(0.0, f32::max)));
    assert_eq!(e, vec![0.0; 10]);
    vec![format!("{:016x}", digest(bytemuck::cast_slice(&a)))]
}

#[test]
fn async_and_sync_calls_interleave_in_issue_order() {
    let _guard = heavy_lock();
    for n in [1, 2, 3, 5] {
        let out = run_threads(n, GROUP_TIMEOUT, |pg| interleaved(&pg));
        assert!(out.iter().all(|o| o == &out[0]));
    }
}

#[test]
fn async_and_sync_calls_interleave_across_processes() {
    const NAME: &str = "async_and_sync_calls_interleave_across_processes";
    if let Some(pg) = common::child_group(NAME) {
        for line in interleaved(&pg) {
            println!("{RESULT_PREFIX}{line}");
        }
        return;
    }
    let _guard = heavy_lock();
    let out = run_processes(NAME, 4);
    assert!(out.iter().all(|o| o == &out[0] && !o.is_empty()), "{out:?}");
}

#[test]
fn a_hundred_works_outstanding_at_once() {
    let _guard = heavy_lock();
    run_threads(4, GROUP_TIMEOUT, |pg| {
        let rank = pg.rank();
        let works: Vec<(usize, Work<Vec<i32>>)> = (0..100)
            .map(|k| {
                let len = 1 + (k * 37) % 5000;
                let buf: Vec<i32> = (0..len).map(|i| (rank * 1000 + i + k) as i32).collect();
                (k, pg.all_reduce_async(buf, ReduceOp::Sum).unwrap())
            })
            .collect();
        // Wait in reverse issue order: results do not depend on the order of waits.
        for (k, work) in works.into_iter().rev() {
            let got = work.wait().unwrap();
            for (i, &x) in got.iter().enumerate() {
                let want: i32 = (0..4).map(|r| (r * 1000 + i + k) as i32).sum();
                assert_eq!(x, want, "work {k} element {i}");
            }
        }
    });
}

#[test]
fn dropped_work_still_completes_and_later_ops_are_unaffected() {
    let _guard = heavy_lock();
    run_threads(3, GROUP_TIMEOUT, |pg| {
        let rank = pg.rank();
        drop(
            pg.all_reduce_async(vec![rank as f32; 1 << 20], ReduceOp::Sum)
                .unwrap(),
        );
        drop(pg.broadcast_async(vec![rank as u8; 999], 1).unwrap());
        drop(pg.barrier_async().unwrap());
        let mut x = vec![rank as f64 + 0.5; 4097];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, vec![4.5; 4097]);
        let w = pg.all_reduce_async(vec![1u8; 10], ReduceOp::Sum).unwrap();
        assert_eq!(w.wait().unwrap(), vec![3u8; 10]);
    });
}

#[test]
fn wait_timeout_and_is_completed_report_progress() {
    let _guard = heavy_lock();
    run_threads(2, GROUP_TIMEOUT, |pg| {
        if pg.rank() == 1 {
            thread::sleep(Duration::from_millis(400));
        }
        let started = Instant::now();
        let mut work = pg.barrier_async().unwrap();
        if pg.rank() == 0 {
            assert!(!work.is_completed(), "rank 1 has not arrived yet");
            assert!(work.wait_timeout(Duration::from_millis(50)).is_none());
        }
        let result = loop {
            if let Some(result) = work.wait_timeout(Duration::from_millis(20)) {
                break result;
            }
        };
        result.unwrap();
        assert!(work.is_completed());
        // A spent Work says so instead of blocking.
        assert!(matches!(
            work.wait_timeout(Duration::ZERO),
            Some(Err(Error::InvalidArgument(_)))
        ));
        if pg.rank() == 0 {
            assert!(started.elapsed() >= Duration::from_millis(200));
        }
    });
}

#[test]
fn async_argument_errors_come_back_at_once() {
    let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))
        .unwrap();
    let err = pg.all_reduce_async(vec![1i32], ReduceOp::Avg).unwrap_err();
    assert!(matches!(err, Error::UnsupportedOp { .. }), "{err:?}");
    let err = pg
        .broadcast_async(vec![1i32], 3)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[test]
fn bucketed_all_reduce_handles_mixed_sizes_empty_tensors_and_oversized_ones() {
    let _guard = heavy_lock();
    let lens = [0usize, 5, 1000, 0, 3, 70_000, 1, 16_384, 0];
    for n in [1, 2, 3, 4] {
        for bucket_bytes in [4096, 64 * 1024, 25 << 20] {
            let digests = run_threads(n, GROUP_TIMEOUT, |pg| {
                let rank = pg.rank();
                let mut tensors: Vec<Vec<f32>> = lens
                    .iter()
                    .enumerate()
                    .map(|(t, &len)| (0..len).map(|i| exact(rank, i + t)).collect())
                    .collect();
                let mut views: Vec<&mut [f32]> = tensors.iter_mut().map(|t| &mut t[..]).collect();
                pg.all_reduce_bucketed(&mut views, ReduceOp::Sum, bucket_bytes)
                    .unwrap();
                for (t, tensor) in tensors.iter().enumerate() {
                    for (i, &x) in tensor.iter().enumerate() {
                        let want: f32 = (0..n).map(|r| exact(r, i + t)).sum();
                        assert_eq!(x, want, "n={n} cap={bucket_bytes} tensor {t} element {i}");
                    }
                }
                // Inexact values: every rank must still hold the same bits.
                let mut noisy: Vec<Vec<bf16>> = lens
                    .iter()
                    .map(|&len| {
                        (0..len)
                            .map(|i| bf16::from_f64((mix(rank, i) % 1000) as f64 / 7.0))
                            .collect()
                    })
                    .collect();
                let mut views: Vec<&mut [bf16]> = noisy.iter_mut().map(|t| &mut t[..]).collect();
                pg.all_reduce_bucketed(&mut views, ReduceOp::Avg, bucket_bytes)
                    .unwrap();
                noisy
                    .iter()
                    .map(|t| digest(bytemuck::cast_slice(t)))
                    .collect::<Vec<_>>()
            });
            assert!(
                digests.iter().all(|d| d == &digests[0]),
                "n={n} cap={bucket_bytes}"
            );
        }
    }
}

#[test]
fn bucketed_rejects_integer_mean_up_front() {
    let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))
        .unwrap();
    let mut a = [1i32; 3];
    let err = pg
        .all_reduce_bucketed(&mut [&mut a[..]], ReduceOp::Avg, 1024)
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedOp { .. }), "{err:?}");
}
