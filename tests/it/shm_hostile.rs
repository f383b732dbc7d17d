//! Shared memory among hostile neighbours: a full `/dev/shm`, strangers on the host,
//! and a rank killed in the middle of set-up.
//!
//! Each test runs its ranks as real processes inside a private mount namespace whose
//! `/dev/shm` is a fresh tmpfs of a chosen size (`unshare -m`, then `mount -t tmpfs`),
//! so that it can fill it, plant files in it, and measure exactly what is left in it
//! afterwards. That needs root; without it the tests print why they skip.
//!
//! One test function plays three roles, told apart by an environment variable: the
//! test itself (outside), which re-runs its own binary inside the namespace as the
//! *coordinator*; the coordinator, which starts the *ranks* (this binary again), watches
//! them and asserts; and the ranks.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ringccl::{init_process_group, ReduceOp};

const ROLE_VAR: &str = "RINGCCL_SHM_HOSTILE_ROLE";
/// Ranks that print `READY` after their first collective and wait for a line on stdin.
const HOLD_VAR: &str = "RINGCCL_SHM_HOSTILE_HOLD";
/// The group deadline of the ranks, in seconds.
const TIMEOUT_VAR: &str = "RINGCCL_SHM_HOSTILE_TIMEOUT";
const RESULT: &str = "RESULT ";
const PORT: &str = "PORT ";
/// Exit status of a rank whose start-up failed cleanly (it printed why).
const INIT_FAILED: i32 = 3;
/// Elements of the all-reduce each rank runs: 4 MiB, enough to fill every ring.
const COUNT: usize = 1 << 20;
/// Bytes of one inbox for `n` ranks (one page of counters, then a page and 1 MiB per ring).
fn inbox_bytes(n: u64) -> u64 {
    4096 + n * (4096 + (1 << 20))
}

enum Role {
    Test,
    Coordinator,
    Rank,
}

fn role() -> Role {
    match std::env::var(ROLE_VAR).as_deref() {
        Ok("coordinator") => Role::Coordinator,
        Ok("rank") => Role::Rank,
        _ => Role::Test,
    }
}

// ---------------------------------------------------------------------------------------
// Outside: run the coordinator in a private /dev/shm.

