use std::fs;
use std::time::Duration;

use super::*;
use crate::flight::beacon::Beacon;
use ringccl_collectives::control::Probe;
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::{CollectiveKind, DType, ReduceOp};

/// A recorder of rank 1 of 4, watching a group whose probe the test drives as the
/// runner and the engine would.
fn recorder(entries: usize) -> Arc<FlightRecorder> {
    let recorder = FlightRecorder::new(
        1,
        4,
        "gloo",
        FlightConfig {
            entries,
            transport: "memory",
            ..FlightConfig::default()
        },
    );
    let control = GroupControl::new(1);
    control.probe().size_for(4);
    recorder.watch(&control);
    recorder
}

/// The probe of the group `recorder` watches.
fn probe(recorder: &FlightRecorder) -> &Probe {
    recorder.control.get().expect("watching a group").probe()
}

/// Call `seq` of `sequence` starts, numbered by the runner first.
fn start(recorder: &FlightRecorder, sequence: Sequence, seq: u64) {
    probe(recorder).numbered(sequence, seq);
    recorder.start(sequence, seq);
}

/// A temporary directory for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ringccl-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn timeout_error() -> Error {
    Error::Timeout {
        rank: 1,
        peer: 2,
        op: OpDesc::barrier(1),
        moved: 0,
        expected: 64,
        timeout: Duration::from_secs(1),
        gone: Vec::new(),
        cause: None,
    }
}

#[test]
fn a_call_goes_from_queued_to_running_to_done_with_its_bytes_per_peer() {
    let recorder = recorder(8);
    let call = recorder.issued("all_reduce");
    assert_eq!(recorder.snapshot("r").entries[0].state, CallState::Queued);
    recorder.turn(call, false);
    start(&recorder, Sequence::Collective, 17);
    probe(&recorder).begin(
        OpDesc::all_reduce(17, DType::F32, 1024, ReduceOp::Sum),
        Algorithm::Ring,
    );
    probe(&recorder).sent(2, 2048);
    probe(&recorder).received(0, 1000);
    probe(&recorder).blocked_on(0, 3048);
    recorder.blocked_on(0);

    let running = recorder.snapshot("requested").entries.remove(0);
    assert_eq!(running.call, call);
    assert_eq!((running.state, running.op), (CallState::Running, Some(17)));
    assert_eq!(running.kind, "all_reduce");
    assert_eq!(running.description, "all_reduce(sum, 1024 x f32)");
    assert_eq!(
        (
            running.dtype.as_deref(),
            running.reduce_op.as_deref(),
            running.count
        ),
        (Some("f32"), Some("sum"), 1024)
    );
    assert_eq!(running.algorithm.as_deref(), Some("ring"));
    assert_eq!(running.blocked_on, Some(0), "the peer it waits for");
    assert_eq!(
        running.peers,
        [
            PeerBytes {
                peer: 2,
                sent: 2048,
                received: 0
            },
            PeerBytes {
                peer: 0,
                sent: 0,
                received: 1000
            }
        ]
    );
    assert!(running.started_us.is_some() && running.ended_us.is_none());

    probe(&recorder).received(0, 1048);
    probe(&recorder).end();
    recorder.finish(None);
    let done = recorder.snapshot("requested").entries.remove(0);
    assert_eq!(done.state, CallState::Done);
    assert_eq!(done.blocked_on, None, "a finished call waits for nobody");
    assert_eq!(done.peers[1].received, 2048);
    let (issued, started, ended) = (
        done.issued_us,
        done.started_us.unwrap_or(0),
        done.ended_us.unwrap_or(0),
    );
    assert!(issued > 0 && issued <= started && started <= ended);
}

