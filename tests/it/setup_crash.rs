//! A rank that dies in the middle of shared-memory set-up: the survivors fail within
//! moments, naming it and the step, although their start-up deadline is two minutes away.
//!
//! The ranks are real processes (this test binary again, told apart by an environment
//! variable), on loopback, with the host's `/dev/shm`. The test reads the rendezvous
//! store itself to catch the victim inside set-up: it waits for the victim's first
//! set-up key (`ringccl/host/<victim>`), stops the ranks that could finish set-up
//! (SIGSTOP), checks in the store that set-up cannot have finished (a rank's last key,
//! `ringccl/shm/mapped/<rank>`, is missing), then SIGKILLs the victim and lets the others
//! go on. Nothing in the library knows about the test.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ringccl::core::store::StoreClient;
use ringccl::{init_process_group, ReduceOp};

const ROLE_VAR: &str = "RINGCCL_SETUP_CRASH_RANK";
const PORT: &str = "PORT ";
const RESULT: &str = "RESULT ";
/// Exit status of a rank whose start-up failed cleanly (it printed why).
const INIT_FAILED: i32 = 3;
/// Exit status of a rank whose start-up succeeded but whose collective failed.
const OP_FAILED: i32 = 4;
/// The ranks' start-up deadline: far beyond what the survivors may take.
const START_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// What the survivors may take, from the victim's death, to fail.
const PROMPT: Duration = Duration::from_secs(10);
const N: usize = 3;

/// One rank: joins the group and runs one small all-reduce. A start-up error is printed
/// and ends the process with `INIT_FAILED`; a failed collective with `OP_FAILED`.
fn be_a_rank() {
    ringccl::logging::init_from_env();
    let opts = common::child_options(PORT);
    let pg = match init_process_group("gloo", opts.timeout(START_UP_TIMEOUT)) {
        Ok(pg) => pg,
        Err(e) => {
            println!("{RESULT}init-error {e}");
            std::process::exit(INIT_FAILED);
        }
    };
    let mut x = [1.0f32; 16];
    if let Err(e) = pg.all_reduce(&mut x, ReduceOp::Sum) {
        println!("{RESULT}op-error {e}");
        std::process::exit(OP_FAILED);
    }
    println!("{RESULT}started");
}

fn after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    text.find(marker).map(|at| &text[at + marker.len()..])
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child this test started and has not yet reaped, so
    // the pid cannot belong to another process.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

/// The ranks of one job, running.
struct Job {
    name: &'static str,
    children: Vec<Child>,
    lines: mpsc::Receiver<(usize, String, Instant)>,
    stdout: Vec<Vec<(String, Instant)>>,
    stderr: Vec<Option<JoinHandle<String>>>,
    port: u16,
}

/// How a rank ended, and when the test saw it end.
#[derive(Debug)]
struct RankEnd {
    code: Option<i32>,
    /// When the test saw the process end.
    at: Instant,
    /// The rank's `RESULT` line, and when the test read it.
    result: Option<(String, Instant)>,
    stderr: String,
}

impl Job {
    /// Starts `N` ranks of test `name` (rank 0 first, to learn the store's port).
    fn start(name: &'static str, transport: &str) -> Job {
        let (tx, lines) = mpsc::channel();
        let mut job = Job {
            name,
            children: Vec::new(),
            lines,
            stdout: vec![Vec::new(); N],
            stderr: Vec::new(),
            port: 0,
        };
        job.spawn(0, transport, &tx);
        job.port = job
            .wait_line(0, PORT, Duration::from_secs(60))
            .parse()
            .expect("port");
        for rank in 1..N {
            job.spawn(rank, transport, &tx);
        }
        job
    }

