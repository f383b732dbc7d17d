//! The timeline (`RINGCCL_TRACE` / `InitOptions::trace_dir`): every rank's Chrome trace
//! is valid JSON with exactly one span per collective and the call's arguments; groups
//! formed from a group use rows of their own; DDP marks its buckets and the backward
//! pass; without a trace directory nothing is written.

use crate::common;

use std::time::{Duration, Instant};

use common::timeline::{events, row, spans, trace_dir};
use common::{heavy_lock, run_threads_with, GROUP_TIMEOUT};
use ringccl::ddp::{DdpConfig, DistributedDataParallel, ParamSpec};
use ringccl::{DType, ReduceOp};

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
