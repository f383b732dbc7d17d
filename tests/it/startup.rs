//! Start-up that talks, as a user's program sees it: a rank left waiting says whom it
//! waits for by itself (no logging set up by the program), `RINGCCL_DEBUG` works without
//! one, `ringrun --hang-timeout` watches start-up, and a rank started with another
//! WORLD_SIZE stops everyone at once.
//!
//! The ranks are this test binary re-executed as a plain program: it calls
//! `init_process_group` and nothing else (no `tracing` subscriber, no logging set-up).

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringccl::{init_process_group, InitOptions, StoreListener};

use common::heavy_lock;

/// Set in a child: it is a rank, not the test.
const CHILD: &str = "RINGCCL_STARTUP_TEST_CHILD";
/// What rank 0 prints once it hosts the store on a free port.
const PORT_PREFIX: &str = "STARTUP_PORT=";
const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");

/// In a child: joins the group from the environment as a user's program would (rank 0
/// without MASTER_PORT hosts the store on a free port and prints it), prints `JOINED`
/// or the error, and exits. Returns false in the test process itself.
fn run_as_rank() -> bool {
    if std::env::var_os(CHILD).is_none() {
        return false;
    }
    let env = |k: &str| std::env::var(k).ok();
    let result = if env("RANK").as_deref() == Some("0") && env("MASTER_PORT").is_none() {
        let listener = StoreListener::bind("127.0.0.1:0").expect("bind store listener");
        let port = listener
            .local_addr()
            .expect("store address")
            .port()
            .to_string();
        println!("{PORT_PREFIX}{port}");
        InitOptions::from_vars(|k| match k {
            "MASTER_PORT" => Some(port.clone()),
            _ => env(k),
        })
        .map(|opts| opts.store_listener(listener))
    } else {
        InitOptions::from_env()
    }
    .and_then(|opts| init_process_group("gloo", opts));
    match result {
        Ok(pg) => {
            println!("JOINED rank {}", pg.rank());
            pg.barrier().expect("barrier");
        }
        Err(e) => println!("ERROR {e}"),
    }
    true
}

/// A rank of this test binary (`test` names the test it runs in), its output piped.
fn spawn_rank(test: &str, rank: usize, world_size: usize, env: &[(&str, &str)]) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &common::test_path(test),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world_size.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("RINGCCL_TRANSPORT", "tcp")
        .env_remove("MASTER_PORT")
        .env_remove("RINGCCL_DEBUG")
        .env_remove("RINGCCL_STARTUP_REPORT")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a rank")
}