/// Re-runs test `name` as the coordinator, in a private mount namespace whose
/// `/dev/shm` is a fresh tmpfs of `size` (`mount -o size=`), and asserts that it passed
/// within `limit`. Prints why and returns when this machine cannot do that.
fn run_in_private_dev_shm(name: &str, size: &str, limit: Duration) {
    let probe = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"])
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            eprintln!(
                "skipped: cannot mount a private /dev/shm here (needs root): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("skipped: cannot run unshare(1): {e}");
            return;
        }
    }
    let _guard = common::heavy_lock();
    let exe = std::env::current_exe().expect("test binary");
    let script =
        format!("mount -t tmpfs -o size={size},mode=1777 tmpfs /dev/shm && exec \"$0\" \"$@\"");
    let started = Instant::now();
    let mut coordinator = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .arg(&exe)
        .args([
            "--exact",
            &common::test_path(name),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_VAR, "coordinator")
        .spawn()
        .expect("start the coordinator");
    let status = loop {
        if let Some(status) = coordinator.try_wait().expect("wait for the coordinator") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = coordinator.kill();
            let _ = coordinator.wait();
            panic!("{name}: the coordinator did not finish within {limit:?}");
        }
        thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{name}: the coordinator failed: {status}");
    assert!(started.elapsed() < limit, "took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------
// A rank.

/// One rank: joins the group, all-reduces `COUNT` floats, checks the sum and prints
/// which transport it used. A start-up error is printed and ends the process with
/// `INIT_FAILED`; anything worse (a panic, a signal) shows in the exit status.
fn be_a_rank() {
    ringccl::logging::init_from_env();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"));
    let rank: usize = var("RANK").parse().expect("RANK");
    let world: usize = var("WORLD_SIZE").parse().expect("WORLD_SIZE");
    let timeout = Duration::from_secs(var(TIMEOUT_VAR).parse().expect("timeout"));
    let opts = common::child_options(PORT);
    let pg = match init_process_group("gloo", opts.timeout(timeout)) {
        Ok(pg) => pg,
        Err(e) => {
            println!("{RESULT}init-error {e}");
            std::process::exit(INIT_FAILED);
        }
    };
    let mut x = vec![rank as f32 + 1.0; COUNT];
    pg.all_reduce(&mut x, ReduceOp::Sum).expect("all_reduce");
    let want = (world * (world + 1) / 2) as f32;
    assert!(x.iter().all(|&v| v == want), "rank {rank}: wrong sum");
    // How this rank reaches the other one.
    let transport = pg.peer_transport((rank + 1) % world);
    println!("{RESULT}transport {transport}");
    if std::env::var_os(HOLD_VAR).is_some() {
        println!("READY");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    pg.barrier().expect("barrier");
}

// ---------------------------------------------------------------------------------------
// The coordinator's view of a job.

/// The ranks of one job, running.
struct Job {
    children: Vec<Child>,
    stdins: Vec<Option<ChildStdin>>,
    lines: mpsc::Receiver<(usize, String)>,
    stdout: Vec<Vec<String>>,
    stderr: Vec<JoinHandle<String>>,
}

/// How a rank ended.
#[derive(Debug)]
struct RankEnd {
    status: ExitStatus,
    results: Vec<String>,
    stderr: String,
}

impl RankEnd {
    fn result(&self, key: &str) -> Option<&str> {
        self.results
            .iter()
            .find_map(|r| r.strip_prefix(key)?.strip_prefix(' '))
    }
}

fn after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    text.find(marker).map(|at| &text[at + marker.len()..])
}

impl Job {
    /// Starts `n` ranks of test `name` with `env` (rank 0 first, to learn the store's
    /// port).
    fn start(name: &str, n: usize, env: &[(&str, &str)]) -> Job {
        let (tx, lines) = mpsc::channel();
        let mut job = Job {
            children: Vec::new(),
            stdins: Vec::new(),
            lines,
            stdout: vec![Vec::new(); n],
            stderr: Vec::new(),
        };
        job.spawn(name, 0, n, None, env, &tx);
        let port = job.wait_line(0, PORT, Duration::from_secs(60));
        for rank in 1..n {
            job.spawn(name, rank, n, Some(&port), env, &tx);
        }
        job
    }

    fn spawn(
        &mut self,
        name: &str,
        rank: usize,
        n: usize,
        port: Option<&str>,
        env: &[(&str, &str)],
        tx: &mpsc::Sender<(usize, String)>,
    ) {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                &common::test_path(name),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_VAR, "rank")
            .env(TIMEOUT_VAR, "20")
            .env("RINGCCL_DEBUG", "warn")
            .envs(env.iter().copied())
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.unwrap_or("0"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a rank");
        let stdout = child.stdout.take().expect("piped stdout");
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((rank, line)).is_err() {
                    return;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        self.stderr.push(thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        }));
        self.stdins.push(child.stdin.take());
        self.children.push(child);
    }

    /// Waits for a line of `rank` containing `marker`; returns what follows it.
    fn wait_line(&mut self, rank: usize, marker: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(found) = self.stdout[rank].iter().find_map(|l| after(l, marker)) {
                return found.trim().to_string();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((r, line)) => self.stdout[r].push(line),
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

    /// Lets held ranks go on.
    fn release(&mut self) {
        for stdin in &mut self.stdins {
            if let Some(mut s) = stdin.take() {
                let _ = s.write_all(b"go\n");
            }
        }
    }

    fn kill_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for every rank to end, at most `limit` in all.
    fn finish(mut self, limit: Duration) -> Vec<RankEnd> {
        self.release();
        let deadline = Instant::now() + limit;
        let mut statuses = Vec::new();
        for rank in 0..self.children.len() {
            let status = loop {
                if let Some(s) = self.children[rank].try_wait().expect("wait for a rank") {
                    break s;
                }
                if Instant::now() > deadline {
                    self.kill_all();
                    panic!("rank {rank} did not end within {limit:?}");
                }
                thread::sleep(Duration::from_millis(20));
            };
            statuses.push(status);
        }
        // The stdout readers end with the processes; collect what is left.
        while let Ok((r, line)) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.stdout[r].push(line);
        }
        let stderr = self.stderr.drain(..).map(|h| h.join().unwrap_or_default());
        statuses
            .into_iter()
            .zip(stderr)
            .zip(self.stdout)
            .map(|((status, stderr), stdout)| RankEnd {
                status,
                results: stdout
                    .iter()
                    .filter_map(|l| after(l, RESULT).map(str::to_string))
                    .collect(),
                stderr,
            })
            .collect()
    }
}

/// Asserts that no rank died of a signal other than `killed`'s SIGKILL — above all,
/// never of SIGBUS.
fn assert_no_signal(ends: &[RankEnd], killed: Option<usize>) {
    for (rank, end) in ends.iter().enumerate() {
        match end.status.signal() {
            None => {}
            Some(libc::SIGKILL) if killed == Some(rank) => {}
            Some(sig) => panic!(
                "rank {rank} died of signal {sig}{}: {end:?}",
                if sig == libc::SIGBUS { " (SIGBUS)" } else { "" }
            ),
        }
    }
}

/// Bytes in use in this namespace's `/dev/shm`, as df(1) reports them.
fn dev_shm_used() -> u64 {
    let out = Command::new("df")
        .args(["-B1", "--output=used", "/dev/shm"])
        .output()
        .expect("df");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df said {text:?}"))
}

fn dev_shm_names() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .expect("list /dev/shm")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Asserts that this namespace's `/dev/shm` holds nothing but `planted`, and no more
/// bytes than `baseline` (what the planted files use).
fn assert_dev_shm_clean(planted: &BTreeSet<String>, baseline: u64, when: &str) {
    assert_eq!(&dev_shm_names(), planted, "{when}: names left in /dev/shm");
    assert_eq!(
        dev_shm_used(),
        baseline,
        "{when}: bytes left in use in /dev/shm"
    );
}

/// Lists `/dev/shm` over and over until dropped; remembers every name not planted.
struct Watcher {
    stop: Arc<AtomicBool>,
    seen: JoinHandle<BTreeSet<String>>,
}

impl Watcher {
    fn start(planted: BTreeSet<String>) -> Watcher {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let seen = thread::spawn(move || {
            let mut seen = BTreeSet::new();
            while !flag.load(Ordering::Relaxed) {
                seen.extend(dev_shm_names().difference(&planted).cloned());
                thread::sleep(Duration::from_micros(200));
            }
            seen
        });
        Watcher { stop, seen }
    }

    fn names_seen(self) -> BTreeSet<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.seen.join().expect("watcher")
    }
}

/// The inbox segments process `pid` has mapped: `(range, path)` from its maps.
fn shm_mappings(pid: u32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .expect("read maps")
        .lines()
        .filter_map(|line| {
            let path = line
                .split_whitespace()
                .skip(5)
                .collect::<Vec<_>>()
                .join(" ");
            let range = line.split_whitespace().next()?.to_string();
            path.starts_with("/dev/shm/").then_some((range, path))
        })
        .collect()
}

/// Does `pid` hold a descriptor on an inbox in `/dev/shm` (an inbox being set up)?
fn holds_an_inbox_descriptor(pid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|target| target.starts_with("/dev/shm/"))
}

