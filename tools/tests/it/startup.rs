//! `ringrun --hang-timeout` watches start-up: the ranks it started name the ranks that
//! never joined.
//!
//! The ranks are this test binary re-executed as a plain program (`common::startup`): it
//! calls `init_process_group` and nothing else (no `tracing` subscriber, no logging
//! set-up).

use crate::common;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::heavy_lock;
use common::startup::{run_as_rank, Killed, Lines, CHILD};

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");

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