/// Lines of a child's stdout and stderr, as they come, tagged with when they came.
struct Lines {
    rx: mpsc::Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Lines {
    fn of(child: &mut Child) -> Lines {
        let (tx, rx) = mpsc::channel();
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped stdout"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped stderr"));
        for stream in [out, err] {
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send((Instant::now(), line)).is_err() {
                        return;
                    }
                }
            });
        }
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// The first line containing `needle` and when it came, waiting until `until`.
    fn wait_for(&mut self, needle: &str, until: Instant) -> Option<(Instant, String)> {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return Some((Instant::now(), line.clone()));
        }
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            let (at, line) = self.rx.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if line.contains(needle) {
                return Some((at, line));
            }
        }
    }

    fn all(&mut self) -> String {
        while let Ok((_, line)) = self.rx.try_recv() {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}

/// Kills a child on every path out of a test.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The port rank 0 announced.
fn announced_port(lines: &mut Lines) -> String {
    let (_, line) = lines
        .wait_for(PORT_PREFIX, Instant::now() + Duration::from_secs(60))
        .unwrap_or_else(|| panic!("rank 0 announced no port:\n{}", lines.all()));
    line.split(PORT_PREFIX)
        .nth(1)
        .expect("port")
        .trim()
        .to_string()
}

#[test]
fn a_rank_missing_at_start_up_is_reported_within_35_s_by_a_program_without_logging() {
    if run_as_rank() {
        return;
    }
    let test = "a_rank_missing_at_start_up_is_reported_within_35_s_by_a_program_without_logging";
    // The default report time (30 s): nothing set but the launcher's variables.
    let started = Instant::now();
    let mut rank0 = Killed(spawn_rank(test, 0, 2, &[("RINGCCL_TIMEOUT", "120")]));
    let mut lines = Lines::of(&mut rank0.0);
    let found = lines.wait_for(
        "still waiting for rank 1",
        started + Duration::from_secs(60),
    );
    let (at, line) = found.unwrap_or_else(|| {
        panic!(
            "rank 0 said nothing about the missing rank 1 within 60 s:\n{}",
            lines.all()
        )
    });
    let after = at.duration_since(started);
    assert!(
        after <= Duration::from_secs(35),
        "reported after {after:?}, not within 35 s: {line}"
    );
    assert!(
        after >= Duration::from_secs(29),
        "reported early ({after:?}): {line}"
    );
    assert!(
        line.contains("rank 0: 1 of 2 ranks joined after 3")
            && line.contains("(MASTER_ADDR 127.0.0.1:")
            && line.contains(", WORLD_SIZE 2)"),
        "{line}"
    );
}

#[test]
fn each_waiting_rank_names_whom_it_waits_for() {
    if run_as_rank() {
        return;
    }
    let _heavy = heavy_lock();
    let test = "each_waiting_rank_names_whom_it_waits_for";
    // Ranks 0 and 2 of 3; rank 1 never starts.
    let env = [("RINGCCL_TIMEOUT", "60"), ("RINGCCL_STARTUP_REPORT", "1")];
    let mut rank0 = Killed(spawn_rank(test, 0, 3, &env));
    let mut lines0 = Lines::of(&mut rank0.0);
    let port = announced_port(&mut lines0);
    let mut env2 = env.to_vec();
    env2.push(("MASTER_PORT", &port));
    let mut rank2 = Killed(spawn_rank(test, 2, 3, &env2));
    let mut lines2 = Lines::of(&mut rank2.0);
    let until = Instant::now() + Duration::from_secs(30);
    // Rank 2 has claimed its rank by its second report: rank 0 tells it apart.
    let (_, line) = lines0
        .wait_for("rank 0: 2 of 3 ranks joined", until)
        .unwrap_or_else(|| panic!("rank 0:\n{}", lines0.all()));
    assert!(
        line.contains("still waiting for rank 1 (rank 2 started, not yet connected to this rank)"),
        "{line}"
    );
    let (_, line) = lines2
        .wait_for("rank 2: still waiting after", until)
        .unwrap_or_else(|| panic!("rank 2:\n{}", lines2.all()));
    assert!(line.contains("for rank 1 to join"), "{line}");
    assert!(
        line.contains(&format!("MASTER_ADDR 127.0.0.1:{port}")),
        "{line}"
    );
}

#[test]
fn ringrun_hang_timeout_names_ranks_missing_at_start_up() {
    if run_as_rank() {
        return;
    }
    let _heavy = heavy_lock();
    let test = "ringrun_hang_timeout_names_ranks_missing_at_start_up";
    // Node 1 of 2 is never started; ringrun picks no port for two nodes, so pass a
    // free one.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let exe = std::env::current_exe().expect("test binary");
    let exe = exe.to_str().expect("test binary path");
    let started = Instant::now();
    let mut ringrun = Killed(
        Command::new(RINGRUN)
            .args(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2"])
            .args(["--master-port", &port, "--hang-timeout", "2", "--"])
            .args([
                exe,
                "--exact",
                &common::test_path(test),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("RINGCCL_TIMEOUT", "60")
            .env("RINGCCL_TRANSPORT", "tcp")
            .env_remove("RINGCCL_STARTUP_REPORT")
            .env_remove("RINGCCL_DEBUG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start ringrun"),
    );
    let mut lines = Lines::of(&mut ringrun.0);
    let (at, line) = lines
        .wait_for(
            "rank 0: 2 of 4 ranks joined",
            started + Duration::from_secs(40),
        )
        .unwrap_or_else(|| panic!("no start-up report from rank 0:\n{}", lines.all()));
    assert!(line.starts_with("[rank 0] "), "{line}");
    assert!(
        line.contains("still waiting for ranks 2, 3 (MASTER_ADDR"),
        "{line}"
    );
    assert!(
        at.duration_since(started) < Duration::from_secs(20),
        "reported after {:?}",
        at.duration_since(started)
    );
}

#[test]
fn a_world_size_mismatch_stops_every_rank_at_once() {
    if run_as_rank() {
        return;
    }
    let _heavy = heavy_lock();
    let test = "a_world_size_mismatch_stops_every_rank_at_once";
    let env = [("RINGCCL_TIMEOUT", "120")];
    let started = Instant::now();
    let mut rank0 = Killed(spawn_rank(test, 0, 2, &env));
    let mut lines0 = Lines::of(&mut rank0.0);
    let port = announced_port(&mut lines0);
    let mut env1 = env.to_vec();
    env1.push(("MASTER_PORT", &port));
    let mut rank1 = Killed(spawn_rank(test, 1, 3, &env1));
    let mut lines1 = Lines::of(&mut rank1.0);
    let until = started + Duration::from_secs(60);
    let (_, err1) = lines1
        .wait_for("ERROR ", until)
        .unwrap_or_else(|| panic!("rank 1:\n{}", lines1.all()));
    let (_, err0) = lines0
        .wait_for("ERROR ", until)
        .unwrap_or_else(|| panic!("rank 0:\n{}", lines0.all()));
    let elapsed = started.elapsed();
    for err in [&err0, &err1] {
        assert!(
            err.contains("WORLD_SIZE is 3 here, but rank 0 started the job")
                && err.contains("with WORLD_SIZE 2"),
            "{err}"
        );
    }
    assert!(err0.contains("rank 0: rendezvous abandoned"), "{err0}");
    assert!(
        elapsed < Duration::from_secs(60),
        "took {elapsed:?}: the deadline (120 s), not the mismatch, ended start-up"
    );
}

#[test]
fn ringccl_debug_works_in_a_program_that_set_up_no_logging() {
    if run_as_rank() {
        return;
    }
    let _heavy = heavy_lock();
    let test = "ringccl_debug_works_in_a_program_that_set_up_no_logging";
    let mut rank0 = Killed(spawn_rank(
        test,
        0,
        1,
        &[("RINGCCL_DEBUG", "info"), ("RINGCCL_TIMEOUT", "60")],
    ));
    let mut lines = Lines::of(&mut rank0.0);
    let until = Instant::now() + Duration::from_secs(60);
    let (_, line) = lines
        .wait_for("process group ready", until)
        .unwrap_or_else(|| panic!("no start-up line with RINGCCL_DEBUG=info:\n{}", lines.all()));
    assert!(line.contains("INFO"), "{line}");
    assert!(
        line.contains("rank=0") && line.contains("world_size=1"),
        "{line}"
    );
    lines
        .wait_for("JOINED rank 0", until)
        .unwrap_or_else(|| panic!("{}", lines.all()));

    // Without the variable, a healthy start-up prints nothing but the program's own.
    let mut quiet = Killed(spawn_rank(test, 0, 1, &[("RINGCCL_TIMEOUT", "60")]));
    let status = quiet.0.wait().expect("wait");
    assert!(status.success());
    let mut out = String::new();
    let mut err = String::new();
    quiet
        .0
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    quiet
        .0
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    assert!(out.contains("JOINED rank 0"), "{out}");
    assert!(
        !err.contains("INFO") && !out.contains("INFO"),
        "{out}\n{err}"
    );
}