#[test]
fn failures_are_recorded_with_their_error_whether_run_refused_or_given_up() {
    let recorder = recorder(8);
    start(&recorder, Sequence::SentTo(3), 1);
    probe(&recorder).begin(
        OpDesc::new(1, CollectiveKind::SendRecv, DType::U8, 5, None, Some(9)),
        Algorithm::Direct,
    );
    recorder.finish(Some(&timeout_error()));
    let given_up = recorder.issued("barrier");
    recorder.gave_up(given_up, &"queued past its deadline");
    let refused = recorder.issued("broadcast");
    recorder.turn(refused, false);
    recorder.refused(Sequence::Collective, &timeout_error());
    // A give-up that comes after the call ran changes nothing.
    recorder.gave_up(1, &"too late");

    let entries = recorder.snapshot("requested").entries;
    let send = &entries[0];
    assert_eq!(
        send.kind, "send",
        "a call from no issuer is named by its sequence"
    );
    assert_eq!(send.root, Some(3), "point-to-point: the peer");
    assert_eq!(send.state, CallState::Failed);
    assert!(send
        .error
        .as_deref()
        .is_some_and(|e| e.contains("timed out")));
    assert_eq!(
        (entries[1].state, entries[1].error.as_deref()),
        (CallState::Failed, Some("queued past its deadline"))
    );
    assert_eq!(
        (entries[2].call, entries[2].state),
        (refused, CallState::Failed)
    );
    assert!(entries[2].started_us.is_none());
    assert_eq!(entries.len(), 3);
}

#[test]
fn the_recorder_keeps_its_last_calls_and_counts_them_all() {
    let recorder = recorder(3);
    for seq in 1..=5 {
        let call = recorder.issued("barrier");
        recorder.turn(call, false);
        start(&recorder, Sequence::Collective, seq);
        probe(&recorder).begin(OpDesc::barrier(seq), Algorithm::Dissemination);
        recorder.finish(None);
    }
    let dump = recorder.snapshot("requested");
    assert_eq!((dump.capacity, dump.recorded), (3, 5));
    let ops: Vec<_> = dump.entries.iter().map(|e| e.op).collect();
    assert_eq!(ops, [Some(3), Some(4), Some(5)]);
    assert!(dump.entries.iter().all(|e| e.state == CallState::Done));
    assert_eq!(dump.entries[2].description, "barrier");
}

#[test]
fn a_second_call_in_one_turn_gets_an_entry_of_its_own() {
    let recorder = recorder(8);
    let call = recorder.issued("all_gather");
    recorder.turn(call, false);
    recorder.start(Sequence::Collective, 1);
    recorder.finish(None);
    recorder.start(Sequence::Collective, 2);
    recorder.finish(None);
    let entries = recorder.snapshot("requested").entries;
    assert_eq!(entries.len(), 2);
    assert_eq!(
        (entries[0].call, entries[0].kind.as_str()),
        (1, "all_gather")
    );
    assert_eq!(
        (entries[1].call, entries[1].kind.as_str()),
        (2, "collective")
    );
}

#[test]
fn a_break_dumps_once_with_the_call_running_and_keeps_the_beacon() {
    let dir = TempDir::new("flight-break");
    let recorder = FlightRecorder::new(
        0,
        2,
        "gloo",
        FlightConfig {
            dir: Some(dir.0.clone()),
            group: "group/0/1/".into(),
            transport: "tcp",
            ..FlightConfig::default()
        },
    );
    recorder.watch(&GroupControl::new(0));
    let beacon_path = dir.0.join("rank-0.group-0-1.beacon");
    assert_eq!(recorder.beacon_path(), Some(beacon_path.as_path()));
    let call = recorder.issued("all_reduce");
    recorder.turn(call, false);
    start(&recorder, Sequence::Collective, 1);
    probe(&recorder).blocked_on(1, 0);
    recorder.blocked_on(1);
    let beacon = Beacon::decode(&fs::read(&beacon_path).unwrap()).unwrap();
    assert_eq!(
        (
            beacon.issued,
            beacon.finished,
            beacon.current_op,
            beacon.blocked_on
        ),
        (1, 0, 1, Some(1))
    );

    let error = timeout_error();
    let dump = recorder.break_snapshot(&break_reason(&error));
    recorder.finish(Some(&error));
    assert!(
        recorder.break_snapshot("again").is_none(),
        "one dump per break"
    );
    recorder.write_break(dump);
    let path = dir.0.join("rank-0.group-0-1.json");
    let written: FlightDump = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert!(
        written.reason.starts_with("timeout: "),
        "{}",
        written.reason
    );
    assert_eq!(
        (written.group.as_str(), written.transport.as_str()),
        ("group/0/1/", "tcp")
    );
    assert_eq!(written.entries[0].state, CallState::Running);
    assert_eq!(written.entries[0].blocked_on, Some(1));

    let beacon = Beacon::decode(&fs::read(&beacon_path).unwrap()).unwrap();
    assert_eq!((beacon.finished, beacon.current_op), (1, 0));
    drop(recorder);
    assert!(
        beacon_path.exists(),
        "a broken group leaves its beacon for the diagnosis"
    );
}

