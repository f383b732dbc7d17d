//! Shared harness for multi-rank tests: run N ranks as threads of this process or as
//! separate OS processes (this test binary re-executing itself), on loopback, with the
//! store on an OS-chosen port.

#![allow(dead_code, unreachable_pub)]

pub mod elements;
#[cfg(feature = "nccl")]
pub mod gpu;
pub mod matrix;
pub mod netns;
pub mod reading_peers;
pub mod startup;
pub mod timeline;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use ringccl::{init_process_group, InitOptions, ProcessGroup, StoreListener};

/// Deadline for collectives in tests: generous, so a loaded 2-core machine passes.
pub const GROUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a whole multi-process test may take before its children are killed.
pub const PROCESS_TEST_LIMIT: Duration = Duration::from_secs(600);

const CHILD_VAR: &str = "RINGCCL_TEST_CHILD_OF";
const PORT_PREFIX: &str = "RINGCCL_TEST_PORT=";
pub const RESULT_PREFIX: &str = "RESULT ";

static HEAVY: Mutex<()> = Mutex::new(());

/// Serialises multi-rank tests inside one test binary, so that at most one group's
/// ranks compete for the two cores at a time.
pub fn heavy_lock() -> MutexGuard<'static, ()> {
    HEAVY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The full name (`module::name`) of this binary's test function `name`, for a child
/// process to run exactly that test (`--exact`): every file of the integration tests is
/// a module of one binary. Panics when no test, or more than one, has that name.
pub fn test_path(name: &str) -> String {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let exe = std::env::current_exe().expect("current test binary");
        let listed = Command::new(exe)
            .args(["--list", "--format", "terse"])
            .env_remove(CHILD_VAR)
            .output()
            .expect("list this binary's tests");
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter_map(|line| line.strip_suffix(": test"))
            .map(str::to_string)
            .collect()
    });
    let suffix = format!("::{name}");
    let found: Vec<&String> = names
        .iter()
        .filter(|n| *n == name || n.ends_with(&suffix))
        .collect();
    match found.as_slice() {
        [one] => (*one).clone(),
        [] => panic!("no test named {name} in this binary"),
        many => panic!("several tests are named {name}: {many:?}; rename one"),
    }
}

/// Runs `body` on `n` ranks, each a thread with its own process group.
pub fn run_threads<R: Send>(
    n: usize,
    timeout: Duration,
    body: impl Fn(ProcessGroup) -> R + Sync,
) -> Vec<R> {
    let listener = StoreListener::bind("127.0.0.1:0").expect("bind store listener");
    run_threads_on(listener, n, timeout, body)
}

/// [`run_threads`] with every rank's options adjusted by `tweak`.
pub fn run_threads_with<R: Send>(
    n: usize,
    timeout: Duration,
    tweak: impl Fn(InitOptions) -> InitOptions + Sync,
    body: impl Fn(ProcessGroup) -> R + Sync,
) -> Vec<R> {
    let listener = StoreListener::bind("127.0.0.1:0").expect("bind store listener");
    run_threads_configured(listener, n, timeout, &tweak, body)
}

/// [`run_threads`] with rank 0's store on a listener the caller bound.
pub fn run_threads_on<R: Send>(
    listener: StoreListener,
    n: usize,
    timeout: Duration,
    body: impl Fn(ProcessGroup) -> R + Sync,
) -> Vec<R> {
    run_threads_configured(listener, n, timeout, &|opts| opts, body)
}

fn run_threads_configured<R: Send>(
    listener: StoreListener,
    n: usize,
    timeout: Duration,
    tweak: &(dyn Fn(InitOptions) -> InitOptions + Sync),
    body: impl Fn(ProcessGroup) -> R + Sync,
) -> Vec<R> {
    let addr = listener.local_addr().expect("store address").to_string();
    let mut listener = Some(listener);
    thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                // Pinned to TCP unless a test asks otherwise: the shared-memory transport
                // has its own tests, and the default (auto) would pick it here.
                let mut opts = tweak(
                    InitOptions::new(rank, n, &addr)
                        .timeout(timeout)
                        .transport(ringccl::TransportKind::Tcp),
                );
                if rank == 0 {
                    opts = opts.store_listener(listener.take().expect("listener"));
                }
                let body = &body;
                thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let pg = init_process_group("gloo", opts)
                            .unwrap_or_else(|e| panic!("rank {rank}: init failed: {e}"));
                        body(pg)
                    })
                    .expect("spawn rank thread")
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().unwrap_or_else(|_| panic!("rank {rank} panicked")))
            .collect()
    })
}

