//! `ringrun` cleans up after itself: each rank's process group is stopped with it,
//! ringrun's own death (SIGKILL included) takes the ranks and their children down, SIGHUP
//! is forwarded, a rank that cannot start stops the ones already started, and
//! `--max-restarts` is a budget for the whole job.
//!
//! Ranks are `sh` scripts that record their own pid and their background child's pid in
//! a per-test directory (`$D`); the tests check those processes through `/proc`, polling
//! against a deadline.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");
/// Longest any ringrun run may take here before the test kills it.
const LIMIT: Duration = Duration::from_secs(120);
/// How soon processes must be gone once ringrun has stopped (or lost) them: seconds on
/// an idle machine, generous for a loaded 2-core one.
const GONE_WITHIN: Duration = Duration::from_secs(15);
/// ringrun's grace period between the forwarded signal and SIGKILL (src/bin/ringrun/stop.rs).
const GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);

/// `p NAME VALUE` writes VALUE to $D/NAME atomically (the test never reads half a pid).
const RECORD: &str = r#"p() { echo "$2" > "$D/$1.tmp" && mv "$D/$1.tmp" "$D/$1"; }; "#;

/// A fresh directory for one test's pid files, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("ringrun-cleanup-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create scratch directory");
        Self(dir)
    }

    /// Polls until `$D/name` holds a pid.
    fn pid(&self, name: &str, limit: Duration) -> u32 {
        let path = self.0.join(name);
        let deadline = Instant::now() + limit;
        loop {
            if let Some(pid) = fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return pid;
            }
            assert!(
                Instant::now() < deadline,
                "no pid in {} after {limit:?}",
                path.display()
            );
            thread::sleep(POLL);
        }
    }
}

impl Drop for Scratch {
    /// Removes the directory, after killing what is left in the process groups of the
    /// ranks it recorded (nothing, unless the test failed).
    fn drop(&mut self) {
        let groups = fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("rank."))
            .filter_map(|e| {
                fs::read_to_string(e.path())
                    .ok()?
                    .trim()
                    .parse::<u32>()
                    .ok()
            });
        for group in groups {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{group}")])
                .stderr(Stdio::null())
                .status();
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `ringrun ARGS -- sh -c SCRIPT` with `$D` set to the scratch directory.
fn ringrun_sh(dir: &Path, args: &[&str], script: &str) -> Command {
    let mut command = Command::new(RINGRUN);
    command
        .args(args)
        .args(["--", "sh", "-c", &format!("{RECORD}{script}")])
        .env("D", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits for `child` to exit, killing it after [`LIMIT`]; returns its output and how
/// long it ran after `started`.
fn finish(child: Child, started: Instant) -> (Output, Duration) {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(output) => (output.expect("ringrun output"), started.elapsed()),
        Err(_) => {
            signal(pid, "KILL");
            panic!("ringrun did not finish within {LIMIT:?}");
        }
    }
}

fn run_to_end(mut command: Command) -> (Output, Duration) {
    let started = Instant::now();
    finish(command.spawn().expect("start ringrun"), started)
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next());
        !matches!(state, Some("Z") | Some("X") | None)
    })
}

/// Polls until none of `pids` is alive; returns how long that took, or panics naming the
/// survivors after `limit`.
fn wait_gone(pids: &[u32], limit: Duration, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            return started.elapsed();
        }
        if started.elapsed() > limit {
            for &p in &left {
                let _ = Command::new("kill")
                    .args(["-KILL", &p.to_string()])
                    .status();
            }
            panic!("{what}: processes {left:?} still alive {limit:?} later");
        }
        thread::sleep(POLL);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Ranks 0 and 1 each record their pid (`rank.R`) and a background child's (`bg.R`).
const TWO_RANKS_WITH_CHILDREN: &str = r#"sleep 300 & p bg.$RANK $!; p rank.$RANK $$; "#;