fn my_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .expect("stat /proc/self")
        .uid()
}

// ---------------------------------------------------------------------------------------
// The tests.

/// Auto with a `/dev/shm` too small for the job: the job still succeeds, over TCP, and
/// every rank logs why. (Before inboxes were reserved at set-up, this was a SIGBUS in
/// the middle of the all-reduce.)
#[test]
fn full_dev_shm_auto_falls_back_to_tcp_and_says_why() {
    const NAME: &str = "full_dev_shm_auto_falls_back_to_tcp_and_says_why";
    match role() {
        Role::Rank => be_a_rank(),
        // Room for one inbox of the two: the first rank may reserve its own, the second
        // cannot, and both must agree on TCP (and give the first one back).
        Role::Test => run_in_private_dev_shm(NAME, "3m", Duration::from_secs(180)),
        Role::Coordinator => {
            let started = Instant::now();
            let job = Job::start(NAME, 2, &[("RINGCCL_TRANSPORT", "auto")]);
            let ends = job.finish(Duration::from_secs(120));
            assert_no_signal(&ends, None);
            for (rank, end) in ends.iter().enumerate() {
                assert!(end.status.success(), "rank {rank}: {end:?}");
                assert_eq!(end.result("transport"), Some("tcp"), "rank {rank}: {end:?}");
                eprintln!("rank {rank}'s log: {}", end.stderr.trim());
                for needle in [
                    "this job runs over TCP",
                    "/dev/shm is full",
                    &format!("{} bytes", inbox_bytes(2)),
                    "free of",
                    "--shm-size=",
                ] {
                    assert!(
                        end.stderr.contains(needle),
                        "rank {rank} did not log {needle:?}: {}",
                        end.stderr
                    );
                }
            }
            assert!(started.elapsed() < Duration::from_secs(120));
            assert_dev_shm_clean(&BTreeSet::new(), 0, "after the job");
        }
    }
}

