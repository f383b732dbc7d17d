//! The diagnosis on synthetic dumps: each case it must name, incomplete evidence, odd
//! files, and arbitrary dumps (never a panic).

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use ringccl::flight::beacon::Beacon;
use ringccl::flight::dump::{FlightDump, FlightEntry};

/// Call `k` is issued at `T0 + k` s and, when finished, ends 500 µs later.
const T0: u64 = 1_700_000_000_000_000;
const SECOND: u64 = 1_000_000;
const AR: &str = "all_reduce(sum, 1024 x f32)";

fn at(call: u64) -> u64 {
    T0 + call * SECOND
}

/// One entry, built through JSON so that fields the format may gain keep their defaults.
fn entry(call: u64, op: Option<u64>, desc: &str, state: &str) -> FlightEntry {
    let kind = desc.split('(').next().unwrap_or(desc);
    let finished = matches!(state, "done" | "failed");
    serde_json::from_value(json!({
        "call": call, "op": op, "kind": kind, "description": desc,
        "dtype": "f32", "count": 1024, "reduce_op": "sum", "root": null,
        "algorithm": "ring", "state": state,
        "issued_us": at(call), "started_us": op.map(|_| at(call)),
        "ended_us": finished.then(|| at(call) + 500),
        "peers": [], "blocked_on": null,
        "error": (state == "failed").then_some("the group broke"),
    }))
    .expect("a valid entry")
}

/// Calls 1..=n, each collective op #k = call k, done.
fn done(n: u64, desc: &str) -> Vec<FlightEntry> {
    (1..=n).map(|k| entry(k, Some(k), desc, "done")).collect()
}

fn running(call: u64, desc: &str, blocked_on: Option<usize>) -> FlightEntry {
    let mut e = entry(call, Some(call), desc, "running");
    e.blocked_on = blocked_on;
    e
}

fn failed(call: u64, desc: &str, error: &str) -> FlightEntry {
    let mut e = entry(call, Some(call), desc, "failed");
    e.error = Some(error.into());
    e
}

fn dump(rank: usize, world: usize, entries: Vec<FlightEntry>) -> FlightDump {
    let mut d = FlightDump::empty(rank, world, "main", "requested");
    d.pid = 1000 + rank as u32;
    d.dumped_at_us = at(29);
    d.recorded = entries.len() as u64;
    d.entries = entries;
    d
}

fn with(mut entries: Vec<FlightEntry>, more: FlightEntry) -> Vec<FlightEntry> {
    entries.push(more);
    entries
}

fn evidence(dumps: Vec<FlightDump>) -> Evidence {
    let mut e = Evidence::at(at(29) + 500);
    e.dumps = dumps;
    e
}

fn exit(status: &str, at_us: u64) -> RankProcess {
    RankProcess::Exited(RankExit {
        status: status.into(),
        success: false,
        at_us,
    })
}

fn launcher(entries: &[(usize, RankProcess)]) -> Option<BTreeMap<usize, RankProcess>> {
    Some(entries.iter().cloned().collect())
}

#[test]
fn a_skipped_collective_names_the_idle_rank_through_the_ring_of_waits() {
    // Ring all-reduce without rank 2: 3 waits for 2, 0 for 3, 1 for 0.
    let d = diagnose(&evidence(vec![
        dump(0, 4, with(done(16, AR), running(17, AR, Some(3)))),
        dump(1, 4, with(done(16, AR), running(17, AR, Some(0)))),
        dump(2, 4, done(16, AR)),
        dump(3, 4, with(done(16, AR), running(17, AR, Some(2)))),
    ]));
    let lines = d.lines();
    assert_eq!(
        lines[0],
        "ranks 0, 1, 3 wait in op #17 all_reduce(sum, 1024 x f32) for rank 2; rank 2 last \
         finished op #16 and has issued nothing since (last seen 13.0 s ago)"
    );
    assert!(
        lines.contains(&"  rank 0 waits for 3, 3 for 2".to_string()),
        "{lines:#?}"
    );
    assert!(lines.contains(&"  rank 1 waits for 0, 0 for 3, 3 for 2".to_string()));
    assert!(d.found_cause());
    assert_eq!(d.groups[0].findings.len(), 1, "{lines:#?}");
}