    fn spawn(&mut self, rank: usize, transport: &str, tx: &mpsc::Sender<(usize, String, Instant)>) {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                &common::test_path(self.name),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_VAR, "1")
            .env("RINGCCL_TRANSPORT", transport)
            .env("RINGCCL_DEBUG", "warn")
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", N.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", self.port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a rank");
        let stdout = child.stdout.take().expect("piped stdout");
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((rank, line, Instant::now())).is_err() {
                    return;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        self.stderr.push(Some(thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        })));
        self.children.push(child);
    }

    /// Waits for a line of `rank` containing `marker`; returns what follows it.
    fn wait_line(&mut self, rank: usize, marker: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(found) = self.stdout[rank].iter().find_map(|(l, _)| after(l, marker)) {
                return found.trim().to_string();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((r, line, at)) => self.stdout[r].push((line, at)),
                Err(_) => {
                    self.kill_all();
                    panic!("rank {rank} printed no {marker:?} within {limit:?}");
                }
            }
        }
    }

    fn pid(&self, rank: usize) -> u32 {
        self.children[rank].id()
    }

    fn store(&self) -> StoreClient {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().expect("addr");
        StoreClient::connect(&[addr], 0, Duration::from_secs(30)).expect("reach rank 0's store")
    }

    fn kill_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for every rank to end, at most `limit` in all, noting when each ended.
    fn finish(mut self, limit: Duration) -> Vec<RankEnd> {
        let deadline = Instant::now() + limit;
        let mut ends: Vec<Option<(Option<i32>, Instant)>> = vec![None; N];
        while ends.iter().any(Option::is_none) {
            for (rank, end) in ends.iter_mut().enumerate() {
                if end.is_none() {
                    if let Some(status) = self.children[rank].try_wait().expect("wait") {
                        *end = Some((status.code(), Instant::now()));
                    }
                }
            }
            if Instant::now() > deadline {
                self.kill_all();
                panic!("the ranks did not end within {limit:?}: {ends:?}");
            }
            thread::sleep(Duration::from_millis(5));
        }
        while let Ok((r, line, at)) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.stdout[r].push((line, at));
        }
        ends.into_iter()
            .enumerate()
            .map(|(rank, end)| {
                let (code, at) = end.expect("ended");
                RankEnd {
                    code,
                    at,
                    result: self.stdout[rank]
                        .iter()
                        .find_map(|(l, at)| Some((after(l, RESULT)?.to_string(), *at))),
                    stderr: self.stderr[rank]
                        .take()
                        .map(|h| h.join().unwrap_or_default())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }
}

/// Runs test `name`'s job with `transport`, kills `victim` in the middle of
/// shared-memory set-up, and asserts that every survivor fails start-up within
/// [`PROMPT`] of the death (with a start-up deadline of two minutes), naming the victim
/// and the step. Tries again (at most 5 times) when set-up outran the catch.
fn kill_in_set_up(name: &'static str, transport: &str, victim: usize) {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm on this machine");
        return;
    }
    let _heavy = common::heavy_lock();
    for attempt in 1..=5 {
        let mut job = Job::start(name, transport);
        let mut store = job.store();
        // The victim's first set-up key: from now on it is inside shared-memory set-up.
        let host_key = format!("ringccl/host/{victim}");
        let watch_until = Instant::now() + Duration::from_secs(60);
        while store.get(&host_key).expect("read the store").is_none() {
            assert!(
                Instant::now() < watch_until,
                "rank {victim} never reached set-up"
            );
        }
        // Stop whoever could still finish set-up: the victim (its store lives on in rank
        // 0 unless it is rank 0) or, for rank 0, every other rank.
        let stopped: Vec<usize> = if victim == 0 {
            (1..N).collect()
        } else {
            vec![victim]
        };
        for &rank in &stopped {
            signal(job.pid(rank), libc::SIGSTOP);
        }
        // Set-up cannot have finished, nor finish now, while a stopped rank's last key is
        // missing.
        let unfinished = stopped.iter().any(|rank| {
            store
                .get(&format!("ringccl/shm/mapped/{rank}"))
                .expect("read the store")
                .is_none()
        });
        drop(store);
        if !unfinished {
            eprintln!("attempt {attempt}: set-up outran the catch; again");
            for &rank in &stopped {
                signal(job.pid(rank), libc::SIGCONT);
            }
            job.kill_all();
            continue;
        }
        signal(job.pid(victim), libc::SIGKILL);
        for &rank in stopped.iter().filter(|&&r| r != victim) {
            signal(job.pid(rank), libc::SIGCONT);
        }
        let died = Instant::now();
        let ends = job.finish(START_UP_TIMEOUT + Duration::from_secs(60));
        assert_eq!(ends[victim].code, None, "the victim died of SIGKILL");
        for (rank, end) in ends.iter().enumerate().filter(|(r, _)| *r != victim) {
            let (error, reported) = match &end.result {
                Some((line, at)) => (line.as_str(), at.saturating_duration_since(died)),
                None => ("", Duration::MAX),
            };
            let took = end.at.saturating_duration_since(died);
            eprintln!(
                "{name}: rank {rank} reported {reported:?} and exited {took:?} after rank {victim} died: {error}"
            );
            if end.code != Some(INIT_FAILED) {
                eprintln!("rank {rank}'s log:\n{}", end.stderr);
            }
            assert_eq!(end.code, Some(INIT_FAILED), "rank {rank}: {end:?}");
            for needle in [
                format!("rank {rank}: rank {victim} went away during shared-memory set-up"),
                "restart every rank".to_string(),
            ] {
                assert!(
                    error.contains(&needle),
                    "rank {rank}: no {needle:?} in {error}"
                );
            }
            assert!(reported <= took, "rank {rank}: {end:?}");
            assert!(took < PROMPT, "rank {rank} took {took:?} to fail: {end:?}");
        }
        return;
    }
    panic!("{name}: never caught rank {victim} inside shared-memory set-up in 5 attempts");
}

#[test]
fn a_rank_killed_in_forced_shared_memory_set_up_is_named_by_the_others_at_once() {
    const NAME: &str =
        "a_rank_killed_in_forced_shared_memory_set_up_is_named_by_the_others_at_once";
    if std::env::var_os(ROLE_VAR).is_some() {
        return be_a_rank();
    }
    kill_in_set_up(NAME, "shm", 2);
}

#[test]
fn a_rank_killed_in_automatic_shared_memory_set_up_is_named_by_the_others_at_once() {
    const NAME: &str =
        "a_rank_killed_in_automatic_shared_memory_set_up_is_named_by_the_others_at_once";
    if std::env::var_os(ROLE_VAR).is_some() {
        return be_a_rank();
    }
    kill_in_set_up(NAME, "auto", 1);
}

/// Rank 0 hosts the store: its death fails the store too, and the others name rank 0
/// rather than the store's symptom.
#[test]
fn rank_0_killed_in_shared_memory_set_up_is_named_by_the_others_at_once() {
    const NAME: &str = "rank_0_killed_in_shared_memory_set_up_is_named_by_the_others_at_once";
    if std::env::var_os(ROLE_VAR).is_some() {
        return be_a_rank();
    }
    kill_in_set_up(NAME, "shm", 0);
}