/// Forced shared memory with a `/dev/shm` too small: every rank fails start-up cleanly,
/// promptly, with an error naming `/dev/shm`, the space needed and free, and the fixes.
#[test]
fn full_dev_shm_forced_shm_is_a_clean_set_up_error() {
    const NAME: &str = "full_dev_shm_forced_shm_is_a_clean_set_up_error";
    match role() {
        Role::Rank => be_a_rank(),
        Role::Test => run_in_private_dev_shm(NAME, "1m", Duration::from_secs(180)),
        Role::Coordinator => {
            let started = Instant::now();
            let job = Job::start(NAME, 2, &[("RINGCCL_TRANSPORT", "shm")]);
            let ends = job.finish(Duration::from_secs(60));
            let elapsed = started.elapsed();
            assert_no_signal(&ends, None);
            for (rank, end) in ends.iter().enumerate() {
                assert_eq!(end.status.code(), Some(INIT_FAILED), "rank {rank}: {end:?}");
                let error = end.result("init-error").expect("the error");
                eprintln!("rank {rank}'s error: {error}");
                for needle in [
                    "/dev/shm is full",
                    &format!("{} bytes", inbox_bytes(2)),
                    "free of 1048576 bytes",
                    "--shm-size=",
                    "RINGCCL_TRANSPORT=tcp",
                ] {
                    assert!(
                        error.contains(needle),
                        "rank {rank}: no {needle:?} in {error}"
                    );
                }
            }
            // A full /dev/shm is found at once, not at the 20 s deadline.
            assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
            assert_dev_shm_clean(&BTreeSet::new(), 0, "after the failed set-up");
        }
    }
}