#[test]
fn waiters_that_name_no_peer_still_point_at_the_rank_behind() {
    let mut alive = Evidence::at(at(29) + 500);
    alive.dumps = vec![
        dump(0, 3, with(done(4, AR), running(5, AR, None))),
        dump(1, 3, with(done(4, AR), running(5, AR, None))),
        dump(2, 3, done(4, AR)),
    ];
    alive.launcher = launcher(&[
        (0, RankProcess::Running),
        (1, RankProcess::Running),
        (2, RankProcess::Running),
    ]);
    let d = diagnose(&alive);
    let lines = d.lines();
    assert!(
        lines[0].starts_with(
            "ranks 0, 1 wait in op #5 all_reduce(sum, 1024 x f32) for rank 2; rank 2 last \
             finished op #4 and has issued nothing since (last seen 25.0 s ago)"
        ),
        "{lines:#?}"
    );
    assert!(
        lines[1].contains("rank 2's process is running"),
        "{lines:#?}"
    );
}

#[test]
fn a_different_collective_at_the_same_op_names_both_calls() {
    let bc = "broadcast(root=0, 1024 x f32)";
    let d = diagnose(&evidence(vec![
        dump(0, 3, with(done(4, AR), running(5, AR, Some(1)))),
        dump(1, 3, with(done(4, AR), running(5, bc, Some(0)))),
        dump(2, 3, with(done(4, AR), running(5, AR, Some(1)))),
    ]));
    assert_eq!(
        d.headline(),
        "rank 1 is in op #5 broadcast(root=0, 1024 x f32) but ranks 0, 2 are in op #5 \
         all_reduce(sum, 1024 x f32)"
    );
    assert!(matches!(
        d.first_finding(),
        Some(Finding::Mismatch { op: 5, .. })
    ));
}

#[test]
fn mismatched_sizes_in_a_broken_group_are_named_from_the_failed_calls() {
    let small = "all_reduce(sum, 512 x f32)";
    let error = "rank 1 is in op #3 all_reduce(sum, 512 x f32) but rank 0 is in op #3 ...";
    let d = diagnose(&evidence(vec![
        dump(0, 3, with(done(2, AR), failed(3, AR, error))),
        dump(1, 3, with(done(2, AR), failed(3, small, error))),
        dump(2, 3, with(done(2, AR), failed(3, AR, error))),
    ]));
    let lines = d.lines();
    assert_eq!(
        lines[0],
        "rank 1 is in op #3 all_reduce(sum, 512 x f32) but ranks 0, 2 are in op #3 \
         all_reduce(sum, 1024 x f32)"
    );
    // The failed calls at the mismatched op are not listed again.
    assert_eq!(d.groups[0].findings.len(), 1, "{lines:#?}");
    assert!(d.found_cause());
}

#[test]
fn a_rank_that_died_of_a_mismatch_waits_no_more() {
    // Rank 1's dump, written as its group broke, shows its call still running.
    let small = "all_reduce(sum, 512 x f32)";
    let mut e = evidence(vec![
        dump(0, 3, with(done(4, AR), running(5, AR, Some(1)))),
        dump(1, 3, with(done(4, AR), running(5, small, Some(0)))),
        dump(2, 3, with(done(4, AR), running(5, AR, Some(0)))),
    ]);
    e.launcher = launcher(&[
        (0, RankProcess::Running),
        (1, exit("exit code 1", e.now_us - SECOND)),
        (2, RankProcess::Running),
    ]);
    let lines = diagnose(&e).lines();
    assert_eq!(
        lines,
        [
            "rank 1 is in op #5 all_reduce(sum, 512 x f32) but ranks 0, 2 are in op #5 \
             all_reduce(sum, 1024 x f32)",
            "ranks 0, 2 wait in op #5 all_reduce(sum, 1024 x f32) for rank 1; rank 1 exited \
             (exit code 1) 1.0 s ago, in op #5 all_reduce(sum, 512 x f32)",
            "  rank 2 waits for 0, 0 for 1",
        ]
    );
}