fn recorded_pids(scratch: &Scratch, ranks: usize) -> Vec<u32> {
    (0..ranks)
        .flat_map(|r| [format!("rank.{r}"), format!("bg.{r}")])
        .map(|name| scratch.pid(&name, LIMIT))
        .collect()
}

#[test]
fn a_failing_rank_takes_every_ranks_background_children_down() {
    let scratch = Scratch::new("failing");
    // Rank 1 fails once rank 0 has its child; rank 0 would run for 5 minutes.
    let script = format!(
        "{TWO_RANKS_WITH_CHILDREN} if [ $RANK = 1 ]; then while [ ! -e $D/bg.0 ]; do sleep 0.05; done; exit 3; fi; sleep 300"
    );
    let (out, elapsed) = run_to_end(ringrun_sh(&scratch.0, &["--nproc-per-node", "2"], &script));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rank 1 failed (exit code 3)"), "{stderr}");
    let pids = recorded_pids(&scratch, 2);
    // ringrun confirms every group empty before it exits: nothing may be left even now.
    let took = wait_gone(&pids, Duration::from_secs(1), "after ringrun exited");
    assert!(elapsed < GRACE + GONE_WITHIN, "ringrun took {elapsed:?}");
    eprintln!("failing rank: ringrun exited after {elapsed:?}; {pids:?} gone {took:?} later");
}

#[test]
fn sigterm_to_ringrun_takes_the_ranks_background_children_down() {
    let scratch = Scratch::new("sigterm");
    let started = Instant::now();
    let child = ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "2"],
        &format!("{TWO_RANKS_WITH_CHILDREN} sleep 300"),
    )
    .spawn()
    .expect("start ringrun");
    let pids = recorded_pids(&scratch, 2);
    let sent = Instant::now();
    signal(child.id(), "TERM");
    let (out, _) = finish(child, started);
    let stopped = sent.elapsed();
    assert_eq!(out.status.code(), Some(128 + 15), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("got SIGTERM"),
        "{}",
        text(&out.stderr)
    );
    wait_gone(&pids, Duration::from_secs(1), "after ringrun exited");
    // sleep dies of SIGTERM: no need to wait for the grace period.
    assert!(stopped < GONE_WITHIN, "stopping took {stopped:?}");
    eprintln!(
        "SIGTERM: ranks and children {pids:?} gone, ringrun exited {stopped:?} after the signal"
    );
}

#[test]
fn a_background_child_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let scratch = Scratch::new("stubborn");
    // The rank succeeds at once, leaving behind a child deaf to SIGTERM.
    let script = r#"(trap '' TERM; exec sleep 300) & p bg.$RANK $!; sleep 0.2; exit 0"#;
    let (out, elapsed) = run_to_end(ringrun_sh(&scratch.0, &["--nproc-per-node", "1"], script));
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("rank 0 exited but left processes running"),
        "{stderr}"
    );
    assert!(stderr.contains("sending SIGKILL to rank(s) 0"), "{stderr}");
    let bg = scratch.pid("bg.0", LIMIT);
    wait_gone(&[bg], Duration::from_secs(1), "after ringrun exited");
    assert!(
        elapsed >= GRACE && elapsed < GRACE + GONE_WITHIN,
        "expected the {GRACE:?} grace then SIGKILL, took {elapsed:?}"
    );
    eprintln!("stubborn child: killed, ringrun exited after {elapsed:?}");
}

#[test]
fn sigkill_to_ringrun_takes_the_ranks_and_their_children_down() {
    let scratch = Scratch::new("sigkill");
    let started = Instant::now();
    let child = ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "2"],
        &format!("{TWO_RANKS_WITH_CHILDREN} sleep 300"),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start ringrun");
    let pids = recorded_pids(&scratch, 2);
    signal(child.id(), "KILL");
    let (out, _) = finish(child, started);
    assert_eq!(
        out.status.code(),
        None,
        "ringrun should have died of SIGKILL"
    );
    let took = wait_gone(&pids, GONE_WITHIN, "after SIGKILL to ringrun");
    eprintln!("SIGKILL: ranks and children {pids:?} gone {took:?} after ringrun died");
}

