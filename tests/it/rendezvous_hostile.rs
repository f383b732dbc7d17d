//! Start-up among strangers and at the limits:
//! - silent connections to the store and to the ranks' data listeners cost the ranks
//!   nothing, and leave no file descriptor behind once refused or gone quiet;
//! - a rank out of file descriptors says `RLIMIT_NOFILE`, within the deadline, and so do
//!   the ranks it leaves waiting;
//! - a rank started twice fails both claimants (and the others) within moments, naming
//!   both processes;
//! - a process left over from an earlier attempt of a restarted job cannot join the next.

use crate::common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads_on};
use ringccl::core::store::StoreClient;
use ringccl::{init_process_group, Error, InitOptions, ReduceOp, StoreListener, TransportKind};

const TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of the ranks in the tests where some rank must fail: short enough to wait
/// out, long enough that "failed within moments" is clearly not the deadline.
const FAILING_TIMEOUT: Duration = Duration::from_secs(20);
/// The store and the data listeners drop a connection silent for 10 s.
const HELLO_LIMIT: Duration = Duration::from_secs(10);
/// Slack for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(10);

const CHILD_VAR: &str = "RINGCCL_HOSTILE_CHILD";
const SPARE_FDS_VAR: &str = "RINGCCL_HOSTILE_SPARE_FDS";
const PORT_MARK: &str = "HOSTILE_PORT ";
const RESULT_MARK: &str = "HOSTILE_RESULT ";

fn options(rank: usize, n: usize, addr: &str, timeout: Duration) -> InitOptions {
    InitOptions::new(rank, n, addr)
        .timeout(timeout)
        .transport(TransportKind::Tcp)
}

/// Open descriptors of this process (the directory's own excluded).
fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count().saturating_sub(1))
}