#[test]
fn a_dead_rank_is_named_with_its_exit_status() {
    let mut e = evidence(vec![
        dump(0, 3, with(done(16, AR), running(17, AR, Some(2)))),
        dump(1, 3, with(done(16, AR), running(17, AR, Some(0)))),
    ]);
    e.launcher = launcher(&[
        (0, RankProcess::Running),
        (1, RankProcess::Running),
        (2, exit("exit code 3", e.now_us - 4 * SECOND)),
    ]);
    let d = diagnose(&e);
    assert_eq!(
        d.headline(),
        "ranks 0, 1 wait in op #17 all_reduce(sum, 1024 x f32) for rank 2; rank 2 exited \
         (exit code 3) 4.0 s ago"
    );
    // Named once: no separate "rank 2 exited" finding, no "no dump from rank 2" line.
    assert_eq!(
        d.lines()[1..],
        ["  rank 1 waits for 0, 0 for 2"],
        "{:#?}",
        d.lines()
    );
    // Its beacon, left behind, tells how far it got.
    e.beacons.push(BeaconReading {
        rank: 2,
        beacon: Beacon {
            pid: 1002,
            issued: 16,
            finished: 16,
            last_finished_us: at(16),
            ..Beacon::default()
        },
    });
    assert!(diagnose(&e)
        .headline()
        .ends_with("rank 2 exited (exit code 3) 4.0 s ago; it had finished 16 calls"));
}

#[test]
fn a_rank_killed_inside_a_call_is_named_with_the_signal_and_the_call() {
    let mut e = evidence(vec![
        dump(
            0,
            2,
            with(done(6, AR), failed(7, AR, "peer 1 closed the connection")),
        ),
        dump(1, 2, with(done(6, AR), running(7, AR, Some(0)))),
    ]);
    e.launcher = launcher(&[
        (0, RankProcess::Running),
        (
            1,
            exit("killed by signal 9 (SIGKILL)", e.now_us - 2 * SECOND),
        ),
    ]);
    let d = diagnose(&e);
    assert_eq!(
        d.headline(),
        "rank 0 failed in op #7 all_reduce(sum, 1024 x f32): peer 1 closed the connection; \
         rank 1 exited (killed by signal 9 (SIGKILL)) 2.0 s ago, in op #7 all_reduce(sum, \
         1024 x f32)"
    );
}

#[test]
fn a_broken_group_with_a_dead_rank_blames_the_dead_rank() {
    let mut e = evidence(vec![
        dump(0, 3, with(done(2, AR), failed(3, AR, "rank 0 lost peer 1"))),
        dump(2, 3, with(done(2, AR), failed(3, AR, "rank 2 lost peer 1"))),
    ]);
    e.launcher = launcher(&[
        (0, exit("exit code 101", e.now_us)),
        (1, exit("exit code 3", e.now_us - SECOND)),
        (2, RankProcess::Running),
    ]);
    let d = diagnose(&e);
    let lines = d.lines();
    assert_eq!(
        lines[0],
        "ranks 0, 2 failed in op #3 all_reduce(sum, 1024 x f32): rank 0 lost peer 1; rank 1 \
         exited (exit code 3) 1.0 s ago",
        "{lines:#?}"
    );
    // Rank 0's own failed exit is listed after.
    assert!(
        lines[1].starts_with("rank 0 exited (exit code 101)"),
        "{lines:#?}"
    );
}

#[test]
fn a_chain_of_waits_ends_at_the_rank_in_compute() {
    let d = diagnose(&evidence(vec![
        dump(0, 3, with(done(4, AR), running(5, AR, Some(1)))),
        dump(1, 3, with(done(4, AR), running(5, AR, Some(2)))),
        dump(2, 3, done(4, AR)),
    ]));
    let lines = d.lines();
    assert!(
        lines[0].starts_with("ranks 0, 1 wait in op #5 all_reduce(sum, 1024 x f32) for rank 2; rank 2 last finished op #4"),
        "{lines:#?}"
    );
    assert_eq!(lines[1], "  rank 0 waits for 1, 1 for 2");
}

#[test]
fn a_rank_busy_inside_a_call_is_named() {
    let d = diagnose(&evidence(vec![
        dump(0, 2, with(done(4, AR), running(5, AR, Some(1)))),
        dump(1, 2, with(done(4, AR), running(5, AR, None))),
    ]));
    assert_eq!(
        d.headline(),
        "rank 0 waits in op #5 all_reduce(sum, 1024 x f32) for rank 1; rank 1 is in op #5 \
         all_reduce(sum, 1024 x f32) but not waiting for any peer (in it for 24.0 s)"
    );
}

#[test]
fn ranks_waiting_for_each_other_are_named_as_a_circle() {
    let send = "send(tag=0, 4 x f32)";
    let recv = "recv(tag=0, 4 x f32)";
    let mut a = entry(1, Some(1), send, "running");
    a.blocked_on = Some(1);
    let mut b = entry(1, Some(1), recv, "running");
    b.blocked_on = Some(0);
    let d = diagnose(&evidence(vec![dump(0, 2, vec![a]), dump(1, 2, vec![b])]));
    assert_eq!(
        d.headline(),
        "ranks 0, 1 wait for each other: rank 0 in call #1 send(tag=0, 4 x f32) for rank 1, \
         rank 1 in call #1 recv(tag=0, 4 x f32) for rank 0"
    );
    // Point-to-point numbers are per pair: different calls at "op 1" are no mismatch.
    assert!(!d.lines().iter().any(|l| l.contains(" but ")));
}