/// The parent-death signal on its own (the watchdog killed first): the ranks still die
/// with ringrun, even though their background children then survive.
#[test]
fn ranks_die_with_ringrun_even_without_the_watchdog() {
    let scratch = Scratch::new("pdeathsig");
    let started = Instant::now();
    let child = ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "2"],
        &format!("{TWO_RANKS_WITH_CHILDREN} sleep 300"),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start ringrun");
    let pids = recorded_pids(&scratch, 2);
    let watchdog = children_of(child.id())
        .into_iter()
        .find(|&pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| text(&c).contains("--internal-watchdog"))
        })
        .expect("ringrun's watchdog process");
    signal(watchdog, "KILL");
    wait_gone(&[watchdog], GONE_WITHIN, "the watchdog");
    signal(child.id(), "KILL");
    let _ = finish(child, started);
    let ranks = [pids[0], pids[2]];
    let took = wait_gone(
        &ranks,
        GONE_WITHIN,
        "ranks after SIGKILL to ringrun (PDEATHSIG)",
    );
    // Without the watchdog nobody stops what the ranks started: `scratch` kills their
    // groups when dropped.
    eprintln!("PDEATHSIG alone: ranks {ranks:?} gone {took:?} after ringrun died");
}

/// Processes whose parent is `parent`, from `/proc/*/stat`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rfind(')').and_then(|at| {
                    stat[at + 1..]
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                }) == Some(parent)
            })
        })
        .collect()
}

#[test]
fn sighup_is_forwarded_to_every_rank() {
    let scratch = Scratch::new("sighup");
    let started = Instant::now();
    let mut command = ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "2"],
        "trap 'echo got-hup; exit 0' HUP; echo ready; sleep 300 & wait",
    );
    // Under `nohup` (a CI runner may start the tests that way) SIGHUP is ignored, and
    // ringrun rightly keeps it ignored; this test is about a ringrun that receives it.
    // SAFETY: between fork and exec only async-signal-safe calls are allowed, and
    // signal(2) is one; the child has a single thread here.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = command
        .stderr(Stdio::null())
        .spawn()
        .expect("start ringrun");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut ready = 0;
    while ready < 2 {
        let line = rx.recv_timeout(LIMIT).expect("ranks did not start");
        ready += usize::from(line.ends_with("] ready"));
    }
    let sent = Instant::now();
    signal(child.id(), "HUP");
    let mut got = Vec::new();
    while got.len() < 2 {
        let line = rx
            .recv_timeout(GONE_WITHIN)
            .expect("ranks did not get SIGHUP");
        if line.ends_with("] got-hup") {
            got.push(line);
        }
    }
    got.sort();
    assert_eq!(got, ["[rank 0] got-hup", "[rank 1] got-hup"]);
    let (out, _) = finish(child, started);
    assert_eq!(out.status.code(), Some(128 + 1));
    let took = sent.elapsed();
    assert!(took < GONE_WITHIN, "ringrun exited {took:?} after SIGHUP");
    eprintln!("SIGHUP: both ranks trapped it, ringrun exited {took:?} after the signal");
}

