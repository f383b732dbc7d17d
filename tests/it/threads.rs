//! Issue 12, point 5: calls from several threads on one group never mix silently. A call
//! issued while another thread's calls are pending fails with `ConcurrentUse` and aborts
//! the group; taking turns (one thread's calls finish before the other's start) works;
//! and a group per thread (`ProcessGroup::new_group`) lets threads race freely with
//! correct results.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads};
use ringccl::{Error, ProcessGroup, ReduceOp};

/// The group's deadline: long, so that only detection and aborts end calls early.
const LONG: Duration = Duration::from_secs(120);
/// Upper bound for a whole test on a loaded 2-core machine.
const PROMPT: Duration = Duration::from_secs(30);
/// Calls each thread makes, or the most it makes while waiting for its first error.
const CALLS: usize = 20;
const MAX_CALLS: usize = 20_000;

/// What one call returned.
#[derive(Debug)]
enum Outcome {
    Correct,
    Wrong(#[allow(dead_code)] f32),
    Failed(String),
}

/// All-reduces of `[value; 8]` (every rank contributes the same value, so the sum must
/// be `2 * value`), each recorded: `CALLS` of them, or with `until_error` as many as it
/// takes to get an error (at most `MAX_CALLS`).
fn all_reduce_loop(pg: &ProcessGroup, value: f32, until_error: bool) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    let limit = if until_error { MAX_CALLS } else { CALLS };
    while outcomes.len() < limit {
        let mut buf = [value; 8];
        let outcome = match pg.all_reduce(&mut buf, ReduceOp::Sum) {
            Ok(()) if buf == [2.0 * value; 8] => Outcome::Correct,
            Ok(()) => Outcome::Wrong(buf[0]),
            Err(e) => Outcome::Failed(e.to_string()),
        };
        let failed = matches!(outcome, Outcome::Failed(_));
        outcomes.push(outcome);
        if failed && until_error {
            break;
        }
    }
    outcomes
}

/// Rank `rank`'s two threads: thread "a" all-reduces ones, thread "b" hundreds; on rank
/// 0 "a" starts `stagger` before "b", on rank 1 "b" starts first (the different orders
/// of the issue).
fn two_threads(
    pg: &ProcessGroup,
    start: &Barrier,
    stagger: Duration,
    until_error: bool,
) -> Vec<Vec<Outcome>> {
    let first_is_a = pg.rank() == 0;
    thread::scope(|scope| {
        let spawn = |name: &str, value: f32, delay: Duration| {
            thread::Builder::new()
                .name(format!("rank-{}-{name}", pg.rank()))
                .spawn_scoped(scope, move || {
                    start.wait();
                    thread::sleep(delay);
                    all_reduce_loop(pg, value, until_error)
                })
                .expect("spawn")
        };
        let (delay_a, delay_b) = if first_is_a {
            (Duration::ZERO, stagger)
        } else {
            (stagger, Duration::ZERO)
        };
        let a = spawn("a", 1.0, delay_a);
        let b = spawn("b", 100.0, delay_b);
        vec![a.join().expect("thread a"), b.join().expect("thread b")]
    })
}

/// Per rank, per thread, the outcomes of its calls.
type Outcomes = Vec<Vec<Vec<Outcome>>>;

fn wrong_results(outcomes: &Outcomes) -> usize {
    outcomes
        .iter()
        .flatten()
        .flatten()
        .filter(|o| matches!(o, Outcome::Wrong(_)))
        .count()
}

/// How many errors said to give each thread its own group.
fn named_errors(outcomes: &Outcomes) -> usize {
    outcomes
        .iter()
        .flatten()
        .flatten()
        .filter(|o| {
            matches!(o, Outcome::Failed(text)
                if text.contains("issued all_reduce while all_reduce")
                    && text.contains("Give each thread its own process group"))
        })
        .count()
}

fn check(outcomes: &Outcomes) -> usize {
    for (rank, list) in outcomes.iter().enumerate() {
        let list: Vec<_> = list.iter().flatten().collect();
        let wrong: Vec<_> = list
            .iter()
            .filter(|o| matches!(o, Outcome::Wrong(_)))
            .collect();
        assert!(
            wrong.is_empty(),
            "rank {rank} got mixed data returned as success: {wrong:?}"
        );
    }
    named_errors(outcomes)
}