#[test]
fn no_call_in_flight_is_no_hang() {
    let d = diagnose(&evidence(vec![
        dump(0, 2, done(20, AR)),
        dump(1, 2, done(20, AR)),
    ]));
    assert!(!d.found_cause());
    assert_eq!(
        d.headline(),
        "no hang: no rank has a call in flight; the last call to finish was rank 0's op #20 \
         all_reduce(sum, 1024 x f32), 9.0 s ago"
    );
}

#[test]
fn nothing_at_all_finds_nothing() {
    let d = diagnose(&Evidence::at(0));
    assert!(!d.found_cause());
    assert_eq!(d.lines(), ["no flight dump or beacon was found"]);
}

#[test]
fn a_rank_without_a_dump_is_named_when_others_wait_for_it_and_listed_otherwise() {
    let d = diagnose(&evidence(vec![
        dump(0, 4, with(done(4, AR), running(5, AR, Some(2)))),
        dump(1, 4, with(done(4, AR), running(5, AR, Some(0)))),
    ]));
    let lines = d.lines();
    assert_eq!(
        lines[0],
        "ranks 0, 1 wait in op #5 all_reduce(sum, 1024 x f32) for rank 2; there is no flight \
         dump from rank 2"
    );
    assert!(d.found_cause());
    assert_eq!(
        lines.last().unwrap(),
        "  no flight dump from rank 3",
        "{lines:#?}"
    );
}

#[test]
fn a_beacon_stands_in_for_a_missing_dump() {
    let mut e = evidence(vec![dump(
        0,
        2,
        with(done(16, AR), running(17, AR, Some(1))),
    )]);
    e.beacons.push(BeaconReading {
        rank: 1,
        beacon: Beacon {
            pid: 1001,
            issued: 16,
            finished: 16,
            last_finished_us: at(16),
            ..Beacon::default()
        },
    });
    assert_eq!(
        diagnose(&e).headline(),
        "rank 0 waits in op #17 all_reduce(sum, 1024 x f32) for rank 1; rank 1 finished 16 \
         calls and has issued nothing since (last seen 13.0 s ago) (from its beacon; its dump \
         is missing)"
    );
}

#[test]
fn on_several_nodes_only_the_local_ranks_are_covered() {
    let mut e = evidence(vec![
        dump(2, 4, with(done(4, AR), running(5, AR, Some(1)))),
        dump(3, 4, with(done(4, AR), running(5, AR, Some(2)))),
    ]);
    e.launcher = launcher(&[(2, RankProcess::Running), (3, RankProcess::Running)]);
    let d = diagnose(&e);
    let lines = d.lines();
    assert_eq!(
        lines[0],
        "ranks 2, 3 wait in op #5 all_reduce(sum, 1024 x f32) for rank 1; rank 1 runs on \
         another node (not seen from here)"
    );
    assert_eq!(d.local_ranks.as_deref(), Some(&[2, 3][..]));
    assert!(lines
        .iter()
        .any(|l| l.starts_with("  this covers the ranks started on this node (2, 3) only;")));
    assert!(
        !lines.iter().any(|l| l.contains("no flight dump")),
        "{lines:#?}"
    );
}

#[test]
fn formed_groups_are_diagnosed_on_their_own() {
    let mut sub0 = dump(0, 2, with(done(1, AR), running(2, AR, Some(1))));
    sub0.group = "group/0/1/".into();
    let mut sub1 = dump(1, 2, done(1, AR));
    sub1.group = "group/0/1/".into();
    let d = diagnose(&evidence(vec![
        dump(0, 2, done(3, AR)),
        dump(1, 2, done(3, AR)),
        sub0,
        sub1,
    ]));
    assert_eq!(d.groups.len(), 2);
    assert!(
        d.headline().starts_with(
            "in group group/0/1/: rank 0 waits in op #2 all_reduce(sum, 1024 x f32) for rank 1"
        ),
        "{}",
        d
    );
}

