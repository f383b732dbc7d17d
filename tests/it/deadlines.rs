//! Issue 12, point 2: a call's deadline counts from when it was issued, time spent queued
//! behind earlier calls included; and a huge timeout (even `Duration::MAX`) means "no
//! deadline", never a panic, while an out-of-range environment value is `InvalidEnv`.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads_with};
use ringccl::{init_process_group, Error, InitOptions, ReduceOp};

/// Slack on top of a deadline before a failure counts as late, for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(6);
/// Upper bound for "failed at once" (an abort reaching a call) on a loaded machine.
const PROMPT: Duration = Duration::from_secs(20);
/// The group's deadline where only a per-call deadline should end a call.
const LONG: Duration = Duration::from_secs(120);

/// Waits until `flag` is set, for at most `limit` (so a failed rank cannot hang the test).
fn wait_for(flag: &AtomicBool, limit: Duration) {
    let until = Instant::now() + limit;
    while !flag.load(Ordering::Acquire) && Instant::now() < until {
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_call_queued_behind_a_stuck_one_fails_by_its_own_deadline_naming_the_queue() {
    let _guard = heavy_lock();
    let short = Duration::from_secs(2);
    let rank0_done = AtomicBool::new(false);
    let results = run_threads_with(
        2,
        LONG,
        |opts| opts,
        |pg| {
            if pg.rank() == 1 {
                // Never joins the all-reduce; once rank 0 has given up, its next call fails
                // at once (rank 0 aborted the group) instead of after the group's deadline.
                wait_for(&rank0_done, LONG);
                let started = Instant::now();
                let outcome = pg.barrier();
                return (vec![format!("{outcome:?}")], vec![started.elapsed()]);
            }
            let stuck = pg
                .all_reduce_async(vec![1.0f32; 16], ReduceOp::Sum)
                .unwrap();
            let started = Instant::now();
            let queued = pg.barrier_with_timeout(short).unwrap_err();
            let queued_after = started.elapsed();
            let stuck_outcome = stuck.wait();
            let stuck_after = started.elapsed();
            let later = pg.all_reduce(&mut [1.0f32], ReduceOp::Sum).unwrap_err();
            rank0_done.store(true, Ordering::Release);
            let texts = vec![
                queued.to_string(),
                format!("{stuck_outcome:?}"),
                later.to_string(),
            ];
            assert!(
                matches!(queued, Error::QueueTimeout { op: "barrier", call: 2, timeout, .. } if timeout == short),
                "{queued:?}"
            );
            (texts, vec![queued_after, stuck_after])
        },
    );
    let (texts, times) = &results[0];
    eprintln!(
        "rank 0: {texts:#?} after {times:?}; rank 1: {:?}",
        results[1]
    );
    assert!(
        times[0] >= Duration::from_secs(2) && times[0] < Duration::from_secs(2) + SLACK,
        "the queued barrier failed after {:?}, not by its own 2 s deadline",
        times[0]
    );
    assert!(
        texts[0].contains("still queued behind all_reduce (call #1), which is still running"),
        "{}",
        texts[0]
    );
    assert!(
        texts[0].contains("create a new process group"),
        "{}",
        texts[0]
    );
    // The abort woke the stuck all-reduce (its own deadline is 120 s away).
    assert!(texts[1].starts_with("Err("), "{}", texts[1]);
    assert!(
        times[1] < times[0] + PROMPT,
        "the stuck call ended after {:?}",
        times[1]
    );
    // Later calls fail at once, quoting why.
    assert!(texts[2].contains("queued behind"), "{}", texts[2]);
    // The peer's next call fails well before its 120 s deadline.
    let (peer, peer_times) = &results[1];
    assert!(peer[0].starts_with("Err("), "{}", peer[0]);
    assert!(
        peer_times[0] < PROMPT,
        "rank 1 failed after {:?}",
        peer_times[0]
    );
}

#[test]
fn an_async_call_queued_behind_a_late_one_gives_up_at_its_own_deadline() {
    let _guard = heavy_lock();
    let timeout = Duration::from_secs(3);
    let rank0_done = AtomicBool::new(false);
    let results = run_threads_with(
        2,
        timeout,
        |opts| opts,
        |pg| {
            if pg.rank() == 1 {
                wait_for(&rank0_done, LONG);
                return None;
            }
            // The all-reduce times out at 3 s, then spends up to 2 s finding out which
            // connections failed (PEER_FAILURE_GRACE); the barrier behind it does not wait
            // for that: its own deadline is also 3 s.
            let started = Instant::now();
            let stuck = pg
                .all_reduce_async(vec![1.0f32; 16], ReduceOp::Sum)
                .unwrap();
            let queued = pg.barrier_async().unwrap();
            let outcome = queued.wait();
            let elapsed = started.elapsed();
            let stuck_outcome = stuck.wait();
            rank0_done.store(true, Ordering::Release);
            Some((outcome, elapsed, stuck_outcome))
        },
    );
    let (outcome, elapsed, stuck_outcome) = results[0].as_ref().unwrap();
    eprintln!("barrier: {outcome:?} after {elapsed:?}; all-reduce: {stuck_outcome:?}");
    assert!(
        *elapsed >= timeout && *elapsed < timeout + SLACK,
        "the queued barrier ended after {elapsed:?}"
    );
    match outcome {
        Err(e @ Error::QueueTimeout { op: "barrier", .. }) => {
            assert!(e.to_string().contains("behind all_reduce (call #1)"), "{e}")
        }
        // On a machine too loaded to wake the waiting thread within the all-reduce's
        // 2 s of diagnosis, the barrier got its turn after its deadline instead.
        Err(Error::GroupBroken { .. } | Error::Timeout { .. }) => {
            eprintln!("note: the waiting thread woke late; the barrier failed by its turn")
        }
        other => panic!("expected the queued barrier to fail, got {other:?}"),
    }
    assert!(stuck_outcome.is_err());
}

#[test]
fn an_init_timeout_of_duration_max_means_no_deadline() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let pg = init_process_group(
        "gloo",
        InitOptions::new(0, 1, "127.0.0.1:0").timeout(Duration::MAX),
    )
    .unwrap();
    let mut x = [1.5f32, 2.0];
    pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!(x, [1.5, 2.0]);
    let results = run_threads_with(
        2,
        Duration::MAX,
        |opts| opts,
        |pg| {
            let mut x = [pg.rank() as f64 + 1.0; 3];
            pg.all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
        },
    );
    for (rank, result) in results.into_iter().enumerate() {
        assert_eq!(result.unwrap(), [3.0; 3], "rank {rank}");
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

#[test]
fn a_per_call_timeout_of_duration_max_works_and_does_not_poison_the_group() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let results = run_threads_with(
        2,
        LONG,
        |opts| opts,
        |pg| {
            let r = pg.rank() as f32;
            let mut x = [r + 1.0; 4];
            pg.all_reduce_with_timeout(&mut x, ReduceOp::Sum, Duration::MAX)?;
            let mut y = [r; 2];
            pg.broadcast_with_timeout(&mut y, 1, Duration::MAX)?;
            pg.barrier_with_timeout(Duration::MAX)?;
            // Later calls, with the group's deadline, still work.
            let mut z = [r * 10.0];
            pg.all_reduce(&mut z, ReduceOp::Max)?;
            let w = pg.all_reduce_async(vec![1i32; 5], ReduceOp::Sum)?.wait()?;
            Ok::<_, Error>((x, y, z, w))
        },
    );
    for (rank, result) in results.into_iter().enumerate() {
        let (x, y, z, w) = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(
            (x, y, z, w),
            ([3.0; 4], [1.0; 2], [10.0], vec![2; 5]),
            "rank {rank}"
        );
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

#[test]
fn out_of_range_timeouts_in_the_environment_are_invalid_env_naming_the_variable() {
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];
    let parse = |var: &str, value: &str| {
        InitOptions::from_vars(|k| {
            if k == var {
                return Some(value.to_string());
            }
            base.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        })
    };
    for var in ["RINGCCL_TIMEOUT", "RINGCCL_DEAD_PEER_TIMEOUT"] {
        for bad in [
            "1e20", "1e300", "-1", "-0.5", "NaN", "inf", "-inf", "0", "soon", "",
        ] {
            let err = parse(var, bad).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(&err, Error::InvalidEnv { var: named, value, .. } if named == &var && value == bad),
                "{var}={bad}: {err:?}"
            );
            assert!(text.contains("expected a number of seconds"), "{text}");
            assert!(text.contains("at most 1.8446744073709552e19"), "{text}");
        }
    }
    // In range, however large, is accepted: a deadline centuries away.
    let opts = parse("RINGCCL_TIMEOUT", "1e18").unwrap();
    assert_eq!(opts.timeout, Duration::from_secs(1_000_000_000_000_000_000));
    let opts = parse("RINGCCL_DEAD_PEER_TIMEOUT", "1e18").unwrap();
    assert_eq!(
        opts.dead_peer_timeout,
        Duration::from_secs(1_000_000_000_000_000_000)
    );
    assert_eq!(
        parse("RINGCCL_TIMEOUT", " 2.5 ").unwrap().timeout,
        Duration::from_millis(2500)
    );
}

#[test]
fn a_huge_dead_peer_timeout_still_connects_and_runs() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let results = run_threads_with(
        2,
        LONG,
        |opts| opts.dead_peer_timeout(Duration::MAX),
        |pg| {
            let mut x = [pg.rank() as i64 + 1; 2];
            pg.all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
        },
    );
    for (rank, result) in results.into_iter().enumerate() {
        assert_eq!(result.unwrap(), [3; 2], "rank {rank}");
    }
    // From the environment too (1e18 s is in range; the kernel's limits apply).
    let vars = [("RINGCCL_DEAD_PEER_TIMEOUT", "1e18")];
    let results = run_threads_with(
        2,
        LONG,
        |opts| {
            let from_env = InitOptions::from_vars(|k| {
                vars.iter()
                    .find(|v| v.0 == k)
                    .map(|v| v.1.to_string())
                    .or_else(|| match k {
                        "RANK" => Some(opts.rank.to_string()),
                        "WORLD_SIZE" => Some("2".into()),
                        "MASTER_ADDR" => Some("127.0.0.1".into()),
                        "MASTER_PORT" => Some("1".into()),
                        _ => None,
                    })
            })
            .unwrap();
            opts.dead_peer_timeout(from_env.dead_peer_timeout)
        },
        |pg| pg.barrier(),
    );
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}
