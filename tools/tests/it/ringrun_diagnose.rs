//! Issue 13, diagnosis across ranks: `ringrun --hang-timeout SECS` names the rank and op
//! of a hang seconds after SECS, long before the group's own deadline (120 s here), and
//! the failure of a rank (a mismatch, a death) the moment ringrun sees it; `ringrun
//! diagnose DIR` says the same offline.
//!
//! The ranks are this test binary, re-executed under ringrun with `DIAGNOSE_CHILD` naming
//! the scenario: three ranks run warm-up all-reduces, print `entering`, then one rank
//! misbehaves in the next all-reduce (op #W+1).

use crate::common;

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::heavy_lock;
use ringccl::{init_process_group, InitOptions, ReduceOp};

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");
const CHILD: &str = "DIAGNOSE_CHILD";
/// The group's own deadline: the diagnosis must come long before it.
const GROUP_DEADLINE: Duration = Duration::from_secs(120);
/// Longest a ringrun run may take here before the test kills it.
const LIMIT: Duration = Duration::from_secs(150);
/// Warm-up all-reduces before the one that goes wrong.
const WARM_UP: u64 = 4;
/// How late after the hang timeout a diagnosis may come on a loaded 2-core machine
/// (the beacon poll is 200 ms and the dump wait at most 2 s).
const LATE: Duration = Duration::from_secs(5);
/// The group's deadline in the `late` scenario, where rank 2 arrives after it.
const SHORT_DEADLINE: Duration = Duration::from_secs(3);

/// In a child (a rank under ringrun), runs `scenario` and returns true.
fn child() -> bool {
    let Ok(scenario) = std::env::var(CHILD) else {
        return false;
    };
    let deadline = if scenario == "late" {
        SHORT_DEADLINE
    } else {
        GROUP_DEADLINE
    };
    let opts = InitOptions::from_env()
        .expect("ringrun's environment")
        .timeout(deadline);
    let pg = init_process_group("gloo", opts).expect("init_process_group");
    let rank = pg.rank();
    let mut x = vec![1.0f32; 1024];
    for _ in 0..WARM_UP {
        if scenario == "slow" {
            // Long compute between collectives, on every rank: no call is in flight.
            thread::sleep(Duration::from_secs(3));
        }
        pg.all_reduce(&mut x, ReduceOp::Sum)
            .expect("warm-up all-reduce");
    }
    println!("\nentering");
    match (scenario.as_str(), rank) {
        ("skip", 2) => {
            // Skips the all-reduce: off to something else that takes long.
            thread::sleep(Duration::from_secs(100));
            return true;
        }
        ("compute", 2) => thread::sleep(Duration::from_secs(10)),
        // Late past the others' deadline and the 2 s they take to give up: they time
        // out and exit before it calls.
        ("late", 2) => thread::sleep(SHORT_DEADLINE + Duration::from_millis(3500)),
        ("mismatch", 1) => x.truncate(512),
        ("dies", 1) => std::process::exit(3),
        ("killed", 1) => {
            // As the kernel's OOM killer or a scheduler would: SIGKILL, no handler runs.
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status();
            thread::sleep(Duration::from_secs(100));
        }
        _ => {}
    }
    match pg.all_reduce(&mut x, ReduceOp::Sum) {
        Ok(()) => println!("\ndone"),
        Err(e) => {
            eprintln!("all_reduce failed: {e}");
            std::process::exit(1);
        }
    }
    true
}

/// One line of ringrun's output, when the test saw it.
struct Line {
    at: Instant,
    stderr: bool,
    text: String,
}

/// A finished ringrun run.
struct Run {
    lines: Vec<Line>,
    status: ExitStatus,
    started: Instant,
}

impl Run {
    /// When the first line containing `needle` came.
    fn when(&self, needle: &str) -> Option<Instant> {
        self.lines
            .iter()
            .find(|l| l.text.contains(needle))
            .map(|l| l.at)
    }