/// In a child process started by [`run_processes`] for `test_name`, joins the group and
/// returns it; in the parent, returns `None`.
pub fn child_group(test_name: &str) -> Option<ProcessGroup> {
    if std::env::var(CHILD_VAR).ok()? != test_name {
        return None;
    }
    let rank: usize = std::env::var("RANK").ok()?.parse().ok()?;
    let opts = child_options(PORT_PREFIX);
    let timeout = std::env::var("RINGCCL_TEST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(GROUP_TIMEOUT, Duration::from_secs_f64);
    let pg = init_process_group("gloo", opts.timeout(timeout))
        .unwrap_or_else(|e| panic!("rank {rank}: init failed: {e}"));
    Some(pg)
}

/// A child rank's options from its environment (RANK, WORLD_SIZE, MASTER_ADDR, …).
/// Rank 0 hosts the store on a free port of MASTER_ADDR (127.0.0.1 if unset; its
/// namespace's address in netns tests) and prints `{announce}{port}` for the parent,
/// which passes the real port on to the other ranks.
pub fn child_options(announce: &str) -> InitOptions {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"));
    let rank: usize = var("RANK").parse().expect("RANK");
    let world: usize = var("WORLD_SIZE").parse().expect("WORLD_SIZE");
    if rank != 0 {
        return InitOptions::from_env().expect("child environment");
    }
    let host = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let listener = StoreListener::bind(&format!("{host}:0")).expect("bind store listener");
    let addr = listener.local_addr().expect("store address");
    println!("{announce}{}", addr.port());
    InitOptions::new(0, world, &addr.to_string()).store_listener(listener)
}

fn spawn_child(test_name: &str, rank: usize, n: usize, port: u16, env: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().expect("current test binary");
    Command::new(exe)
        .args([
            "--exact",
            &test_path(test_name),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RINGCCL_TRANSPORT", "tcp")
        .envs(env.iter().copied())
        .env(CHILD_VAR, test_name)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child rank")
}

enum Line {
    Text(usize, String),
    Closed(usize),
}

fn forward_stdout(rank: usize, child: &mut Child, tx: mpsc::Sender<Line>) {
    let stdout = child.stdout.take().expect("piped stdout");
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(Line::Text(rank, line)).is_err() {
                return;
            }
        }
        let _ = tx.send(Line::Closed(rank));
    });
}

/// Runs the test `test_name` as `n` separate processes (rank 0 first, to learn the
/// store's port) and returns the `RESULT` lines each rank printed, by rank. Fails the
/// test if a rank fails or the whole run exceeds [`PROCESS_TEST_LIMIT`].
pub fn run_processes(test_name: &str, n: usize) -> Vec<Vec<String>> {
    run_processes_with_env(test_name, n, &[])
}

/// [`run_processes`] with extra environment variables for every rank.
pub fn run_processes_with_env(test_name: &str, n: usize, env: &[(&str, &str)]) -> Vec<Vec<String>> {
    run_processes_ending(test_name, n, env, None)
}

/// [`run_processes_with_env`] where rank `killed` is to end by SIGKILL (it kills itself):
/// its status must say so; every other rank must succeed.
pub fn run_processes_one_killed(
    test_name: &str,
    n: usize,
    env: &[(&str, &str)],
    killed: usize,
) -> Vec<Vec<String>> {
    run_processes_ending(test_name, n, env, Some(killed))
}

fn run_processes_ending(
    test_name: &str,
    n: usize,
    env: &[(&str, &str)],
    killed: Option<usize>,
) -> Vec<Vec<String>> {
    let deadline = Instant::now() + PROCESS_TEST_LIMIT;
    let (tx, rx) = mpsc::channel();
    let mut children: Vec<Child> = Vec::new();
    let mut first = spawn_child(test_name, 0, n, 0, env);
    forward_stdout(0, &mut first, tx.clone());
    children.push(first);
    let mut results: Vec<Vec<String>> = vec![Vec::new(); n];
    let mut open = n;
    let mut port = None;
    let kill_all = |children: &mut Vec<Child>| {
        for c in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(_) => {
                kill_all(&mut children);
                panic!("{test_name}: ranks did not finish within {PROCESS_TEST_LIMIT:?}");
            }
        };
        match line {
            Line::Text(rank, text) => {
                // libtest may print "test NAME ... " on the same line before our output.
                if let Some(p) = after(&text, PORT_PREFIX) {
                    let p: u16 = p.trim().parse().expect("port line");
                    port = Some(p);
                    for r in 1..n {
                        let mut child = spawn_child(test_name, r, n, p, env);
                        forward_stdout(r, &mut child, tx.clone());
                        children.push(child);
                    }
                } else if let Some(result) = after(&text, RESULT_PREFIX) {
                    results[rank].push(result.to_string());
                }
            }
            Line::Closed(rank) => {
                if rank == 0 && port.is_none() {
                    kill_all(&mut children);
                    panic!("{test_name}: rank 0 exited before opening the store");
                }
                open -= 1;
            }
        }
    }
    for (rank, child) in children.iter_mut().enumerate() {
        let status = child.wait().expect("wait for child");
        if killed == Some(rank) {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(libc::SIGKILL),
                "{test_name}: rank {rank} was to be killed: {status}"
            );
            continue;
        }
        assert!(
            status.success(),
            "{test_name}: rank {rank} failed: {status}"
        );
    }
    results
}

fn after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    text.find(marker).map(|at| &text[at + marker.len()..])
}

/// FNV-1a over bytes: a digest to compare ranks' results.
/// A child's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The example `name` of the ringccl package, built by `cargo test` next to this test's
/// binary (built here if this run has not: a filtered run, or the tools' tests).
pub fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .join("examples")
        .join(name);
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args(["build", "-p", "ringccl", "--example", name])
            .status()
            .expect("run cargo build --example");
        assert!(built.success(), "building the {name} example failed");
    }
    path
}

/// The `final_params_l2=` figure the ddp_mlp example prints.
pub fn final_params_l2(stdout: &str) -> Option<f64> {
    stdout
        .lines()
        .find_map(|l| l.split("final_params_l2=").nth(1))
        .and_then(|v| v.trim().parse().ok())
}

pub fn digest(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