/// Ranks that trap SIGTERM and go on would get the whole grace period; a second signal
/// to ringrun cuts it short with SIGKILL (the second Ctrl-C of an impatient user).
#[test]
fn a_second_signal_kills_the_ranks_at_once() {
    let scratch = Scratch::new("second");
    let started = Instant::now();
    let mut child = ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "2"],
        "p rank.$RANK $$; trap 'echo got-term' TERM; echo ready; while :; do sleep 0.1; done",
    )
    .spawn()
    .expect("start ringrun");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut ready = 0;
    while ready < 2 {
        let line = rx.recv_timeout(LIMIT).expect("ranks did not start");
        ready += usize::from(line.ends_with("] ready"));
    }
    let first = Instant::now();
    signal(child.id(), "TERM");
    let mut got = 0;
    while got < 2 {
        let line = rx
            .recv_timeout(GONE_WITHIN)
            .expect("ranks did not get SIGTERM");
        got += usize::from(line.ends_with("] got-term"));
    }
    signal(child.id(), "TERM");
    let (out, _) = finish(child, started);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 15), "{stderr}");
    assert!(
        stderr.contains("got SIGTERM: sending SIGKILL to rank(s) 0 (process group"),
        "{stderr}"
    );
    let pids = [scratch.pid("rank.0", LIMIT), scratch.pid("rank.1", LIMIT)];
    wait_gone(&pids, Duration::from_secs(1), "after ringrun exited");
    let took = first.elapsed();
    assert!(took < GONE_WITHIN, "took {took:?}");
    eprintln!("second signal: ranks killed, ringrun exited {took:?} after the first signal");
}

/// Started with SIGHUP ignored (as `nohup` does), ringrun and its ranks keep ignoring it.
#[test]
fn an_ignored_sighup_stays_ignored_as_under_nohup() {
    let scratch = Scratch::new("nohup");
    let started = Instant::now();
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            "trap '' HUP && exec \"$0\" \"$@\"",
            RINGRUN,
            "--nproc-per-node",
            "2",
            "--",
            "sh",
            "-c",
            &format!("{RECORD}p rank.$RANK $$; while [ ! -e $D/hup-sent ]; do sleep 0.05; done; sleep 0.5; echo survived"),
        ])
        .env("D", &scratch.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("start ringrun under trap '' HUP");
    scratch.pid("rank.0", LIMIT);
    scratch.pid("rank.1", LIMIT);
    signal(child.id(), "HUP");
    fs::write(scratch.0.join("hup-sent"), "").expect("write marker");
    let (out, elapsed) = finish(child, started);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for r in 0..2 {
        assert!(stdout.contains(&format!("[rank {r}] survived")), "{stdout}");
    }
    assert!(elapsed < GONE_WITHIN, "took {elapsed:?}");
}

#[test]
fn a_missing_program_is_named_and_nothing_runs() {
    let (out, elapsed) = run_to_end({
        let mut c = Command::new(RINGRUN);
        c.args([
            "--nproc-per-node",
            "2",
            "--",
            "/nonexistent/ringrun-test-program",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c
    });
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "rank 0 could not be started (\"/nonexistent/ringrun-test-program\": No such file"
        ),
        "{stderr}"
    );
    assert!(elapsed < GONE_WITHIN, "took {elapsed:?}");
}

