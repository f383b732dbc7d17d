//! The `ringrun` launcher: environment, output prefixes, failure handling, restarts,
//! signal forwarding, and a real ringccl job under it.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{heavy_lock, text};

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");
const LIMIT: Duration = Duration::from_secs(120);

/// Runs ringrun to completion (killing it after [`LIMIT`]).
fn ringrun(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let child = Command::new(RINGRUN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ringrun");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(LIMIT) {
        Ok(output) => output.expect("ringrun output"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("ringrun {args:?} did not finish within {LIMIT:?}");
        }
    };
    (output, started.elapsed())
}

#[test]
fn sets_torchrun_variables_and_prefixes_output() {
    let (out, _) = ringrun(&[
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        "echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK A=$MASTER_ADDR P=$MASTER_PORT C=$TORCHELASTIC_RESTART_COUNT M=$TORCHELASTIC_MAX_RESTARTS; echo to-stderr >&2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    let mut ports = Vec::new();
    for r in 0..3 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("[rank {r}] R={r} ")))
            .unwrap_or_else(|| panic!("no line for rank {r} in {stdout}"));
        assert!(
            line.contains(&format!("L={r} W=3 LW=3 G=0 A=127.0.0.1 P="))
                && line.ends_with(" C=0 M=0"),
            "{line}"
        );
        let port: u16 = line
            .split("P=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        ports.push(port);
        assert!(
            stderr.contains(&format!("[rank {r}] to-stderr")),
            "{stderr}"
        );
    }
    assert!(ports.iter().all(|&p| p == ports[0] && p != 0), "{ports:?}");
}

#[test]
fn numbers_ranks_across_nodes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let port = port.to_string();
    let (out, _) = ringrun(&[
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "10.0.0.9",
        "--master-port",
        &port,
        "--",
        "sh",
        "-c",
        "echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE G=$GROUP_RANK A=$MASTER_ADDR P=$MASTER_PORT",
    ]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    for (r, l) in [(2, 0), (3, 1)] {
        let want = format!("[rank {r}] R={r} L={l} W=4 G=1 A=10.0.0.9 P={port}");
        assert!(
            stdout.lines().any(|line| line == want),
            "missing {want:?} in {stdout}"
        );
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    let (out, elapsed) = ringrun(&[
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        "if [ \"$RANK\" = 1 ]; then sleep 0.2; echo 'rank one: bad things' >&2; exit 3; fi; \
         sleep 60",
    ]);
    assert!(!out.status.success());
    assert!(
        elapsed < Duration::from_secs(40),
        "others were not stopped: {elapsed:?}"
    );
    let stderr = text(&out.stderr);
    let verdict = stderr.find("ringrun: rank 1 failed (exit code 3)");
    // The rank's own last words come first, then ringrun's verdict on it.
    let own = stderr.find("[rank 1] rank one: bad things");
    assert!(
        own.is_some() && verdict.is_some() && own < verdict,
        "{stderr}"
    );
}

#[test]
fn max_restarts_restarts_the_group() {
    let script = "if [ \"$RANK\" = 0 ] && [ \"$TORCHELASTIC_RESTART_COUNT\" -lt 2 ]; then exit 1; fi; echo done $TORCHELASTIC_RESTART_COUNT";
    let (out, _) = ringrun(&[
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("[rank 0] done 2"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("restart 2 of 2"),
        "{}",
        text(&out.stderr)
    );

    let (out, _) = ringrun(&[
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("giving up after 1 restart (the budget"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    let mut child = Command::new(RINGRUN)
        .args([
            "--nproc-per-node",
            "2",
            "--",
            "sh",
            "-c",
            "trap 'echo got-term; exit 0' TERM; echo ready; sleep 60 & wait",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + LIMIT;
    let mut ready = 0;
    while ready < 2 {
        let line = rx
            .recv_timeout(deadline - Instant::now())
            .expect("ranks did not start");
        ready += usize::from(line.ends_with("] ready"));
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let mut got = 0;
    while got < 2 {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("ranks did not get SIGTERM");
        got += usize::from(line.ends_with("] got-term"));
    }
    let status = child.wait().unwrap();
    assert!(!status.success());
}

#[test]
fn runs_a_real_ringccl_job() {
    if std::env::var_os("RINGRUN_TEST_CHILD").is_some() {
        let opts = ringccl::InitOptions::from_env().unwrap();
        let pg = ringccl::init_process_group("gloo", opts).unwrap();
        let mut x = [pg.rank() as i64 + 1];
        pg.all_reduce(&mut x, ringccl::ReduceOp::Sum).unwrap();
        println!("\nsum={}", x[0]);
        return;
    }
    let _guard = heavy_lock();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(RINGRUN)
        .args(["--nproc-per-node", "3", "--"])
        .arg(exe)
        .args([
            "--exact",
            &common::test_path("runs_a_real_ringccl_job"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RINGRUN_TEST_CHILD", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for r in 0..3 {
        assert!(stdout.contains(&format!("[rank {r}] sum=6")), "{stdout}");
    }
}