    /// The `ringrun: DIAGNOSIS:` lines, without that prefix.
    fn diagnosis(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| l.stderr)
            .filter_map(|l| l.text.strip_prefix("ringrun: DIAGNOSIS: "))
            .collect()
    }

    fn all(&self) -> String {
        self.lines
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Seconds from `entering` (rank 0 about to enter the op that goes wrong) to the
    /// first diagnosis line.
    fn entering_to_diagnosis(&self) -> Duration {
        let entering = self
            .when("[rank 0] entering")
            .unwrap_or_else(|| panic!("rank 0 never entered:\n{}", self.all()));
        let diagnosed = self
            .when("ringrun: DIAGNOSIS:")
            .unwrap_or_else(|| panic!("no diagnosis:\n{}", self.all()));
        diagnosed.saturating_duration_since(entering)
    }
}

/// Runs ringrun with 3 ranks of this test binary in `scenario`, streaming its output.
fn ringrun(test: &str, scenario: &str, flags: &[&str], env: &[(&str, &Path)]) -> Run {
    let exe = std::env::current_exe().expect("test binary");
    let started = Instant::now();
    let mut child = Command::new(RINGRUN)
        .args(["--nproc-per-node", "3"])
        .args(flags)
        .arg("--")
        .arg(exe)
        .args([
            "--exact",
            &common::test_path(test),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, scenario)
        .env_remove("RINGCCL_FLIGHT_DIR")
        .envs(env.iter().map(|(k, v)| (k, v.as_os_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ringrun");
    let (tx, rx) = mpsc::channel();
    let stream = |out: Box<dyn Read + Send>, stderr: bool, tx: mpsc::Sender<Option<Line>>| {
        thread::spawn(move || {
            for text in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(Some(Line {
                    at: Instant::now(),
                    stderr,
                    text,
                }));
            }
            let _ = tx.send(None);
        });
    };
    stream(Box::new(child.stdout.take().unwrap()), false, tx.clone());
    stream(Box::new(child.stderr.take().unwrap()), true, tx);
    let mut lines = Vec::new();
    let mut open = 2;
    while open > 0 {
        match rx.recv_timeout(LIMIT.saturating_sub(started.elapsed())) {
            Ok(Some(line)) => lines.push(line),
            Ok(None) => open -= 1,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let text: Vec<String> = lines.into_iter().map(|l| l.text).collect();
                panic!(
                    "ringrun did not finish within {LIMIT:?}:\n{}",
                    text.join("\n")
                );
            }
        }
    }
    let status = child.wait().expect("ringrun's status");
    Run {
        lines,
        status,
        started,
    }
}

/// A directory of its own for one test, removed before and after.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("ringrun-diagnose-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The op number of the all-reduce after the warm-up: the first op in a line such as
/// `... wait in op #5 all_reduce(...)`.
fn op_in(line: &str) -> u64 {
    let after = line
        .split("op #")
        .nth(1)
        .unwrap_or_else(|| panic!("no op in {line:?}"));
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no op number in {line:?}"))
}

#[test]
fn a_rank_that_skips_a_collective_is_named_seconds_after_the_hang_timeout() {
    if child() {
        return;
    }
    const SECS: Duration = Duration::from_secs(3);
    let _heavy = heavy_lock();
    let dir = Scratch::new("skip");
    let run = ringrun(
        "a_rank_that_skips_a_collective_is_named_seconds_after_the_hang_timeout",
        "skip",
        &["--hang-timeout", "3", "--hang-action", "stop"],
        &[("RINGCCL_FLIGHT_DIR", &dir.0)],
    );
    let diagnosis = run.diagnosis();
    let all = run.all();
    assert!(
        !run.status.success(),
        "--hang-action stop exits non-zero:\n{all}"
    );
    assert!(
        diagnosis
            .first()
            .is_some_and(|l| l.starts_with("hang: no call has finished")),
        "{all}"
    );
    let headline = diagnosis.get(1).copied().unwrap_or_default();
    let op = op_in(headline);
    assert!(
        headline.starts_with(&format!(
            "ranks 0, 1 wait in op #{op} all_reduce(sum, 1024 x f32) for rank 2; rank 2 last \
             finished op #{} and has issued nothing since (last seen ",
            op - 1
        )),
        "{all}"
    );
    assert!(all.contains("rank 2's process is running"), "{all}");
    let took = run.entering_to_diagnosis();
    eprintln!("{all}\n(diagnosis {took:?} after rank 0 entered the op)");
    assert!(
        took >= SECS && took <= SECS + LATE,
        "diagnosis {took:?} after the hang began:\n{all}"
    );
    // Stopped at once, not after the rank's 100 s elsewhere or the 120 s deadline.
    assert!(
        run.started.elapsed() < Duration::from_secs(60),
        "{:?}",
        run.started.elapsed()
    );
    assert!(
        all.contains("ringrun: stopping the job (--hang-action stop)"),
        "{all}"
    );

    // The same analysis, offline, on the files the ranks left.
    let offline = Command::new(RINGRUN)
        .arg("diagnose")
        .arg(&dir.0)
        .output()
        .expect("ringrun diagnose");
    let text = String::from_utf8_lossy(&offline.stdout);
    assert!(offline.status.success(), "{text}");
    assert!(
        text.starts_with(&format!(
            "ranks 0, 1 wait in op #{op} all_reduce(sum, 1024 x f32) for rank 2; rank 2 last \
             finished op #{}",
            op - 1
        )),
        "{text}"
    );
}

#[test]
fn a_rank_stuck_in_compute_is_named_once_and_the_job_goes_on() {
    if child() {
        return;
    }
    const SECS: Duration = Duration::from_secs(2);
    let _heavy = heavy_lock();
    let run = ringrun(
        "a_rank_stuck_in_compute_is_named_once_and_the_job_goes_on",
        "compute",
        &["--hang-timeout", "2"],
        &[],
    );
    let all = run.all();
    assert!(
        run.status.success(),
        "report only: the job finishes:\n{all}"
    );
    for r in 0..3 {
        assert!(all.contains(&format!("[rank {r}] done")), "{all}");
    }
    let diagnosis = run.diagnosis();
    let hangs = diagnosis.iter().filter(|l| l.starts_with("hang:")).count();
    assert_eq!(hangs, 1, "one diagnosis per hang:\n{all}");
    let headline = diagnosis.get(1).copied().unwrap_or_default();
    let op = op_in(headline);
    assert!(
        headline.starts_with(&format!(
            "ranks 0, 1 wait in op #{op} all_reduce(sum, 1024 x f32) for rank 2; rank 2 last \
             finished op #{} and has issued nothing since",
            op - 1
        )),
        "{all}"
    );
    let took = run.entering_to_diagnosis();
    eprintln!("{all}\n(diagnosis {took:?} after rank 0 entered the op)");
    assert!(
        took >= SECS && took <= SECS + LATE,
        "diagnosis {took:?} after the hang began:\n{all}"
    );
    // The flight directory ringrun made is kept (a diagnosis was printed) and named.
    let kept = kept_dir(&run);
    assert!(
        kept.join("rank-0.json").exists(),
        "{}:\n{all}",
        kept.display()
    );
    let _ = fs::remove_dir_all(kept);
}

#[test]
fn mismatched_sizes_are_named_with_both_calls() {
    if child() {
        return;
    }
    let _heavy = heavy_lock();
    let run = ringrun(
        "mismatched_sizes_are_named_with_both_calls",
        "mismatch",
        &["--hang-timeout", "30"],
        &[],
    );
    let all = run.all();
    assert!(!run.status.success(), "{all}");
    let diagnosis = run.diagnosis();
    let headline = diagnosis.get(1).copied().unwrap_or_default();
    let op = op_in(headline);
    assert_eq!(op, WARM_UP + 1, "{all}");
    // Rank 2 is named with rank 0 when it had issued op #5 before rank 1's abort reached
    // it; when the abort came first, its record shows it idle after op #4 (as the break
    // found it), and the mismatch is named between ranks 1 and 0 alone.
    let both = format!(
        "rank 1 is in op #{op} all_reduce(sum, 512 x f32) but ranks 0, 2 are in op #{op} \
         all_reduce(sum, 1024 x f32)"
    );
    let early = format!(
        "rank 1 is in op #{op} all_reduce(sum, 512 x f32) but rank 0 is in op #{op} \
         all_reduce(sum, 1024 x f32)"
    );
    assert!(headline == both || headline == early, "{all}");
    // The rank that died of it is no longer taken for a waiting one.
    assert!(!all.contains("wait for each other"), "{all}");
    // Named as the ranks fail, long before the hang timeout or the group's deadline.
    let took = run.entering_to_diagnosis();
    eprintln!("{all}\n(diagnosis {took:?} after rank 0 entered the op)");
    assert!(
        took < Duration::from_secs(20),
        "diagnosis {took:?} after the mismatch:\n{all}"
    );
    let _ = fs::remove_dir_all(kept_dir(&run));
}

#[test]
fn a_rank_that_dies_is_named_with_its_exit_status() {
    if child() {
        return;
    }
    let test = "a_rank_that_dies_is_named_with_its_exit_status";
    a_dead_rank_is_named(test, "dies", "exit code 3");
}

#[test]
fn a_rank_killed_by_a_signal_is_named_with_the_signal() {
    if child() {
        return;
    }
    let test = "a_rank_killed_by_a_signal_is_named_with_the_signal";
    a_dead_rank_is_named(test, "killed", "killed by signal 9 (SIGKILL)");
}

/// Runs `scenario`, in which rank 1 dies in the op after the warm-up, and checks that
/// ringrun names it seconds later as having exited (`how`), in that op.
fn a_dead_rank_is_named(test: &str, scenario: &str, how: &str) {
    let _heavy = heavy_lock();
    let run = ringrun(test, scenario, &["--hang-timeout", "30"], &[]);
    let all = run.all();
    assert!(!run.status.success(), "{all}");
    let diagnosis = run.diagnosis();
    let headline = diagnosis.get(1).copied().unwrap_or_default();
    assert!(
        headline.contains(&format!("rank 1 exited ({how})")),
        "{all}"
    );
    assert_eq!(op_in(headline), WARM_UP + 1, "{all}");
    // It left no dump (no destructor runs), only its beacon: 4 calls finished.
    assert!(
        headline.contains(&format!("it had finished {WARM_UP} calls"))
            || headline.contains(&format!("it last finished op #{WARM_UP}")),
        "{all}"
    );
    let took = run.entering_to_diagnosis();
    eprintln!("{all}\n(diagnosis {took:?} after rank 0 entered the op)");
    assert!(
        took < Duration::from_secs(20),
        "diagnosis {took:?} after the death:\n{all}"
    );
    let _ = fs::remove_dir_all(kept_dir(&run));
}

/// The flight directory ringrun made and kept, named on its last lines.
fn kept_dir(run: &Run) -> PathBuf {
    run.lines
        .iter()
        .find_map(|l| l.text.strip_prefix("ringrun: flight records kept in "))
        .and_then(|rest| rest.split(" (").next())
        .map(PathBuf::from)
        .unwrap_or_default()
}

#[test]
fn long_compute_between_collectives_is_no_hang() {
    if child() {
        return;
    }
    let _heavy = heavy_lock();
    let run = ringrun(
        "long_compute_between_collectives_is_no_hang",
        "slow",
        &["--hang-timeout", "1.5", "--hang-action", "stop"],
        &[],
    );
    let all = run.all();
    assert!(run.status.success(), "{all}");
    assert!(run.diagnosis().is_empty(), "a false alarm:\n{all}");
    // 4 x 3 s of compute: the watch ran through all of it.
    assert!(run.started.elapsed() >= Duration::from_secs(12), "{all}");
    // Nothing to keep: the directory ringrun made is gone.
    assert!(!all.contains("flight records kept"), "{all}");
    let made = all
        .lines()
        .find_map(|l| {
            l.strip_prefix("ringrun: watching for hangs; the ranks' flight records go to ")
        })
        .and_then(|rest| rest.split(" (").next())
        .unwrap_or_else(|| panic!("no directory named:\n{all}"));
    assert!(!Path::new(made).exists(), "{made} left behind");
}

#[test]
fn diagnose_exits_non_zero_without_a_cause_and_on_an_unreadable_directory() {
    let empty = Scratch::new("empty");
    fs::create_dir_all(&empty.0).unwrap();
    fs::write(empty.0.join("rank-0.json"), "{ broken").unwrap();
    let out = Command::new(RINGRUN)
        .arg("diagnose")
        .arg(&empty.0)
        .output()
        .expect("ringrun diagnose");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("no flight dump or beacon was found"),
        "{stdout}"
    );
    assert!(stdout.contains("rank-0.json is not JSON"), "{stdout}");
    assert!(stderr.contains("show no cause"), "{stderr}");
    let missing = Command::new(RINGRUN)
        .args(["diagnose", "/nonexistent/flight/dir"])
        .output()
        .expect("ringrun diagnose");
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("cannot read /nonexistent/flight/dir")
    );
}

