//! Issue 13, the flight recorder: a timeout leaves a dump on every rank that names the
//! stuck op and the peer each rank waits for; beacons move with every call; SIGUSR1
//! makes every rank write its dump.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    child_group, heavy_lock, run_processes_with_env, run_threads_with, GROUP_TIMEOUT, RESULT_PREFIX,
};
use ringccl::flight::beacon::Beacon;
use ringccl::flight::{CallState, FlightDump, WATCH_EVERY};
use ringccl::{AllReduceAlgo, ReduceOp};

/// A directory of its own for one test, removed before and after.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("ringccl-flight-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn read_dump(path: &Path) -> FlightDump {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_beacon(path: &Path) -> Beacon {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Beacon::decode(&bytes).unwrap_or_else(|| panic!("{}: not a beacon", path.display()))
}

/// Ranks 0 and 1 enter an all-reduce that rank 2 skips; they time out (or hear that the
/// other did) after the call's 2 s. Their dumps, written before the call returns, show
/// the all-reduce running and whom each waits for; rank 2, idle, writes its dump when
/// the abort reaches it, showing its last finished op and nothing after it.
#[test]
fn a_timeout_leaves_a_dump_on_every_rank_naming_the_stuck_op_and_whom_it_waits_for() {
    const CALL_TIMEOUT: Duration = Duration::from_secs(2);
    /// Slack for a loaded 2-core machine, on top of the call's own timeout.
    const SLACK: Duration = Duration::from_secs(5);
    let _heavy = heavy_lock();
    let dir = TempDir::new("timeout");
    let path = |rank: usize, ext: &str| dir.path().join(format!("rank-{rank}.{ext}"));
    let outcomes = run_threads_with(
        3,
        GROUP_TIMEOUT,
        |opts| {
            opts.flight_dir(dir.path())
                .all_reduce_algo(AllReduceAlgo::Ring)
        },
        |pg| {
            for _ in 0..3 {
                pg.barrier().expect("barriers before the stuck call");
            }
            let started = Instant::now();
            if pg.rank() == 2 {
                // Skips the all-reduce and waits, idle, for its own dump.
                let mine = path(2, "json");
                while !mine.exists() && started.elapsed() < CALL_TIMEOUT + SLACK * 2 {
                    thread::sleep(Duration::from_millis(20));
                }
                let waited = started.elapsed();
                let later = pg.barrier().err().map(|e| e.to_string());
                return (waited, later);
            }
            let mut buf = vec![1.0f32; 1024];
            let result = pg.all_reduce_with_timeout(&mut buf, ReduceOp::Sum, CALL_TIMEOUT);
            (started.elapsed(), result.err().map(|e| e.to_string()))
        },
    );
    for (rank, (elapsed, error)) in outcomes.iter().enumerate() {
        eprintln!("rank {rank}: after {elapsed:?}: {error:?}");
        assert!(error.is_some(), "rank {rank} should have failed");
        assert!(
            *elapsed <= CALL_TIMEOUT + SLACK,
            "rank {rank} took {elapsed:?} (timeout {CALL_TIMEOUT:?})"
        );
    }
    assert!(
        outcomes[2]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("aborted")),
        "rank 2's next call fails at once: {:?}",
        outcomes[2].1
    );

    let dumps: Vec<FlightDump> = (0..3).map(|rank| read_dump(&path(rank, "json"))).collect();
    assert!(
        dumps[..2].iter().any(|d| d.reason.starts_with("timeout: ")),
        "one of the stuck ranks timed out: {:?}",
        dumps.iter().map(|d| &d.reason).collect::<Vec<_>>()
    );
    // In the ring, rank 0 waits for rank 2's first chunk, and rank 1 for rank 0's second.
    for (rank, waits_for) in [(0, 2), (1, 0)] {
        let dump = &dumps[rank];
        assert_eq!(
            (dump.rank, dump.world_size, dump.transport.as_str()),
            (rank, 3, "tcp")
        );
        assert_eq!(dump.entries.len(), 4, "rank {rank}: {:#?}", dump.entries);
        assert!(dump.entries[..3]
            .iter()
            .all(|e| e.state == CallState::Done && e.kind == "barrier"));
        let stuck = &dump.entries[3];
        assert_eq!(stuck.op, Some(4), "rank {rank}");
        assert_eq!(stuck.description, "all_reduce(sum, 1024 x f32)");
        assert_eq!(stuck.algorithm.as_deref(), Some("ring"));
        assert_eq!(
            stuck.state,
            CallState::Running,
            "rank {rank}: running at the dump"
        );
        assert_eq!(stuck.blocked_on, Some(waits_for), "rank {rank}");
        assert!(stuck.started_us.is_some() && stuck.ended_us.is_none());
    }
    let from_0 = dumps[1].entries[3].peers.iter().find(|p| p.peer == 0);
    assert!(
        from_0.is_some_and(|p| p.received > 0),
        "rank 1 had received rank 0's first chunk: {:?}",
        dumps[1].entries[3].peers
    );
    let idle = &dumps[2];
    assert!(
        idle.reason.starts_with("group broken: rank "),
        "{}",
        idle.reason
    );
    let ops: Vec<_> = idle.entries.iter().map(|e| (e.op, e.state)).collect();
    assert_eq!(
        ops,
        [
            (Some(1), CallState::Done),
            (Some(2), CallState::Done),
            (Some(3), CallState::Done)
        ],
        "rank 2 last finished op #3 and issued nothing since"
    );
    assert!(
        outcomes[2].0 <= CALL_TIMEOUT + SLACK,
        "rank 2's dump came {:?} after the others entered the all-reduce (watched every {WATCH_EVERY:?})",
        outcomes[2].0
    );
    // Broken groups leave their beacons behind for the diagnosis.
    let beacon = read_beacon(&path(0, "beacon"));
    assert_eq!(
        (beacon.issued, beacon.finished, beacon.current_op),
        (4, 4, 0)
    );
}