/// A fresh directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ringccl-diag-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn odd_files_are_reported_and_skipped_never_a_panic() {
    let dir = Scratch::new("odd");
    let write = |name: &str, bytes: &[u8]| fs::write(dir.0.join(name), bytes).unwrap();
    let good = dump(2, 4, with(done(4, AR), running(5, AR, Some(3))));
    write("rank-0.json", b"{ not json");
    let mut future = serde_json::to_value(dump(1, 4, done(1, AR))).unwrap();
    future["format"] = json!(ringccl::flight::FORMAT_VERSION + 1);
    write("rank-1.json", future.to_string().as_bytes());
    write(
        "rank-2.json",
        serde_json::to_string(&good).unwrap().as_bytes(),
    );
    write(
        "rank-3.json",
        serde_json::to_string(&dump(5, 9, vec![]))
            .unwrap()
            .as_bytes(),
    );
    write("rank-4.json", b"");
    write("rank-5.json", br#"{"format": 1, "rank": "x"}"#);
    let mut huge = dump(7, 4, vec![]);
    huge.world_size = usize::MAX;
    write(
        "rank-7.json",
        serde_json::to_string(&huge).unwrap().as_bytes(),
    );
    write("rank-8.json", &[0xff, 0xfe, 0x00]);
    write("rank-0.beacon", &[1, 2, 3]);
    write("rank-1.beacon", &[0; 64]);
    write(".rank-2.json.4.0.tmp", b"half a fi");
    write("rank-x.json", b"ignored");
    fs::create_dir(dir.0.join("rank-6.json")).unwrap();

    let e = load_dir(&dir.0, at(29) + 500, 0).unwrap();
    assert_eq!(e.dumps, [good]);
    let notes = e.notes.join("\n");
    for name in [
        "rank-0.json",
        "rank-1.json",
        "rank-3.json",
        "rank-4.json",
        "rank-5.json",
        "rank-6.json",
        "rank-7.json",
        "rank-8.json",
        "rank-0.beacon",
        "rank-1.beacon",
    ] {
        assert!(notes.contains(name), "no note on {name}: {notes}");
    }
    let future = format!("format {}", ringccl::flight::FORMAT_VERSION + 1);
    assert!(notes.contains(&future), "{notes}");
    assert!(
        !notes.contains("tmp") && !notes.contains("rank-x"),
        "{notes}"
    );
    let d = diagnose(&e);
    let text = d.to_string();
    assert!(text.starts_with("rank 2 waits in op #5"), "{text}");
    assert!(
        text.contains(&format!("rank-1.json has dump {future}")),
        "{text}"
    );
    assert!(load_dir(&dir.0.join("missing"), 0, 0).is_err());
}

#[test]
fn dumps_of_an_earlier_run_are_skipped() {
    let dir = Scratch::new("stale");
    let mut old = dump(0, 2, done(3, AR));
    old.dumped_at_us = at(1);
    fs::write(
        dir.0.join("rank-0.json"),
        serde_json::to_string(&old).unwrap(),
    )
    .unwrap();
    let e = load_dir(&dir.0, at(29), at(2)).unwrap();
    assert!(e.dumps.is_empty());
    assert!(
        e.notes[0].contains("before this run started"),
        "{:?}",
        e.notes
    );
    assert_eq!(load_dir(&dir.0, at(29), 0).unwrap().dumps.len(), 1);
}

fn arbitrary_entry() -> impl Strategy<Value = FlightEntry> {
    let states = prop_oneof![
        Just("queued"),
        Just("running"),
        Just("done"),
        Just("failed")
    ];
    let descs = prop_oneof![
        Just(AR),
        Just("barrier"),
        Just("send(tag=1, 4 x f32)"),
        Just("")
    ];
    (
        1u64..12,
        proptest::option::of(0u64..12),
        descs,
        states,
        proptest::option::of(0usize..9),
    )
        .prop_map(|(call, op, desc, state, blocked)| {
            let mut e = entry(call, op, desc, state);
            e.blocked_on = blocked;
            e
        })
}

proptest! {
    #[test]
    fn arbitrary_dumps_give_a_diagnosis_without_panicking(
        world in 1usize..7,
        ranks in proptest::collection::vec(
            (0usize..8, proptest::collection::vec(arbitrary_entry(), 0..8)), 0..8),
        exits in proptest::collection::vec((0usize..8, any::<bool>()), 0..4),
        now in any::<u64>(),
    ) {
        let mut e = Evidence::at(now);
        for (rank, entries) in ranks {
            e.dumps.push(dump(rank % world, world, entries));
        }
        if !exits.is_empty() {
            e.launcher = Some(exits.into_iter().map(|(r, ok)| {
                let process = if ok { RankProcess::Running } else { exit("exit code 1", now / 2) };
                (r, process)
            }).collect());
        }
        let d = diagnose(&e);
        let lines = d.lines();
        prop_assert!(!lines.is_empty());
        prop_assert!(lines.iter().all(|l| !l.is_empty()));
    }
}