/// Ranks 0 and 1 time out waiting for rank 2 (late past their deadline) and exit; the
/// diagnosis ringrun prints as the first of them fails names rank 2, every time, from the
/// dumps the exited ranks left (no fresh dump is waited for from a rank that has exited),
/// as `ringrun diagnose DIR` does afterwards.
#[test]
fn the_rank_everyone_waited_for_is_named_after_the_others_time_out() {
    if child() {
        return;
    }
    /// 10 runs, [`AT_ONCE`] jobs at a time (their ranks mostly wait): about 20 s on a
    /// quiet 2-core machine.
    const RUNS: usize = 10;
    const AT_ONCE: usize = 5;
    let test = "the_rank_everyone_waited_for_is_named_after_the_others_time_out";
    let _heavy = heavy_lock();
    let started = Instant::now();
    let culprit =
        format!("for rank 2; rank 2 last finished op #{WARM_UP} and has issued nothing since");
    let check = |run: usize, ringrun_run: Run| {
        let all = ringrun_run.all();
        assert!(!ringrun_run.status.success(), "{all}");
        let diagnosis = ringrun_run.diagnosis();
        assert!(
            diagnosis
                .first()
                .is_some_and(|l| l.contains("failed; what the flight records show")),
            "run {run}:\n{all}"
        );
        // The first finding names rank 2: as the rank the others wait for or, when a
        // survivor's failure comes first, as the likely cause its error names.
        let headline = diagnosis.get(1).copied().unwrap_or_default();
        assert!(
            headline.contains(&culprit) || headline.contains("rank 2 is the likely cause"),
            "run {run}:\n{all}"
        );
        assert_eq!(op_in(headline), WARM_UP + 1, "run {run}:\n{all}");
        // The ranks that gave up are never taken for the cause.
        for line in &diagnosis {
            for survivor in [0, 1] {
                assert!(
                    !line.contains(&format!("for rank {survivor}; rank {survivor} last"))
                        && !line.contains(&format!("rank {survivor} is the likely cause")),
                    "run {run}:\n{all}"
                );
            }
        }
        assert!(!all.contains("no fresh dump"), "run {run}:\n{all}");
        // The same, offline, on the files the ranks left.
        let kept = kept_dir(&ringrun_run);
        let offline = Command::new(RINGRUN)
            .arg("diagnose")
            .arg(&kept)
            .output()
            .expect("ringrun diagnose");
        let text = String::from_utf8_lossy(&offline.stdout);
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.contains(&culprit) || l.contains("rank 2 is the likely cause")),
            "run {run}: offline:\n{text}\nlive:\n{all}"
        );
        let _ = fs::remove_dir_all(kept);
        eprintln!("run {run}: {headline}");
    };
    for batch in 0..RUNS.div_ceil(AT_ONCE) {
        let runs = (batch * AT_ONCE)..((batch + 1) * AT_ONCE).min(RUNS);
        let finished: Vec<(usize, Run)> = std::thread::scope(|scope| {
            let jobs: Vec<_> = runs
                .map(|run| {
                    let job = scope.spawn(|| ringrun(test, "late", &["--hang-timeout", "30"], &[]));
                    (run, job)
                })
                .collect();
            jobs.into_iter()
                .map(|(run, job)| (run, job.join().expect("a run's harness panicked")))
                .collect()
        });
        for (run, ringrun_run) in finished {
            check(run, ringrun_run);
        }
    }
    eprintln!("{RUNS} runs in {:?}", started.elapsed());
}