/// Each rank's beacon counts its calls as they finish, shows the call it is blocked in
/// and on whom, exists for formed groups too, and goes away when a group ends cleanly.
#[test]
fn beacons_advance_with_every_call_and_go_away_with_the_group() {
    let _heavy = heavy_lock();
    let dir = TempDir::new("beacons");
    let beacon = |rank: usize| dir.path().join(format!("rank-{rank}.beacon"));
    let seen_blocked = run_threads_with(
        2,
        GROUP_TIMEOUT,
        |opts| opts.flight_dir(dir.path()),
        |pg| {
            let rank = pg.rank();
            let fresh = read_beacon(&beacon(rank));
            assert_eq!(fresh.pid, u64::from(std::process::id()));
            assert_eq!((fresh.issued, fresh.finished), (0, 0));
            let mut last = 0;
            for call in 1..=3 {
                pg.all_reduce(&mut [1.0f32], ReduceOp::Sum)
                    .expect("all_reduce");
                let now = read_beacon(&beacon(rank));
                assert_eq!((now.issued, now.finished, now.current_op), (call, call, 0));
                assert!(now.last_finished_us >= last && now.blocked_on.is_none());
                last = now.last_finished_us;
            }
            // Rank 1 enters barrier #4 alone; rank 0 watches its beacon until it shows it.
            let mut seen = None;
            if rank == 0 {
                let started = Instant::now();
                loop {
                    let peer = read_beacon(&beacon(1));
                    if peer.current_op == 4 && peer.blocked_on == Some(0) {
                        assert!(peer.current_since_us >= last.saturating_sub(1_000_000));
                        seen = Some(started.elapsed());
                        break;
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(20),
                        "rank 1's beacon never showed barrier #4: {peer:?}"
                    );
                    thread::sleep(Duration::from_millis(5));
                }
            }
            pg.barrier().expect("barrier #4");
            let sub = pg.split(Some(0)).expect("split").expect("a colour");
            let sub_beacon = dir.path().join(format!("rank-{rank}.group-0-0.beacon"));
            assert!(sub_beacon.exists(), "{}", sub_beacon.display());
            sub.barrier().expect("a barrier in the formed group");
            assert_eq!(read_beacon(&sub_beacon).finished, 1);
            pg.barrier()
                .expect("both ranks saw their formed group's beacon");
            drop(sub);
            assert!(!sub_beacon.exists(), "a clean drop removes the beacon");
            seen
        },
    );
    let seen = seen_blocked[0].expect("rank 0 watched");
    eprintln!("rank 1's beacon showed it blocked after {seen:?}");
    assert!(
        !beacon(0).exists() && !beacon(1).exists(),
        "clean groups remove their beacons"
    );
}

const SIGNAL_TEST: &str = "sigusr1_makes_every_rank_write_its_dump_with_the_last_calls_done";

/// Two processes with `RINGCCL_FLIGHT_DIR` and `RINGCCL_FLIGHT_ENTRIES=4` run six calls,
/// then each sends itself SIGUSR1: the dump appears within seconds, reason
/// `"requested"`, with the last four calls, all done.
#[test]
fn sigusr1_makes_every_rank_write_its_dump_with_the_last_calls_done() {
    if let Some(pg) = child_group(SIGNAL_TEST) {
        let dir = PathBuf::from(std::env::var("RINGCCL_FLIGHT_DIR").expect("flight dir"));
        for _ in 0..5 {
            pg.all_reduce(&mut [1.0f32; 4], ReduceOp::Sum)
                .expect("all_reduce");
        }
        pg.barrier().expect("barrier");
        let path = dir.join(format!("rank-{}.json", pg.rank()));
        let started = Instant::now();
        let pid = std::process::id().to_string();
        let sent = Command::new("kill").args(["-USR1", &pid]).status();
        if !sent.as_ref().is_ok_and(|s| s.success()) {
            println!("{RESULT_PREFIX}skipped: cannot run kill: {sent:?}");
            return;
        }
        loop {
            let dump = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<FlightDump>(&b).ok());
            if let Some(dump) = dump.filter(|d| d.reason == "requested") {
                let all_done = dump.entries.iter().all(|e| e.state == CallState::Done);
                let last = dump.entries.last().map_or("none", |e| e.kind.as_str());
                println!(
                    "{RESULT_PREFIX}{} {} {} {all_done} {last}",
                    started.elapsed().as_millis(),
                    dump.entries.len(),
                    dump.recorded
                );
                return;
            }
            if started.elapsed() > Duration::from_secs(20) {
                println!("{RESULT_PREFIX}no dump after 20 s");
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
    let _heavy = heavy_lock();
    let dir = TempDir::new("signal");
    let dir_text = dir.path().to_string_lossy().into_owned();
    let results = run_processes_with_env(
        SIGNAL_TEST,
        2,
        &[
            ("RINGCCL_FLIGHT_DIR", &dir_text),
            ("RINGCCL_FLIGHT_ENTRIES", "4"),
        ],
    );
    for (rank, lines) in results.iter().enumerate() {
        let line = lines
            .first()
            .unwrap_or_else(|| panic!("rank {rank} reported nothing"));
        eprintln!("rank {rank}: {line}");
        if line.starts_with("skipped") {
            eprintln!("skipped: {line}");
            return;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            fields[1..],
            ["4", "6", "true", "barrier"],
            "rank {rank}: {line}"
        );
        let ms: u64 = fields[0].parse().expect("milliseconds");
        assert!(ms < 5_000, "rank {rank}: the dump took {ms} ms");
    }
}