/// A successful job among strangers' files: names planted in `/dev/shm` (symlinks to a
/// file the job must not touch, a FIFO, a world-writable file owned by another user)
/// change nothing; no name of the job's ever appears there; its segments are unnamed,
/// mode 0600, owned by its user, and another user can neither see nor open them; once
/// the job ends, nothing of it is left, not even unnamed bytes.
#[test]
fn strangers_files_are_ignored_and_segments_are_unnamed_owner_only_and_freed() {
    const NAME: &str = "strangers_files_are_ignored_and_segments_are_unnamed_owner_only_and_freed";
    const N: usize = 3;
    match role() {
        Role::Rank => be_a_rank(),
        Role::Test => run_in_private_dev_shm(NAME, "64m", Duration::from_secs(240)),
        Role::Coordinator => {
            let started = Instant::now();
            let victim =
                std::env::temp_dir().join(format!("ringccl-victim-{}", std::process::id()));
            std::fs::write(&victim, b"precious").expect("victim file");
            let shm = Path::new("/dev/shm");
            // Names the old scheme used (ringccl-<job>-<rank>) and lookalikes.
            for i in 0..N {
                std::os::unix::fs::symlink(&victim, shm.join(format!("ringccl-{i:016x}-{i}")))
                    .expect("plant a symlink");
            }
            let fifo = shm.join("ringccl-fifo");
            assert!(Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .expect("mkfifo")
                .success());
            let open_file = shm.join("ringccl-open");
            std::fs::write(&open_file, b"").expect("plant a file");
            std::os::unix::fs::chown(&open_file, Some(65534), Some(65534)).expect("chown");
            std::fs::set_permissions(
                &open_file,
                std::os::unix::fs::PermissionsExt::from_mode(0o666),
            )
            .expect("chmod");
            let planted = dev_shm_names();
            let baseline = dev_shm_used();
            let watcher = Watcher::start(planted.clone());

            let mut job = Job::start(NAME, N, &[("RINGCCL_TRANSPORT", "shm"), (HOLD_VAR, "1")]);
            for rank in 0..N {
                job.wait_line(rank, "READY", Duration::from_secs(120));
            }
            // The job is up: look at its segments from outside.
            let mut inodes = BTreeSet::new();
            for rank in 0..N {
                let pid = job.pid(rank);
                let maps = shm_mappings(pid);
                assert_eq!(maps.len(), N, "rank {rank} maps {maps:?}");
                for (range, path) in maps {
                    assert!(
                        path.ends_with("(deleted)"),
                        "rank {rank}: {path} has a name"
                    );
                    let seen = PathBuf::from(format!("/proc/{pid}/map_files/{range}"));
                    let meta = std::fs::metadata(&seen).expect("stat a mapped segment");
                    assert_eq!(meta.mode() & 0o7777, 0o600, "{path}");
                    assert_eq!(meta.uid(), my_uid(), "{path}");
                    assert_eq!(meta.nlink(), 0, "{path}");
                    assert_eq!(meta.len(), inbox_bytes(N as u64), "{path}");
                    assert!(meta.blocks() * 512 >= meta.len(), "{path} is sparse");
                    inodes.insert(meta.ino());
                }
                assert!(
                    !holds_an_inbox_descriptor(pid),
                    "rank {rank} still holds an inbox open after set-up"
                );
            }
            assert_eq!(inodes.len(), N, "every rank maps the same {N} inboxes");
            assert!(dev_shm_used() >= baseline + N as u64 * inbox_bytes(N as u64));
            // Another user sees none of it and opens none of it.
            let (range, _) = shm_mappings(job.pid(0)).remove(0);
            let stranger = Command::new("sh")
                .args([
                    "-c",
                    &format!(
                        "ls -A /dev/shm; cat /proc/{}/map_files/{range} >/dev/null && echo OPENED",
                        job.pid(0)
                    ),
                ])
                .uid(65534)
                .gid(65534)
                .output()
                .expect("run a stranger");
            let listed: BTreeSet<String> = String::from_utf8_lossy(&stranger.stdout)
                .lines()
                .map(str::to_string)
                .filter(|l| l != "OPENED")
                .collect();
            assert_eq!(listed, planted, "the stranger's listing");
            assert!(
                !String::from_utf8_lossy(&stranger.stdout).contains("OPENED"),
                "the stranger opened a segment"
            );

            let ends = job.finish(Duration::from_secs(120));
            let appeared = watcher.names_seen();
            assert_no_signal(&ends, None);
            for (rank, end) in ends.iter().enumerate() {
                assert!(end.status.success(), "rank {rank}: {end:?}");
                assert_eq!(end.result("transport"), Some("shm"), "rank {rank}: {end:?}");
            }
            assert!(
                appeared.is_empty(),
                "names appeared in /dev/shm: {appeared:?}"
            );
            assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
            for i in 0..N {
                let link = shm.join(format!("ringccl-{i:016x}-{i}"));
                assert_eq!(std::fs::read_link(&link).expect("planted link"), victim);
            }
            let fifo_type = std::fs::symlink_metadata(&fifo).expect("fifo").file_type();
            assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo_type));
            assert_eq!(std::fs::metadata(&open_file).expect("file").len(), 0);
            assert_dev_shm_clean(&planted, baseline, "after the job");
            let _ = std::fs::remove_file(&victim);
            assert!(started.elapsed() < Duration::from_secs(200));
        }
    }
}