/// A rank that cannot start, provoked honestly: ringrun runs under a low open-file limit,
/// so the pipes for a later rank's output cannot be created (EMFILE). The limit is found
/// by trying a few (each further rank needs two more descriptors), up to the one at which
/// the third rank fails with two ranks to stop.
#[test]
fn a_rank_that_fails_to_start_stops_the_ranks_already_started() {
    let scratch = Scratch::new("startfail");
    for limit in 4..=64 {
        let started = Instant::now();
        let mut command = Command::new("sh");
        command
            .args([
                "-c",
                &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
                RINGRUN,
                "--nproc-per-node",
                "3",
                "--",
                "sh",
                "-c",
                &format!("{RECORD}sleep 300 & p bg.$RANK $!; sleep 300"),
            ])
            .env("D", &scratch.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = command.spawn().expect("start sh");
        let pid = child.id();
        // With this limit every rank may have started: then stop the job and fail below.
        let (finished, finished_rx) = mpsc::channel::<()>();
        let stopper = thread::spawn(move || {
            if finished_rx.recv_timeout(Duration::from_secs(20)).is_err() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
        });
        let (out, elapsed) = finish(child, started);
        let _ = finished.send(());
        let _ = stopper.join();
        let stderr = text(&out.stderr);
        match rank_that_could_not_start(&stderr) {
            // Too few descriptors for ringrun's own watchdog pipe: try more.
            None if stderr.contains("could not start the watchdog") => continue,
            None => panic!("ulimit -n {limit}: no rank failed to start: {stderr}"),
            Some(0) => continue,
            Some(rank) => {
                assert_eq!(out.status.code(), Some(1), "{stderr}");
                assert!(stderr.contains("Too many open files"), "{stderr}");
                let started_pids: Vec<u32> = stderr
                    .split("(pid ")
                    .skip(1)
                    .filter_map(|s| s.split(')').next()?.parse().ok())
                    .collect();
                assert_eq!(started_pids.len(), rank, "{stderr}");
                // Each started rank's group is gone, children included, once ringrun exits.
                wait_gone(
                    &started_pids,
                    Duration::from_secs(1),
                    "ranks already started",
                );
                let children: Vec<u32> = (0..rank)
                    .filter_map(|r| fs::read_to_string(scratch.0.join(format!("bg.{r}"))).ok())
                    .filter_map(|s| s.trim().parse().ok())
                    .collect();
                wait_gone(&children, Duration::from_secs(1), "their children");
                assert!(elapsed < GRACE + GONE_WITHIN, "took {elapsed:?}");
                eprintln!(
                    "ulimit -n {limit}: rank {rank} could not start; ranks {started_pids:?} \
                     stopped, ringrun exited after {elapsed:?}"
                );
                // Go on until the third rank is the one that fails, with two to stop.
                if rank >= 2 {
                    return;
                }
            }
        }
    }
    panic!("no open-file limit up to 64 made ringrun fail on its third rank");
}

/// R in ringrun's "rank R could not be started (...)".
fn rank_that_could_not_start(stderr: &str) -> Option<usize> {
    let (before, _) = stderr.split_once(" could not be started")?;
    before.rsplit_once("ringrun: rank ")?.1.parse().ok()
}

#[test]
fn max_restarts_is_a_budget_for_the_whole_job() {
    let scratch = Scratch::new("budget");
    // Rank 0 fails the first run, rank 1 the second: each rank fails only once, but the
    // job needs two restarts.
    let script = r#"case "$RANK:$TORCHELASTIC_RESTART_COUNT" in 0:0|1:1) exit 1;; esac; echo done $TORCHELASTIC_RESTART_COUNT"#;
    let (out, _) = run_to_end(ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "2", "--max-restarts", "1"],
        script,
    ));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for want in [
        "rank 0 failed (exit code 1)",
        "restarting the job (restart 1 of 1)",
        "rank 1 failed (exit code 1)",
        "giving up after 1 restart (the budget",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in {stderr}");
    }

    let (out, elapsed) = run_to_end(ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "2", "--max-restarts", "2"],
        script,
    ));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for r in 0..2 {
        assert!(stdout.contains(&format!("[rank {r}] done 2")), "{stdout}");
    }
    assert!(elapsed < GONE_WITHIN, "took {elapsed:?}");
}

#[test]
fn a_restart_begins_after_every_process_of_the_previous_run_is_gone() {
    let scratch = Scratch::new("restart");
    // Run 0: the rank leaves a child and fails. Run 1: it reports that child's state.
    let script = r#"if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then sleep 300 & p bg $!; exit 1; fi; s=$(cut -d' ' -f3 /proc/$(cat $D/bg)/stat 2>/dev/null); echo "old-child-state=[$s]""#;
    let (out, elapsed) = run_to_end(ringrun_sh(
        &scratch.0,
        &["--nproc-per-node", "1", "--max-restarts", "1"],
        script,
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("[rank 0] old-child-state=[]")
            || stdout.contains("[rank 0] old-child-state=[Z]"),
        "run 0's child was still alive when run 1 started: {stdout}"
    );
    assert!(elapsed < GRACE + GONE_WITHIN, "took {elapsed:?}");
}
