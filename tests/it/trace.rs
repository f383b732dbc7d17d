//! The timeline (`RINGCCL_TRACE` / `InitOptions::trace_dir`): every rank's Chrome trace
//! is valid JSON with exactly one span per collective and the call's arguments; groups
//! formed from a group use rows of their own; DDP marks its buckets and the backward
//! pass; `ringrun --trace` merges real processes' files into one trace, one row per rank.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads_with, GROUP_TIMEOUT};
use ringccl::ddp::{DdpConfig, DistributedDataParallel, ParamSpec};
use ringccl::{DType, ReduceOp};
use serde_json::Value;

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");

/// A fresh directory for one test's traces.
fn trace_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringccl-trace-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The file parsed as one JSON document: it must be valid JSON as written.
fn events(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}\n{text}", path.display()))
}

/// The thread id of the row called `name` in process `pid`.
fn row(events: &[Value], pid: u64, name: &str) -> Option<u64> {
    events
        .iter()
        .find(|e| e["name"] == "thread_name" && e["pid"] == pid && e["args"]["name"] == name)
        .and_then(|e| e["tid"].as_u64())
}

/// The complete events of process `pid`'s row `tid`, in time order.
fn spans(events: &[Value], pid: u64, tid: u64) -> Vec<&Value> {
    let mut spans: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid)
        .collect();
    spans.sort_by(|a, b| a["ts"].as_f64().partial_cmp(&b["ts"].as_f64()).unwrap());
    spans
}