#[test]
fn two_threads_issuing_at_once_get_an_error_never_mixed_data() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let rank0_done = AtomicBool::new(false);
    let outcomes = run_threads(2, LONG, |pg| {
        let start = Barrier::new(2);
        if pg.rank() == 1 {
            // Rank 1 starts once rank 0 has seen its threads overlap and aborted (its
            // first call cannot finish before rank 1 joins, so the overlap is certain),
            // and once the abort notice has had time to arrive.
            let until = Instant::now() + PROMPT;
            while !rank0_done.load(Ordering::Acquire) && Instant::now() < until {
                thread::sleep(Duration::from_millis(10));
            }
            thread::sleep(Duration::from_millis(500));
        }
        let outcomes = two_threads(&pg, &start, Duration::from_millis(5), false);
        if pg.rank() == 0 {
            rank0_done.store(true, Ordering::Release);
        }
        outcomes
    });
    eprintln!("{outcomes:#?}");
    let named = check(&outcomes);
    assert!(named >= 1, "no error said to use a group per thread");
    // Once aborted, nothing succeeds on either rank.
    for (rank, list) in outcomes.iter().enumerate() {
        assert!(
            list.iter()
                .flatten()
                .all(|o| matches!(o, Outcome::Failed(_))),
            "rank {rank}: {list:?}"
        );
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

/// The issue's own scenario, free-running: both ranks' threads start together and call
/// until they get an error. The overlap is caught and the group aborted on both ranks.
/// What cannot be promised here: until some rank sees two threads' calls pending at
/// once, each rank just runs one thread's calls after the other, and the ranks may pair
/// them crosswise (rank 0's "a" with rank 1's "b"): those results are mixed and nothing
/// local can tell (it looks exactly like one thread issuing calls in different orders on
/// different ranks). Their count is printed, not asserted.
#[test]
fn threads_racing_from_the_start_are_caught_and_abort_both_ranks() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let start = Barrier::new(4);
    let outcomes: Outcomes =
        run_threads(2, LONG, |pg| two_threads(&pg, &start, Duration::ZERO, true));
    let calls: Vec<Vec<usize>> = outcomes
        .iter()
        .map(|rank| rank.iter().map(Vec::len).collect())
        .collect();
    eprintln!(
        "calls per thread {calls:?}; mixed results returned as success: {}; errors naming \
         the cause: {}",
        wrong_results(&outcomes),
        named_errors(&outcomes)
    );
    assert!(
        named_errors(&outcomes) >= 1,
        "no error said to use a group per thread: {outcomes:?}"
    );
    for (rank, threads) in outcomes.iter().enumerate() {
        for list in threads {
            assert!(
                matches!(list.last(), Some(Outcome::Failed(_))),
                "rank {rank}: a thread went on for {} calls without an error",
                list.len()
            );
        }
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

/// The scenario done right: each thread gets its own group, formed from the
/// rank's group, and the threads race in opposite orders on the two ranks. Every result
/// is correct, and nothing fails.
#[test]
fn a_group_per_thread_lets_threads_race_with_correct_results() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let start = Barrier::new(4);
    let outcomes: Outcomes = run_threads(2, LONG, |pg| {
        let a = pg.new_group(&[0, 1]).expect("group a").expect("member");
        let b = pg.new_group(&[0, 1]).expect("group b").expect("member");
        // Rank 0 starts "a" first, rank 1 starts "b" first, and both run many calls.
        let (delay_a, delay_b) = if pg.rank() == 0 {
            (Duration::ZERO, Duration::from_millis(5))
        } else {
            (Duration::from_millis(5), Duration::ZERO)
        };
        let jobs = [("a", &a, 1.0, delay_a), ("b", &b, 100.0, delay_b)];
        thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(name, group, value, delay)| {
                    let start = &start;
                    thread::Builder::new()
                        .name(format!("rank-{}-{name}", pg.rank()))
                        .spawn_scoped(scope, move || {
                            start.wait();
                            thread::sleep(delay);
                            (0..10)
                                .flat_map(|_| all_reduce_loop(group, value, false))
                                .collect::<Vec<_>>()
                        })
                        .expect("spawn")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        })
    });
    for (rank, threads) in outcomes.iter().enumerate() {
        for list in threads {
            assert_eq!(list.len(), 10 * CALLS, "rank {rank}");
            assert!(
                list.iter().all(|o| matches!(o, Outcome::Correct)),
                "rank {rank}: {list:?}"
            );
        }
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

#[test]
fn threads_taking_turns_on_one_group_get_correct_results() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let rounds = 40;
    let results = run_threads(2, LONG, |pg| {
        let pg = &pg;
        let rank = pg.rank() as f32;
        // Round i: the holder all-reduces (rank + 1) * i twice (blocking, then async) and
        // hands the group over at once; the sum over the 2 ranks is 3 * i.
        let round = |i: usize| -> Result<bool, Error> {
            let value = (rank + 1.0) * i as f32;
            let mut buf = [value; 4];
            pg.all_reduce(&mut buf, ReduceOp::Sum)?;
            let back = pg.all_reduce_async(vec![value; 4], ReduceOp::Sum)?.wait()?;
            let want = 3.0 * i as f32;
            Ok(buf == [want; 4] && back == vec![want; 4])
        };
        thread::scope(|scope| {
            let (to_b, from_a) = mpsc::channel::<usize>();
            let (to_a, from_b) = mpsc::channel::<usize>();
            let player = |name: &'static str,
                          first: usize,
                          inbox: mpsc::Receiver<usize>,
                          outbox: mpsc::Sender<usize>| {
                let round = &round;
                thread::Builder::new()
                    .name(format!("rank-{}-{name}", pg.rank()))
                    .spawn_scoped(scope, move || {
                        let mut good = Vec::new();
                        let mut next = first;
                        while next < rounds {
                            if next > 0 {
                                match inbox.recv_timeout(LONG) {
                                    Ok(i) => next = i,
                                    Err(_) => break,
                                }
                            }
                            good.push(round(next).map_err(|e| e.to_string()));
                            let _ = outbox.send(next + 1);
                            next += 2;
                        }
                        good
                    })
                    .expect("spawn")
            };
            let a = player("a", 0, from_b, to_b);
            let b = player("b", 1, from_a, to_a);
            let mut all = a.join().expect("a");
            all.extend(b.join().expect("b"));
            // A plain handoff too: one thread after another, then the rank's own thread.
            for i in 0..3 {
                let worker = thread::Builder::new()
                    .name(format!("rank-{}-pool-{i}", pg.rank()))
                    .spawn_scoped(scope, || round(7).map_err(|e| e.to_string()))
                    .expect("spawn");
                all.push(worker.join().expect("pool thread"));
            }
            all.push(round(9).map_err(|e| e.to_string()));
            all
        })
    });
    for (rank, list) in results.iter().enumerate() {
        assert_eq!(list.len(), rounds + 4, "rank {rank}: {list:?}");
        assert!(
            list.iter().all(|r| matches!(r, Ok(true))),
            "rank {rank}: {list:?}"
        );
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}
