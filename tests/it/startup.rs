//! Start-up that talks, as a user's program sees it: a rank left waiting says whom it
//! waits for by itself (no logging set up by the program), `RINGCCL_DEBUG` works without
//! one, and a rank started with another WORLD_SIZE stops everyone at once.
//!
//! The ranks are this test binary re-executed as a plain program (`common::startup`): it
//! calls `init_process_group` and nothing else (no `tracing` subscriber, no logging
//! set-up).

use crate::common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::heavy_lock;
use common::startup::{announced_port, run_as_rank, spawn_rank, Killed, Lines};

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