#[test]
fn every_rank_writes_one_span_per_collective_with_its_arguments() {
    let _guard = heavy_lock();
    let dir = trace_dir("spans");
    let started = Instant::now();
    run_threads_with(
        3,
        GROUP_TIMEOUT,
        |opts| opts.trace_dir(&dir),
        |pg| {
            let rank = pg.rank();
            let mut small = [1.0f32; 4];
            pg.all_reduce(&mut small, ReduceOp::Sum).unwrap(); // op 1: 16 B
            let mut large = vec![1.0f32; 30_000];
            pg.all_reduce(&mut large, ReduceOp::Sum).unwrap(); // op 2: 120 kB
            let mut ids = [rank as i64; 10];
            pg.broadcast(&mut ids, 1).unwrap(); // op 3
            pg.barrier().unwrap(); // op 4
            let mut gathered = [0.0f32; 6];
            pg.all_gather(&[rank as f32; 2], &mut gathered).unwrap(); // op 5
            let work = pg.all_reduce_async(vec![1.0f64; 8], ReduceOp::Max).unwrap(); // op 6
            work.wait().unwrap();
            {
                let _step = pg.trace_span("trainer", "step");
                let mut x = [1.0f32; 3];
                pg.reduce(&mut x, ReduceOp::Sum, 0).unwrap(); // op 7
            }
            // op 8: forming groups all-gathers on this group first.
            let sub = pg.split(Some((rank % 2) as u32)).unwrap().unwrap();
            let mut y = [1.0f32; 5];
            sub.all_reduce(&mut y, ReduceOp::Sum).unwrap();
            assert!(pg.trace_file().is_some());
            // Dropping the groups finishes the file.
        },
    );
    let elapsed = started.elapsed();
    let kinds = [
        "all_reduce",
        "all_reduce",
        "broadcast",
        "barrier",
        "all_gather",
        "all_reduce",
        "reduce",
        "all_gather",
    ];
    for rank in 0..3u64 {
        let events = events(&dir.join(format!("rank-{rank}.json")));
        let process = events
            .iter()
            .find(|e| e["name"] == "process_name")
            .expect("process name");
        assert_eq!(process["pid"], rank);
        assert_eq!(process["args"]["name"], format!("rank {rank}"));

        let tid = row(&events, rank, "collectives").expect("collectives row");
        let calls = spans(&events, rank, tid);
        let ops: Vec<u64> = calls
            .iter()
            .map(|s| s["args"]["op"].as_u64().unwrap())
            .collect();
        assert_eq!(
            ops,
            (1..=8).collect::<Vec<u64>>(),
            "rank {rank}: one span per call"
        );
        for (call, kind) in calls.iter().zip(kinds) {
            assert_eq!(call["name"], kind);
            assert_eq!(call["cat"], "collective");
            let args = &call["args"];
            assert_eq!(
                (args["rank"].as_u64(), args["world_size"].as_u64()),
                (Some(rank), Some(3))
            );
            assert_eq!(args["transport"], "tcp");
            assert_eq!(args["status"], "ok");
            assert!(call["dur"].as_f64().unwrap() >= 0.0);
        }
        let (small, large) = (&calls[0]["args"], &calls[1]["args"]);
        assert_eq!(small["bytes"], 16);
        assert_eq!(small["dtype"], "f32");
        assert_eq!(small["redop"], "sum");
        assert_eq!(small["algorithm"], "recursive doubling");
        assert_eq!(large["bytes"], 120_000);
        assert_eq!(large["algorithm"], "ring");
        // Ring: reduce-scatter and all-gather each pass two 40 kB segments to the next
        // rank and take two from the previous one.
        let (next, prev) = ((rank + 1) % 3, (rank + 2) % 3);
        assert_eq!(large["sent_to"][next.to_string()], 160_000, "{large}");
        assert_eq!(large["received_from"][prev.to_string()], 160_000, "{large}");
        assert!(large["sent_to"].get(prev.to_string()).is_none(), "{large}");
        let broadcast = &calls[2]["args"];
        assert_eq!(
            (broadcast["root"].as_u64(), broadcast["dtype"].as_str()),
            (Some(1), Some("i64"))
        );
        assert_eq!(calls[3]["args"]["bytes"], 0);
        assert_eq!(calls[5]["args"]["redop"], "max");
        assert_eq!(calls[5]["args"]["dtype"], "f64");
        assert_eq!(calls[6]["args"]["root"], 0);

        // The formed group: its own row in the same file, one span for its one call.
        let colour = rank % 2;
        let (sub_rank, sub_size) = match rank {
            0 => (0, 2),
            1 => (0, 1),
            _ => (1, 2),
        };
        let name = format!("collectives group/0/{colour}/ (rank {sub_rank} of {sub_size})");
        let sub_tid = row(&events, rank, &name).unwrap_or_else(|| panic!("no row {name:?}"));
        assert_ne!(sub_tid, tid);
        let sub_calls = spans(&events, rank, sub_tid);
        assert_eq!(sub_calls.len(), 1, "{sub_calls:?}");
        assert_eq!(sub_calls[0]["args"]["op"], 1);
        assert_eq!(sub_calls[0]["args"]["world_size"], sub_size);

        // The span the caller marked, around op 7.
        let trainer = row(&events, rank, "trainer").expect("trainer row");
        let step = spans(&events, rank, trainer);
        assert_eq!(step.len(), 1);
        let (ts, dur) = (
            step[0]["ts"].as_f64().unwrap(),
            step[0]["dur"].as_f64().unwrap(),
        );
        let reduce_ts = calls[6]["ts"].as_f64().unwrap();
        assert!(
            ts <= reduce_ts && reduce_ts <= ts + dur,
            "op 7 inside the step span"
        );

        let summary = events
            .iter()
            .find(|e| e["name"] == "ringccl_trace_summary")
            .expect("the file was finished");
        assert_eq!(summary["args"]["dropped"], 0);
        assert_eq!(summary["args"]["spans"], 8 + 1 + 1);
    }
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ddp_marks_its_buckets_and_the_backward_pass() {
    const STEPS: usize = 3;
    const BUCKETS: usize = 4;
    let _guard = heavy_lock();
    let dir = trace_dir("ddp");
    let started = Instant::now();
    run_threads_with(
        2,
        GROUP_TIMEOUT,
        |opts| opts.trace_dir(&dir),
        |pg| {
            // Four 1 KiB parameters in buckets of 1 KiB: four buckets per step.
            let params: Vec<ParamSpec> = (0..BUCKETS)
                .map(|i| ParamSpec::new(format!("p{i}"), 256, DType::F32))
                .collect();
            let config = DdpConfig::new()
                .bucket_cap_bytes(1024)
                .first_bucket_bytes(1024);
            let mut ddp = DistributedDataParallel::<f32>::new(&pg, &params, config).unwrap();
            for _ in 0..STEPS {
                let backward = ddp.backward_span();
                for i in (0..BUCKETS).rev() {
                    std::thread::sleep(Duration::from_millis(2)); // "compute"
                    ddp.mark_grad_ready(i, &[1.0; 256]).unwrap();
                }
                drop(backward);
                ddp.finish().unwrap();
            }
        },
    );
    for rank in 0..2u64 {
        let events = events(&dir.join(format!("rank-{rank}.json")));
        let ddp_row = row(&events, rank, "ddp").expect("ddp row");
        let buckets = spans(&events, rank, ddp_row);
        assert_eq!(
            buckets.len(),
            STEPS * BUCKETS,
            "one span per bucket per step"
        );
        for (i, bucket) in buckets.iter().enumerate() {
            let (step, index) = (i / BUCKETS, i % BUCKETS);
            assert_eq!(bucket["name"], format!("bucket {index}"));
            assert_eq!(bucket["cat"], "ddp");
            assert_eq!(bucket["args"]["step"], step as u64);
            assert_eq!(bucket["args"]["bucket"], index as u64);
            assert_eq!(bucket["args"]["bytes"], 1024);
        }
        let trainer = row(&events, rank, "trainer").expect("trainer row");
        let marks = spans(&events, rank, trainer);
        let names: Vec<&str> = marks.iter().map(|m| m["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["backward", "ddp finish"].repeat(STEPS), "{names:?}");
        // Overlap is visible: a bucket's all-reduce starts before its step's backward
        // span ends (the first bucket is ready after the first gradient).
        for step in 0..STEPS {
            let backward = marks[2 * step];
            let end = backward["ts"].as_f64().unwrap() + backward["dur"].as_f64().unwrap();
            let first = buckets[step * BUCKETS]["ts"].as_f64().unwrap();
            assert!(
                first < end,
                "step {step}: bucket 0 started after backward ended"
            );
        }
        // Each bucket is also a collective span on the group's row.
        let calls = spans(&events, rank, row(&events, rank, "collectives").unwrap());
        let bucket_calls = calls
            .iter()
            .filter(|c| c["name"] == "all_reduce" && c["args"]["bytes"] == 1024)
            .count();
        assert_eq!(bucket_calls, STEPS * BUCKETS);
    }
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_a_trace_directory_nothing_is_written() {
    if std::env::var_os("RINGCCL_TRACE").is_some_and(|v| !v.is_empty()) {
        eprintln!("skipped: RINGCCL_TRACE is set in this test's environment");
        return;
    }
    let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))
        .unwrap();
    assert!(pg.trace_file().is_none());
    assert!(!pg.trace_span("trainer", "x").is_on());
}

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