#[test]
fn a_clean_group_removes_its_beacon_and_writes_requested_dumps() {
    let dir = TempDir::new("flight-clean");
    let recorder = FlightRecorder::new(
        3,
        4,
        "gloo",
        FlightConfig {
            dir: Some(dir.0.join("nested")),
            ..FlightConfig::default()
        },
    );
    let beacon = dir.0.join("nested/rank-3.beacon");
    assert!(beacon.exists());
    let path = recorder.dump("requested");
    assert_eq!(path, Some(dir.0.join("nested/rank-3.json")));
    assert!(crate::flight::dump_all("requested").contains(&dir.0.join("nested/rank-3.json")));
    drop(recorder);
    assert!(!beacon.exists());
}

#[test]
fn an_entry_stays_small() {
    // The documented memory per kept call ("about 400 bytes").
    let size = std::mem::size_of::<Slot>();
    assert!(size <= 420, "{size} bytes per entry");
}

#[test]
fn a_runner_records_what_it_runs_and_what_it_refuses() {
    use crate::Observers;
    use ringccl_collectives::{
        Backend, BufferMut, Deadline, HostBackend, HostConfig, MemoryConfig, MemoryTransport,
    };
    let soon = || Deadline::after(Duration::from_secs(20));
    let recorders: Vec<_> = (0..2)
        .map(|rank| FlightRecorder::new(rank, 2, "test", FlightConfig::default()))
        .collect();
    let ranks: Vec<_> = MemoryTransport::mesh(2, MemoryConfig::default())
        .into_iter()
        .zip(&recorders)
        .map(|(t, recorder)| {
            let mut backend = HostBackend::new("test", t, HostConfig::default());
            backend.attach_hooks(Arc::new(Observers::new(Some(Arc::clone(recorder)), None)));
            backend
        })
        .collect();
    std::thread::scope(|s| {
        for b in &ranks {
            s.spawn(move || {
                let mut x = vec![1.0f32; 1000];
                b.all_reduce(BufferMut::from_slice(&mut x), ReduceOp::Sum, soon())
                    .unwrap();
            });
        }
    });
    let rank0 = &ranks[0];
    assert!(rank0
        .broadcast(BufferMut::from_slice(&mut [0u8; 4]), 3, soon())
        .is_err());
    let entries = recorders[0].snapshot("requested").entries;
    assert_eq!(entries.len(), 2, "{entries:#?}");
    let all_reduce = &entries[0];
    assert_eq!(
        (all_reduce.state, all_reduce.op),
        (CallState::Done, Some(1))
    );
    assert_eq!(all_reduce.description, "all_reduce(sum, 1000 x f32)");
    assert_eq!(all_reduce.algorithm.as_deref(), Some("recursive_doubling"));
    let with_1 = all_reduce.peers.iter().find(|p| p.peer == 1).copied();
    // Recursive doubling at N=2: the whole buffer each way, plus a frame header.
    assert!(
        with_1.is_some_and(|p| p.sent >= 4000 && p.received >= 4000),
        "{with_1:?}"
    );
    assert_eq!(entries[1].state, CallState::Failed);
    assert!(entries[1]
        .error
        .as_deref()
        .is_some_and(|e| e.contains("out of range")));
}