/// Under NCCL, device DDP hands its all-reduces to the GPU without a wait: a rank whose
/// bucket is stuck there shows it `on_device`, with later host work done or not. Such
/// ranks wait in that op as much as a rank blocked on the host does.
#[test]
fn a_call_left_on_the_device_counts_as_the_call_a_rank_waits_in() {
    let on_device = |call| entry(call, Some(call), AR, "on_device");
    let d = diagnose(&evidence(vec![
        dump(0, 3, with(done(8, AR), on_device(9))),
        dump(1, 3, with(done(8, AR), on_device(9))),
        dump(2, 3, done(8, AR)),
    ]));
    let lines = d.lines();
    assert!(
        lines[0].starts_with(
            "ranks 0, 1 wait in op #9 all_reduce(sum, 1024 x f32) for rank 2; rank 2 last \
             finished op #8"
        ),
        "{lines:#?}"
    );
}

#[test]
fn dumps_of_format_1_are_still_read() {
    let dir = std::env::temp_dir().join(format!("ringccl-format1-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let mut value = serde_json::to_value(dump(0, 1, done(2, AR))).unwrap();
    value["format"] = json!(1);
    let path = dir.join("rank-0.json");
    fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
    let read = super::load::read_dump(&path);
    fs::remove_dir_all(&dir).ok();
    assert_eq!(read.map(|d| d.entries.len()), Ok(2));
}

/// Ranks 0 and 1 timed out waiting (0 for 1, 1 for 2) and exited; rank 2 is alive and
/// idle. The exited ranks' last dumps are final records of their waits, so the diagnosis
/// names rank 2, live as offline. A rank that a peer's abort stopped only reacted: it
/// passes the chain on, starts none.
#[test]
fn ranks_that_timed_out_and_exited_still_point_at_the_rank_they_waited_for() {
    let broke = |rank, reason: &str, entries| {
        let mut d = dump(rank, 3, entries);
        d.reason = reason.into();
        d
    };
    let timed_out = "timeout: rank 0: timed out after 3s in op #5 …";
    let reacted = "group broken: rank 0 aborted the group: rank 0: timed out … (seen by rank 1)";
    for (second, waiters) in [(timed_out, "ranks 0, 1 wait"), (reacted, "rank 0 waits")] {
        let mut live = evidence(vec![
            broke(0, timed_out, with(done(4, AR), running(5, AR, Some(1)))),
            broke(1, second, with(done(4, AR), running(5, AR, Some(2)))),
            dump(2, 3, done(4, AR)),
        ]);
        let offline = live.clone();
        live.launcher = launcher(&[
            (0, exit("exit code 1", at(28))),
            (1, exit("exit code 1", at(28))),
            (2, RankProcess::Running),
        ]);
        let culprit = format!(
            "{waiters} in op #5 all_reduce(sum, 1024 x f32) for rank 2; rank 2 last finished \
             op #4 and has issued nothing since"
        );
        for (how, evidence) in [("live", &live), ("offline", &offline)] {
            let lines = diagnose(evidence).lines();
            assert!(lines[0].starts_with(&culprit), "{how}: {lines:#?}");
            assert!(
                lines.contains(&"  rank 0 waits for 1, 1 for 2".to_string()),
                "{how}: {lines:#?}"
            );
        }
    }
    // A rank that died of its own error (a mismatch it found) ends a chain, as a rank
    // that exited.
    let mut mismatch = evidence(vec![
        broke(0, reacted, with(done(4, AR), running(5, AR, Some(1)))),
        broke(
            1,
            "group broken: rank 1 is in op #5 … but rank 0 is in op #5 …",
            with(done(4, AR), running(5, AR, Some(0))),
        ),
    ]);
    mismatch.launcher = launcher(&[
        (0, exit("exit code 1", at(28))),
        (1, exit("exit code 1", at(28))),
    ]);
    let lines = diagnose(&mismatch).lines();
    assert!(
        !lines.iter().any(|l| l.contains("wait")),
        "exited ranks that waited on their own account only: {lines:#?}"
    );
}