/// A rank SIGKILLed while its inbox is being set up (created, not yet closed): the
/// others fail start-up at once naming it (their deadline is two minutes away), none
/// dies of a signal, and once they have exited nothing is left in `/dev/shm` — no name,
/// no byte. (`tests/setup_crash.rs` kills ranks at chosen points of set-up.)
#[test]
fn a_rank_killed_during_set_up_leaves_nothing_behind() {
    const NAME: &str = "a_rank_killed_during_set_up_leaves_nothing_behind";
    const N: usize = 3;
    const VICTIM: usize = 1;
    match role() {
        Role::Rank => be_a_rank(),
        Role::Test => run_in_private_dev_shm(NAME, "64m", Duration::from_secs(300)),
        Role::Coordinator => {
            let mut attempts = 0;
            loop {
                attempts += 1;
                let mut job = Job::start(
                    NAME,
                    N,
                    &[("RINGCCL_TRANSPORT", "shm"), (TIMEOUT_VAR, "120")],
                );
                // Kill the victim the moment it holds its new inbox open.
                let watch_until = Instant::now() + Duration::from_secs(60);
                let pid = job.pid(VICTIM);
                let mut caught = false;
                while Instant::now() < watch_until {
                    if holds_an_inbox_descriptor(pid) {
                        caught = true;
                        break;
                    }
                    if job.children[VICTIM].try_wait().ok().flatten().is_some() {
                        break;
                    }
                    thread::yield_now();
                }
                if caught {
                    job.children[VICTIM].kill().expect("SIGKILL the victim");
                }
                let killed_at = Instant::now();
                let ends = job.finish(Duration::from_secs(60));
                assert_no_signal(&ends, Some(VICTIM));
                let survivors_failed_set_up = ends
                    .iter()
                    .enumerate()
                    .all(|(r, e)| r == VICTIM || e.result("init-error").is_some());
                if !caught || !survivors_failed_set_up {
                    // Set-up outran the watch; try again (a fast machine could).
                    assert!(attempts < 5, "never caught rank {VICTIM} inside set-up");
                    eprintln!("attempt {attempts}: set-up outran the watch; again");
                    continue;
                }
                assert_eq!(ends[VICTIM].status.signal(), Some(libc::SIGKILL));
                for (rank, end) in ends.iter().enumerate().filter(|(r, _)| *r != VICTIM) {
                    assert_eq!(end.status.code(), Some(INIT_FAILED), "rank {rank}: {end:?}");
                }
                // Rank 0 sees the victim's connection close and names it. (Rank 2 may
                // name it too, or rank 0, whose exit takes the store away.)
                let error = ends[0].result("init-error").expect("rank 0's error");
                eprintln!("rank 0 after the crash: {error}");
                assert!(error.contains(&format!("rank {VICTIM}")), "rank 0: {error}");
                // The survivors give up at once, not at their 120 s deadline.
                let took = killed_at.elapsed();
                eprintln!("the survivors ended {took:?} after the kill");
                assert!(took < Duration::from_secs(10), "took {took:?}");
                assert_dev_shm_clean(&BTreeSet::new(), 0, "after the crash");
                break;
            }
        }
    }
}