#[test]
fn a_rank_idle_at_the_break_keeps_its_dump_and_records_the_call_refused_after() {
    let dir = TempDir::new("idle-break");
    let control = GroupControl::new(2);
    let recorder = FlightRecorder::new(
        2,
        3,
        "gloo",
        FlightConfig {
            dir: Some(dir.0.clone()),
            transport: "tcp",
            ..FlightConfig::default()
        },
    );
    recorder.watch(&control);
    recorder.start(Sequence::Collective, 4);
    recorder.finish(None);
    let read = || -> FlightDump {
        let path = recorder.dump_path().unwrap();
        serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
    };

    // Rank 1 aborts while rank 2 runs no call: the request thread's dump shows op #4 only.
    assert!(control.abort(1, "rank 1 is in op #5 ...".into(), None));
    recorder.dump_if_aborted();
    let idle = read();
    assert_eq!(idle.entries.len(), 1);
    assert!(
        idle.reason.contains("rank 1 aborted the group"),
        "{}",
        idle.reason
    );

    // Rank 2 then issues op #5, which the runner refuses: the break's dump stays as the
    // break found the rank (idle, not in op #5), and the refusal is recorded with the
    // number and description the call would have had.
    let call = recorder.issued("all_reduce");
    recorder.turn(call, false);
    assert!(
        recorder.break_snapshot("again").is_none(),
        "one dump per break"
    );
    let op = OpDesc::all_reduce(5, DType::F32, 1024, ReduceOp::Sum);
    let error = Error::GroupAborted {
        rank: 2,
        by: 1,
        reason: "rank 1 is in op #5 ...".into(),
        cause: None,
    };
    recorder.refused_as(Sequence::Collective, 5, Some(op), &error);
    assert_eq!(read().entries.len(), 1);
    let requested = recorder.snapshot("requested");
    let entry = &requested.entries[1];
    assert_eq!(
        (entry.op, entry.description.as_str(), entry.state),
        (Some(5), "all_reduce(sum, 1024 x f32)", CallState::Failed)
    );
}

#[test]
fn a_call_on_the_device_counts_as_finished_only_once_the_device_is_done() {
    let dir = TempDir::new("flight-on-device");
    let recorder = FlightRecorder::new(
        0,
        1,
        "nccl",
        FlightConfig {
            dir: Some(dir.0.clone()),
            transport: "nccl",
            ..FlightConfig::default()
        },
    );
    let beacon_path = recorder.beacon_path().unwrap().to_path_buf();
    let finished = || {
        Beacon::decode(&fs::read(&beacon_path).unwrap())
            .unwrap()
            .finished
    };
    recorder.start(Sequence::Collective, 1);
    let first = recorder.handed_to_device().unwrap();
    recorder.finish(None);
    recorder.start(Sequence::Collective, 2);
    let second = recorder.handed_to_device().unwrap();
    recorder.finish(None);
    // A host call after them is recorded done as usual: the flag is per call.
    recorder.start(Sequence::Collective, 3);
    recorder.finish(None);
    let states = |r: &FlightRecorder| -> Vec<CallState> {
        r.snapshot("requested")
            .entries
            .iter()
            .map(|e| e.state)
            .collect()
    };
    assert_eq!(
        states(&recorder),
        [CallState::OnDevice, CallState::OnDevice, CallState::Done]
    );
    assert_eq!(finished(), 1, "only the host call has finished");
    recorder.device_finished(first, None);
    recorder.device_finished(second, Some(&timeout_error()));
    recorder.device_finished(second, None); // settled already: ignored
    assert_eq!(
        states(&recorder),
        [CallState::Done, CallState::Failed, CallState::Done]
    );
    assert_eq!(finished(), 3);
    let failed = &recorder.snapshot("requested").entries[1];
    assert!(failed.error.as_deref().unwrap_or("").contains("timed out"));
    assert!(failed.ended_us.is_some());
}
