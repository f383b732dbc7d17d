//! `ringrun --trace` merges the timelines of real processes into one trace, one row per
//! rank; a call that hangs until the job is stopped shows there as unfinished.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::heavy_lock;
use common::timeline::{events, row, spans, trace_dir};
use ringccl::ReduceOp;

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");

/// Under ringrun: a few collectives, then rank 2 leaves by `std::process::exit`, which
/// skips destructors (its file is finished by the library's exit hook).
fn ringrun_child() {
    let opts = ringccl::InitOptions::from_env().unwrap();
    let pg = ringccl::init_process_group("gloo", opts).unwrap();
    for i in 0..5 {
        let mut x = vec![pg.rank() as f32; 64 << i];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    }
    pg.barrier().unwrap();
    println!("done");
    if pg.rank() == 2 {
        std::process::exit(0);
    }
}

#[test]
fn ringrun_trace_merges_every_rank_into_one_trace() {
    if std::env::var_os("RINGCCL_TRACE_TEST_CHILD").is_some() {
        ringrun_child();
        return;
    }
    let _guard = heavy_lock();
    let dir = trace_dir("ringrun");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rank-1.5.json"), "left by an earlier job").unwrap();
    let started = Instant::now();
    let out = Command::new(RINGRUN)
        .args(["--nproc-per-node", "3", "--trace"])
        .arg(&dir)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &common::test_path("ringrun_trace_merges_every_rank_into_one_trace"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RINGCCL_TRACE_TEST_CHILD", "1")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("merged the timelines of 3 rank(s)"),
        "{stderr}"
    );
    assert!(
        !dir.join("rank-1.5.json").exists(),
        "stale files are removed first"
    );

    let merged = events(&dir.join("trace.json"));
    let mut transports = Vec::new();
    for rank in 0..3u64 {
        assert!(
            merged.iter().any(|e| e["name"] == "process_name"
                && e["pid"] == rank
                && e["args"]["name"] == format!("rank {rank}")),
            "no row named rank {rank}"
        );
        let tid = row(&merged, rank, "collectives").expect("collectives row");
        let calls = spans(&merged, rank, tid);
        let ops: Vec<u64> = calls
            .iter()
            .map(|s| s["args"]["op"].as_u64().unwrap())
            .collect();
        assert_eq!(ops, (1..=6).collect::<Vec<u64>>(), "rank {rank}");
        assert_eq!(calls[5]["name"], "barrier");
        assert_eq!(calls[4]["args"]["bytes"], 64 * 16 * 4);
        transports.push(calls[0]["args"]["transport"].as_str().unwrap().to_string());
        // Each rank's own file is complete, rank 2's (process::exit) included.
        events(&dir.join(format!("rank-{rank}.json")));
    }
    assert!(
        transports.iter().all(|t| t == &transports[0]),
        "{transports:?}"
    );
    assert_eq!(merged.iter().filter(|e| e["ph"] == "X").count(), 18);
    assert!(elapsed < Duration::from_secs(120), "took {elapsed:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Under ringrun: one all-reduce, then rank 2 goes off elsewhere while the others enter
/// the next one, which hangs until ringrun stops the job.
fn hung_child() {
    let opts = ringccl::InitOptions::from_env().unwrap();
    let pg = ringccl::init_process_group("gloo", opts).unwrap();
    let mut x = vec![1.0f32; 256];
    pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    if pg.rank() == 2 {
        std::thread::sleep(Duration::from_secs(100));
        return;
    }
    let _ = pg.all_reduce(&mut x, ReduceOp::Sum);
}

/// A call that never finishes (the job is stopped while it hangs) still shows
/// in the merged trace, as one span marked unfinished per rank, from the call's start to
/// about when the rank was stopped.
#[test]
fn a_call_that_hangs_until_the_job_is_stopped_shows_in_the_merged_trace() {
    const TEST: &str = "a_call_that_hangs_until_the_job_is_stopped_shows_in_the_merged_trace";
    if std::env::var_os("RINGCCL_TRACE_TEST_HUNG").is_some() {
        hung_child();
        return;
    }
    let _guard = heavy_lock();
    let dir = trace_dir("hung");
    let out = Command::new(RINGRUN)
        .args(["--nproc-per-node", "3", "--hang-timeout", "2"])
        .args(["--hang-action", "stop", "--trace"])
        .arg(&dir)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &common::test_path(TEST),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RINGCCL_TRACE_TEST_HUNG", "1")
        .env_remove("RINGCCL_FLIGHT_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stopped by the hang watch: {stderr}");
    assert!(
        stderr.contains("2 call(s) never finished; they show as spans marked unfinished"),
        "{stderr}"
    );
    let merged = events(&dir.join("trace.json"));
    for rank in 0..2u64 {
        let tid = row(&merged, rank, "collectives").expect("collectives row");
        let calls = spans(&merged, rank, tid);
        let status: Vec<&str> = calls
            .iter()
            .map(|s| s["args"]["status"].as_str().unwrap())
            .collect();
        assert_eq!(status, ["ok", "unfinished"], "rank {rank}: {calls:?}");
        let hung = calls[1];
        assert_eq!(
            (hung["name"].as_str(), hung["args"]["op"].as_u64()),
            (Some("all_reduce"), Some(2))
        );
        // It ran at least the hang timeout before the job was stopped.
        assert!(hung["dur"].as_f64().unwrap() >= 1e6, "rank {rank}: {hung}");
    }
    let tid = row(&merged, 2, "collectives").expect("rank 2's row");
    assert_eq!(spans(&merged, 2, tid).len(), 1, "rank 2 ran one call");
    if let Some(kept) = stderr
        .lines()
        .find_map(|l| l.strip_prefix("ringrun: flight records kept in "))
        .and_then(|rest| rest.split(" (").next())
    {
        let _ = std::fs::remove_dir_all(kept);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