/// Polls `open_fds()` until it is at most `limit` or `within` passes; returns the last count.
fn fds_settle_to(limit: usize, within: Duration) -> usize {
    let end = Instant::now() + within;
    loop {
        let now = open_fds();
        if now <= limit || Instant::now() >= end {
            return now;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------
// Ranks as child processes (this test binary re-executed), each printing its outcome.

/// In a child started by [`Children::spawn`] for `test`, runs its rank and prints the
/// outcome; returns whether this process was such a child.
fn run_as_child(test: &str) -> bool {
    if std::env::var(CHILD_VAR).ok().as_deref() != Some(test) {
        return false;
    }
    let var = |name: &str| std::env::var(name).ok();
    let number = |name: &str| -> usize {
        var(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} must be set"))
    };
    let (rank, world) = (number("RANK"), number("WORLD_SIZE"));
    let timeout = Duration::from_secs(number("RINGCCL_TEST_TIMEOUT") as u64);
    let opts = match var("MASTER_PORT") {
        Some(port) => options(rank, world, &format!("127.0.0.1:{port}"), timeout),
        None => {
            let listener = StoreListener::bind("127.0.0.1:0").expect("bind the store");
            let addr = listener.local_addr().expect("store address");
            println!("{PORT_MARK}{}", addr.port());
            options(rank, world, &addr.to_string(), timeout).store_listener(listener)
        }
    };
    if let Some(spare) = var(SPARE_FDS_VAR).and_then(|v| v.parse::<usize>().ok()) {
        if let Err(why) = limit_descriptors(spare) {
            println!("{RESULT_MARK}skipped {why}");
            return true;
        }
    }
    match init_process_group("gloo", opts).and_then(|pg| pg.barrier()) {
        Ok(()) => println!("{RESULT_MARK}ok"),
        Err(e) => println!("{RESULT_MARK}err {e}"),
    }
    true
}

/// Lowers this process's soft RLIMIT_NOFILE to what it has open plus `spare`.
fn limit_descriptors(spare: usize) -> Result<(), String> {
    let limit = open_fds() + spare;
    let status = Command::new("prlimit")
        .args([
            "--pid",
            &std::process::id().to_string(),
            &format!("--nofile={limit}:"),
        ])
        .status()
        .map_err(|e| format!("no prlimit tool ({e})"))?;
    if !status.success() {
        return Err(format!("prlimit failed: {status}"));
    }
    Ok(())
}

/// A line a child printed, with when it arrived.
struct Line {
    child: usize,
    at: Instant,
    text: String,
}

/// Child ranks of one test; killed when dropped, so a failing test leaves none behind.
struct Children {
    test: &'static str,
    children: Vec<Child>,
    lines: Receiver<Line>,
    sender: Sender<Line>,
}

impl Children {
    fn new(test: &'static str) -> Children {
        let (sender, lines) = mpsc::channel();
        Children {
            test,
            children: Vec::new(),
            lines,
            sender,
        }
    }

    /// Starts rank `rank` of `world`; `port` is the store's (none: the child hosts it).
    /// Returns the child's index.
    fn spawn(
        &mut self,
        rank: usize,
        world: usize,
        port: Option<u16>,
        env: &[(&str, String)],
    ) -> usize {
        let exe = std::env::current_exe().expect("test binary");
        let mut command = Command::new(exe);
        command
            .args([
                "--exact",
                &common::test_path(self.test),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_VAR, self.test)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env(
                "RINGCCL_TEST_TIMEOUT",
                FAILING_TIMEOUT.as_secs().to_string(),
            )
            .env_remove("MASTER_PORT")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(port) = port {
            command.env("MASTER_PORT", port.to_string());
        }
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("spawn a child rank");
        let index = self.children.len();
        let stdout = child.stdout.take().expect("piped stdout");
        let sender = self.sender.clone();
        thread::spawn(move || {
            for text in BufReader::new(stdout).lines().map_while(Result::ok) {
                let line = Line {
                    child: index,
                    at: Instant::now(),
                    text,
                };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        self.children.push(child);
        index
    }

    /// The next line carrying `mark` from any child (the text after the mark).
    fn next(&self, mark: &str, within: Duration) -> (usize, Instant, String) {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {mark:?} line from the children within {within:?}"));
            // libtest may print "test NAME ... " on the same line first.
            if let Some(at) = line.text.find(mark) {
                return (
                    line.child,
                    line.at,
                    line.text[at + mark.len()..].to_string(),
                );
            }
        }
    }

    /// The outcome line of each of `count` children, by child index.
    fn results(&self, count: usize, within: Duration) -> Vec<Option<(Instant, String)>> {
        let mut results = vec![None; self.children.len()];
        for _ in 0..count {
            let (child, at, text) = self.next(RESULT_MARK, within);
            results[child] = Some((at, text));
        }
        results
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Ranks of a group as threads of this process, each started on its own; `join` returns
/// how each init ended and when.
fn start_thread(
    rank: usize,
    world: usize,
    addr: String,
    timeout: Duration,
) -> thread::JoinHandle<(Instant, Result<(), String>)> {
    thread::spawn(move || {
        let outcome = init_process_group("gloo", options(rank, world, &addr, timeout))
            .and_then(|pg| pg.barrier())
            .map_err(|e| e.to_string());
        (Instant::now(), outcome)
    })
}

// ---------------------------------------------------------------------------------------
// Silent strangers.

/// One start-up of 3 ranks (threads): ranks 0 and 1 first; once both have published their
/// data listeners' addresses, `strangers` silent connections to the store and to each of
/// those listeners; then rank 2. Returns the time from rank 2's start until every rank's
/// init has returned.
fn staged_start(strangers: usize) -> Duration {
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let store_addr = listener.local_addr().unwrap();
    let addr = store_addr.to_string();
    let mut listener = Some(listener);
    thread::scope(|s| {
        let start = |rank: usize, listener: Option<StoreListener>| {
            let mut opts = options(rank, 3, &addr, TIMEOUT);
            if let Some(listener) = listener {
                opts = opts.store_listener(listener);
            }
            s.spawn(move || {
                let pg = init_process_group("gloo", opts)
                    .unwrap_or_else(|e| panic!("rank {rank}: init failed: {e}"));
                let done = Instant::now();
                let mut x = [rank as i32 + 1];
                pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                (done, x[0])
            })
        };
        let first = [start(0, listener.take()), start(1, None)];
        // Read the data listeners' addresses where the ranks publish them.
        let mut client = StoreClient::connect(&[store_addr], 0, TIMEOUT).unwrap();
        let mut silent = Vec::new();
        for rank in 0..2 {
            let raw = client
                .wait(
                    &format!("ringccl/addr/{rank}"),
                    Instant::now() + TIMEOUT,
                    &|| format!("rank {rank}'s address"),
                )
                .unwrap();
            let data: SocketAddr = String::from_utf8(raw).unwrap().parse().unwrap();
            for _ in 0..strangers {
                silent.push(TcpStream::connect(data).unwrap());
            }
        }
        for _ in 0..strangers {
            silent.push(TcpStream::connect(store_addr).unwrap());
        }
        let started = Instant::now();
        let last = start(2, None);
        let ends: Vec<_> = first
            .into_iter()
            .chain([last])
            .map(|rank| rank.join().unwrap())
            .collect();
        assert!(ends.iter().all(|&(_, sum)| sum == 6), "{ends:?}");
        drop(silent);
        ends.iter()
            .map(|&(done, _)| done.saturating_duration_since(started))
            .max()
            .unwrap_or_default()
    })
}

#[test]
fn silent_strangers_on_the_store_and_data_ports_cost_the_ranks_nothing() {
    let _guard = heavy_lock();
    let quiet = staged_start(0);
    let crowded = staged_start(20);
    eprintln!(
        "rendezvous of the last rank: {:.0} ms alone, {:.0} ms with 20 silent connections on the store and on each waiting rank's data listener",
        quiet.as_secs_f64() * 1e3,
        crowded.as_secs_f64() * 1e3
    );
    // Before: each silent connection held a data listener for 10 s, one after another.
    assert!(
        crowded < Duration::from_secs(8),
        "20 silent strangers delayed rendezvous to {crowded:?} (alone: {quiet:?})"
    );
}

#[test]
fn silent_strangers_leave_no_descriptors_behind() {
    let _guard = heavy_lock();
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let store_addr = listener.local_addr().unwrap();
    let counts = run_threads_on(listener, 2, TIMEOUT, |pg| {
        // Rank 0 (a thread of this process) hosts the store for the group's lifetime.
        let counts = (pg.rank() == 0).then(|| {
            let before = open_fds();
            let flood_started = Instant::now();
            let mut silent = Vec::new();
            for i in 0..300 {
                let stranger = TcpStream::connect(store_addr).unwrap();
                if i % 2 == 1 {
                    silent.push(stranger); // stays silent
                } // else: goes away at once
            }
            let ours = silent.len();
            // At most 16 silent connections from one address wait at once (each with the
            // registry's duplicate): the rest are cut off, their threads gone in moments.
            let flooded = fds_settle_to(before + ours + 2 * 16 + 8, SLACK);
            // Past the hello limit the store has closed its end of every silent one,
            // while the strangers still hold theirs.
            let refused = fds_settle_to(before + ours + 4, HELLO_LIMIT + SLACK);
            let refused_after = flood_started.elapsed();
            drop(silent);
            let after = fds_settle_to(before + 4, SLACK);
            // The store still serves.
            let mut client = StoreClient::connect(&[store_addr], 0, TIMEOUT).unwrap();
            assert!(client.get("ringccl/addr/0").unwrap().is_some());
            drop(client);
            (before, flooded, ours, refused, refused_after, after)
        });
        let mut x = [1u8];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x[0], 2);
        counts
    });
    let (before, flooded, ours, refused, refused_after, after) = counts[0].unwrap();
    eprintln!(
        "descriptors of rank 0's process: {before} before 300 strangers (150 gone at once, 150 silent); \
         {flooded} right after ({ours} of them the strangers' own ends); {refused} once the store dropped the silent ones \
         ({:.1} s); {after} after the strangers left",
        refused_after.as_secs_f64()
    );
    assert!(
        flooded <= before + ours + 2 * 16 + 8,
        "{flooded} open after the flood (before: {before})"
    );
    assert!(
        refused <= before + ours + 4,
        "{refused} open past the hello limit (before: {before})"
    );
    assert!(refused_after < HELLO_LIMIT + SLACK, "{refused_after:?}");
    assert!(
        after <= before + 4,
        "{after} open after the strangers left (before: {before})"
    );
}

// ---------------------------------------------------------------------------------------
// Out of file descriptors.

#[test]
fn a_rank_out_of_file_descriptors_names_rlimit_nofile() {
    const NAME: &str = "a_rank_out_of_file_descriptors_names_rlimit_nofile";
    if run_as_child(NAME) {
        return;
    }
    let _guard = heavy_lock();
    let spare = |n: usize| [(SPARE_FDS_VAR, n.to_string())];

    // Rank 0, hosting the store, with 6 descriptors to spare: it runs out while the
    // others connect (to the store or to its data listener).
    let mut ranks = Children::new(NAME);
    let started = Instant::now();
    ranks.spawn(0, 3, None, &spare(6));
    let (_, _, port) = ranks.next(PORT_MARK, SLACK * 3);
    let addr = format!("127.0.0.1:{}", port.trim());
    // The others learn why if the store accepted them before it ran out; a rank whose
    // connection it could not accept waits for its own (shorter) deadline.
    let others: Vec<_> = (1..3)
        .map(|rank| start_thread(rank, 3, addr.clone(), FAILING_TIMEOUT / 2))
        .collect();
    let (at, outcome) = ranks.results(1, FAILING_TIMEOUT + SLACK)[0]
        .clone()
        .unwrap();
    if let Some(why) = outcome.strip_prefix("skipped ") {
        eprintln!("skipped: cannot lower RLIMIT_NOFILE: {why}");
        return;
    }
    eprintln!(
        "rank 0 (6 spare descriptors), after {:?}: {outcome}",
        at - started
    );
    assert!(
        outcome.starts_with("err ") && outcome.contains("RLIMIT_NOFILE"),
        "{outcome}"
    );
    assert!(at - started < FAILING_TIMEOUT, "{:?}", at - started);
    for (rank, other) in (1..).zip(others) {
        let (at, outcome) = other.join().unwrap();
        eprintln!("rank {rank}, after {:?}: {outcome:?}", at - started);
        assert!(
            outcome.is_err(),
            "rank {rank} formed a group without rank 0"
        );
        assert!(
            at - started < FAILING_TIMEOUT / 2 + SLACK,
            "{:?}",
            at - started
        );
    }

    // Rank 1 with 6 to spare: enough for the store, its data listener and its two
    // connections to rank 0, not to accept rank 2. All three fail at once, naming it.
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let store_addr = listener.local_addr().unwrap();
    let started = Instant::now();
    let rank0 = thread::spawn(move || {
        let opts = options(0, 3, &store_addr.to_string(), FAILING_TIMEOUT).store_listener(listener);
        let outcome = init_process_group("gloo", opts)
            .and_then(|pg| pg.barrier())
            .map_err(|e| e.to_string());
        (Instant::now(), outcome)
    });
    let mut ranks = Children::new(NAME);
    ranks.spawn(1, 3, Some(store_addr.port()), &spare(6));
    let rank2 = start_thread(2, 3, store_addr.to_string(), FAILING_TIMEOUT);
    let (at, outcome) = ranks.results(1, FAILING_TIMEOUT + SLACK)[0]
        .clone()
        .unwrap();
    eprintln!(
        "rank 1 (6 spare descriptors), after {:?}: {outcome}",
        at - started
    );
    assert!(
        outcome.starts_with("err ") && outcome.contains("RLIMIT_NOFILE"),
        "{outcome}"
    );
    for (rank, other) in [(0, rank0), (2, rank2)] {
        let (at, outcome) = other.join().unwrap();
        eprintln!("rank {rank}, after {:?}: {outcome:?}", at - started);
        let text = outcome.expect_err("no group without rank 1");
        assert!(
            text.contains("RLIMIT_NOFILE") && text.contains("rank 1"),
            "rank {rank}: {text}"
        );
        assert!(
            at - started < SLACK,
            "rank {rank} learned after {:?}",
            at - started
        );
    }
}

// ---------------------------------------------------------------------------------------
// Duplicate ranks.

#[test]
fn a_rank_started_twice_fails_both_claimants_naming_it() {
    const NAME: &str = "a_rank_started_twice_fails_both_claimants_naming_it";
    if run_as_child(NAME) {
        return;
    }
    let _guard = heavy_lock();
    let mut ranks = Children::new(NAME);
    ranks.spawn(0, 3, None, &[]);
    let (_, _, port) = ranks.next(PORT_MARK, SLACK * 3);
    let port: u16 = port.trim().parse().unwrap();
    // Rank 2 is never started, so no group can form before the duplicate is noticed.
    let first = ranks.spawn(1, 3, Some(port), &[]);
    let second = ranks.spawn(1, 3, Some(port), &[]);
    let both_started = Instant::now();
    let results = ranks.results(3, FAILING_TIMEOUT + SLACK);
    let mut slowest = Duration::ZERO;
    for (child, result) in results.iter().enumerate() {
        let (at, outcome) = result.clone().unwrap();
        let rank = usize::from(child == first || child == second);
        eprintln!(
            "child {child} (rank {rank}) after {:?}: {outcome}",
            at - both_started
        );
        assert!(
            outcome.starts_with("err ") && outcome.contains("rank 1 was started twice (by "),
            "rank {rank}: {outcome}"
        );
        if rank == 1 {
            slowest = slowest.max(at - both_started);
        }
    }
    eprintln!(
        "both rank-1 processes failed within {:.0} ms of the second one's start",
        slowest.as_secs_f64() * 1e3
    );
    assert!(slowest < SLACK, "{slowest:?}");
}

/// A process started as rank 1 while the group of ranks 0 and 1 is already running is
/// refused at once, and rank 0 (whose store refused it) stops the running group, so the
/// first rank 1 fails too, naming both processes: neither can tell which is the real one.
#[test]
fn a_rank_started_again_while_the_group_runs_stops_the_group() {
    let _guard = heavy_lock();
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut listener = Some(listener);
    let (formed_tx, formed_rx) = mpsc::channel();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let mut opts = options(rank, 2, &addr, TIMEOUT);
            if let Some(listener) = listener.take() {
                opts = opts.store_listener(listener);
            }
            let formed = formed_tx.clone();
            thread::spawn(move || {
                let pg = init_process_group("gloo", opts)?;
                let _ = formed.send(());
                // Train until something stops the group (at most TIMEOUT).
                let until = Instant::now() + TIMEOUT;
                while Instant::now() < until {
                    let mut x = [1i64];
                    if let Err(e) = pg.all_reduce(&mut x, ReduceOp::Sum) {
                        return Ok::<_, Error>((Instant::now(), e.to_string()));
                    }
                    assert_eq!(x[0], 2);
                    thread::sleep(Duration::from_millis(5));
                }
                panic!("rank {rank}'s group was never stopped");
            })
        })
        .collect();
    for _ in 0..2 {
        formed_rx.recv_timeout(TIMEOUT).unwrap();
    }
    let started = Instant::now();
    let err = init_process_group("gloo", options(1, 2, &addr, TIMEOUT))
        .expect_err("a second rank 1 must be refused");
    let refused = started.elapsed();
    eprintln!("the second rank 1 after {refused:?}: {err}");
    assert!(
        matches!(err, Error::DuplicateRank { rank: 1, .. }),
        "{err:?}"
    );
    assert!(refused < SLACK, "{refused:?}");
    for (rank, handle) in ranks.into_iter().enumerate() {
        let (at, text) = handle.join().unwrap().unwrap();
        let took = at.saturating_duration_since(started);
        eprintln!("running rank {rank} stopped after {took:?}: {text}");
        assert!(
            text.contains("rank 1 was started twice (by "),
            "rank {rank}: {text}"
        );
        assert!(
            text.contains("while the group was running"),
            "rank {rank}: {text}"
        );
        assert!(took < SLACK, "rank {rank}: {took:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Restarts.

#[test]
fn a_process_of_another_attempt_cannot_join() {
    let _guard = heavy_lock();
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let rank0 = {
        let opts = options(0, 2, &addr, TIMEOUT)
            .attempt(1)
            .store_listener(listener);
        thread::spawn(move || {
            let pg = init_process_group("gloo", opts)?;
            let mut x = [1i64];
            pg.all_reduce(&mut x, ReduceOp::Sum)?;
            Ok::<_, Error>(x[0])
        })
    };
    // A rank left over from attempt 0, and one from a later attempt than the store's.
    for (attempt, words) in [(0u32, "attempt 0"), (2, "attempt 2")] {
        let started = Instant::now();
        let err = init_process_group("gloo", options(1, 2, &addr, TIMEOUT).attempt(attempt))
            .expect_err("a rank of another attempt must not join");
        let took = started.elapsed();
        eprintln!("rank 1 of attempt {attempt}, after {took:?}: {err}");
        assert!(
            matches!(err, Error::AttemptMismatch { rank: 1, ours, theirs: 1, .. } if ours == attempt),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(words) && text.contains("attempt 1"), "{text}");
        assert!(took < SLACK, "{took:?}");
    }
    // The group of attempt 1 forms as if nothing had happened.
    let pg = init_process_group("gloo", options(1, 2, &addr, TIMEOUT).attempt(1)).unwrap();
    let mut x = [1i64];
    pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!(x[0], 2);
    assert_eq!(rank0.join().unwrap().unwrap(), 2);
}
