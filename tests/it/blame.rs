//! The right rank blamed, every time. Three ranks as real processes on
//! loopback; ranks 0 and 1 enter an all-reduce at once, rank 2 arrives only after their
//! deadline. Whichever survivor gives up first, and whether the other one times out too
//! or hears its abort notice first, every survivor's error names rank 2 as the likely
//! cause, and none names rank 0 or rank 1 (which only gave up, or aborted in reaction).
//! The race between the two survivors is what made the blame vary from run to run, so
//! the scenario runs [`RUNS`] times, [`AT_ONCE`] groups at a time (the ranks mostly
//! sleep), about 20 s in all on a quiet 2-core machine.

use crate::common;

use std::time::{Duration, Instant};

use common::{child_group, heavy_lock, run_processes_with_env, RESULT_PREFIX};
use ringccl::ReduceOp;

/// How often the scenario runs.
const RUNS: usize = 10;
/// How many groups run at once.
const AT_ONCE: usize = 5;
/// The group's deadline (seconds): short, so ten runs take about a minute.
const TIMEOUT_SECS: u64 = 3;
/// How late rank 2 is: past the others' deadline and the moment they give up (up to
/// `PEER_FAILURE_GRACE`, 2 s, after it), so that its call comes after the abort. (Only a
/// little late, it may find the others' data still in its sockets and finish.)
const LATE: Duration = Duration::from_millis(TIMEOUT_SECS * 1000 + 3500);
/// The most ten runs may take on a loaded 2-core machine (each is about 8 s).
const ALL_RUNS_WITHIN: Duration = Duration::from_secs(400);

const TEST: &str = "a_late_rank_is_blamed_by_every_survivor_every_time";

/// One rank's outcome: the rank its error names as the likely cause, and the message.
fn report(outcome: Result<(), ringccl::Error>) {
    match outcome {
        Ok(()) => println!("{RESULT_PREFIX}ok"),
        Err(e) => {
            let cause = e
                .likely_cause()
                .map_or_else(|| "none".to_string(), |r| r.to_string());
            println!(
                "{RESULT_PREFIX}{cause} {}",
                e.to_string().replace('\n', " ")
            );
        }
    }
}

#[test]
fn a_late_rank_is_blamed_by_every_survivor_every_time() {
    if let Some(pg) = child_group(TEST) {
        let mut x = vec![1.0f32; 1024];
        // Every rank connected and through one collective: the late one is late for the
        // second.
        pg.all_reduce(&mut x, ReduceOp::Sum)
            .expect("warm-up all-reduce");
        if pg.rank() == 2 {
            std::thread::sleep(LATE);
        }
        report(pg.all_reduce(&mut x, ReduceOp::Sum));
        return;
    }
    let _guard = heavy_lock();
    let started = Instant::now();
    let timeout = TIMEOUT_SECS.to_string();
    let mut failures = Vec::new();
    let mut outcomes = Vec::new();
    for batch in 0..RUNS.div_ceil(AT_ONCE) {
        let runs = (batch * AT_ONCE)..((batch + 1) * AT_ONCE).min(RUNS);
        std::thread::scope(|scope| {
            let groups: Vec<_> = runs
                .map(|run| {
                    let timeout = timeout.as_str();
                    let group = scope.spawn(move || {
                        run_processes_with_env(TEST, 3, &[("RINGCCL_TEST_TIMEOUT", timeout)])
                    });
                    (run, group)
                })
                .collect();
            for (run, group) in groups {
                outcomes.push((run, group.join().expect("a run's harness panicked")));
            }
        });
    }
    for (run, results) in outcomes {
        for (rank, lines) in results.iter().enumerate() {
            let line = lines.first().map_or("nothing reported", String::as_str);
            let (cause, text) = line.split_once(' ').unwrap_or((line, ""));
            eprintln!("run {run}, rank {rank}: cause {cause}: {text}");
            // Every rank, the late one included, names rank 2; no message calls an
            // aborting survivor the root cause.
            let blames_a_survivor = ["rank 0", "rank 1"].iter().any(|r| {
                text.contains(&format!("{r} is the likely cause"))
                    || text.contains(&format!("connections to {r} had also closed"))
            });
            let names_rank_2 = if rank == 2 {
                text.contains("the notice names this rank (rank 2) as the likely cause")
            } else {
                text.contains("rank 2 is the likely cause")
            };
            if cause != "2" || blames_a_survivor || !names_rank_2 {
                failures.push(format!("run {run}, rank {rank}: {line}"));
            }
        }
    }
    let took = started.elapsed();
    eprintln!("{RUNS} runs in {took:?}");
    assert!(
        failures.is_empty(),
        "rank 2 must be named as the cause, every time:\n{}",
        failures.join("\n")
    );
    assert!(took < ALL_RUNS_WITHIN, "{RUNS} runs took {took:?}");
}
