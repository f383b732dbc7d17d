//! Shared-memory transport specifics: a lost peer is reported, nothing is left behind in
//! /dev/shm, and ranks that disagree about the transport fail within the deadline.

use crate::common;

use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads_with};
use ringccl::{Error, InitOptions, ReduceOp, TransportKind};

const TIMEOUT: Duration = Duration::from_secs(10);
const PROMPT: Duration = Duration::from_secs(20);

fn shm(opts: InitOptions) -> InitOptions {
    opts.transport(TransportKind::SharedMemory)
}

fn ringccl_files() -> usize {
    std::fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("ringccl-"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn lost_peer_is_named_over_shared_memory() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm on this machine");
        return;
    }
    let _guard = heavy_lock();
    let results = run_threads_with(3, TIMEOUT, shm, |pg| {
        if pg.rank() == 2 {
            drop(pg);
            return None;
        }
        let mut buf = vec![1.0f32; 1 << 20];
        let started = Instant::now();
        let first = pg.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        Some((first, started.elapsed(), pg.barrier().unwrap_err()))
    });
    for (rank, r) in results.iter().enumerate().take(2) {
        let (first, elapsed, second) = r.as_ref().unwrap();
        assert!(*elapsed < PROMPT, "rank {rank} took {elapsed:?}");
        assert!(
            matches!(first, Error::PeerLost { .. }),
            "rank {rank}: {first}"
        );
        assert!(
            matches!(second, Error::GroupBroken { .. }),
            "rank {rank}: {second}"
        );
    }
    // Rank 0 receives from rank 2 in the ring, so it must name it. (Rank 1 may see
    // rank 0 leave first, once rank 0 has given up: also a lost peer.)
    assert!(
        matches!(
            results[0].as_ref().unwrap().0,
            Error::PeerLost { rank: 2, .. }
        ),
        "{:?}",
        results[0]
    );
}

#[test]
fn nothing_is_left_in_dev_shm() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm on this machine");
        return;
    }
    let _guard = heavy_lock();
    let before = ringccl_files();
    let during = run_threads_with(4, TIMEOUT, shm, |pg| {
        let mut x = vec![pg.rank() as i32; 1000];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, vec![6; 1000]);
        pg.barrier().unwrap();
        ringccl_files()
    });
    // Once the group is up, the inbox files are already unlinked.
    assert!(
        during.iter().all(|&d| d <= before),
        "{during:?} vs {before}"
    );
    assert_eq!(ringccl_files(), before);
}

#[test]
fn transport_disagreement_fails_within_the_deadline() {
    let _guard = heavy_lock();
    let started = Instant::now();
    let listener = ringccl::StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let results = std::thread::scope(|s| {
        let a = s.spawn(|| {
            ringccl::init_process_group(
                "gloo",
                shm(InitOptions::new(0, 2, &addr))
                    .timeout(Duration::from_secs(2))
                    .store_listener(listener),
            )
            .err()
        });
        let b = s.spawn(|| {
            ringccl::init_process_group(
                "gloo",
                InitOptions::new(1, 2, &addr)
                    .transport(TransportKind::Tcp)
                    .timeout(Duration::from_secs(2)),
            )
            .map(|pg| {
                // The TCP rank is connected; its first collective cannot complete.
                let mut x = [1u8];
                pg.all_reduce(&mut x, ReduceOp::Sum).err()
            })
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    let err = results.0.expect("the shared-memory rank must fail");
    assert!(matches!(err, Error::RendezvousTimeout { .. }), "{err}");
}

#[test]
fn auto_picks_shared_memory_on_one_host_and_tcp_when_asked() {
    let _guard = heavy_lock();
    let auto = |opts: InitOptions| opts.transport(TransportKind::Auto);
    let kinds = run_threads_with(3, TIMEOUT, auto, |pg| {
        let mut x = [pg.rank() as i64 + 1; 5];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, [6; 5]);
        let peers: Vec<&str> = (0..3).map(|p| pg.peer_transport(p)).collect();
        peers.join(",")
    });
    assert_eq!(kinds, ["self,shm,shm", "shm,self,shm", "shm,shm,self"]);
    let tcp = run_threads_with(
        2,
        TIMEOUT,
        |o| o.transport(TransportKind::Tcp),
        |pg| format!("{},{}", pg.peer_transport(0), pg.peer_transport(1)),
    );
    assert_eq!(tcp, ["self,tcp", "tcp,self"]);
}

#[test]
fn rank_0_leaving_right_after_start_up_does_not_break_anyone_elses_start_up() {
    // Rank 0 hosts the store; the others must be done with it before rank 0 can return
    // from start-up (regression: a fast rank 0 used to close the store under them).
    let _guard = heavy_lock();
    let auto = |opts: InitOptions| opts.transport(TransportKind::Auto);
    for _ in 0..5 {
        let joined = run_threads_with(4, TIMEOUT, auto, |pg| {
            let rank = pg.rank();
            drop(pg);
            rank
        });
        assert_eq!(joined, vec![0, 1, 2, 3]);
    }
}

/// Where every pair of ranks shares memory, the barrier runs in it (`shared_counters`):
/// a late rank holds everyone, a rank that leaves before it arrives is named, and a rank
/// in another call is named as a mismatch (by the control plane while this rank waits
/// for it, or from the frame it left once it went on to its next barrier), all well
/// before the deadline.
#[test]
fn the_barrier_in_shared_memory_holds_names_a_lost_rank_and_a_rank_in_another_call() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm on this machine");
        return;
    }
    let _guard = heavy_lock();
    let late = Duration::from_millis(300);
    let times = run_threads_with(3, TIMEOUT, shm, |pg| {
        pg.barrier().unwrap();
        if pg.rank() == 1 {
            std::thread::sleep(late);
        }
        let entered = Instant::now();
        pg.barrier().unwrap();
        let left = Instant::now();
        let flight = pg.flight_recorder().expect("flight recorder on by default");
        let snapshot = flight.snapshot("requested");
        let algorithms: Vec<_> = snapshot
            .entries
            .iter()
            .map(|e| e.algorithm.clone().unwrap_or_default())
            .collect();
        (entered, left, algorithms)
    });
    for (rank, (_, left, algorithms)) in times.iter().enumerate() {
        assert!(
            *left >= times[1].0,
            "rank {rank} left before rank 1 entered"
        );
        assert_eq!(
            algorithms,
            &["shared_counters", "shared_counters"],
            "rank {rank}"
        );
    }

    let lost = run_threads_with(3, TIMEOUT, shm, |pg| {
        if pg.rank() == 2 {
            drop(pg);
            return None;
        }
        let started = Instant::now();
        Some((pg.barrier().unwrap_err(), started.elapsed()))
    });
    for (rank, outcome) in lost.iter().enumerate().take(2) {
        let (error, took) = outcome.as_ref().unwrap();
        eprintln!("lost rank: rank {rank} after {took:?}: {error}");
        // Named as lost (or in the abort of the rank that named it), before the deadline.
        assert!(*took < TIMEOUT, "rank {rank} took {took:?}: {error}");
        assert!(
            matches!(error, Error::PeerLost { .. } | Error::GroupAborted { .. })
                && error.to_string().contains("rank 2"),
            "rank {rank}: {error}"
        );
    }

    // Rank 1's broadcast from itself finishes without rank 0, and its next barrier then
    // counts as an arrival at rank 0's first: the broadcast's frame, still waiting, names
    // the mismatch.
    let outcomes = run_threads_with(2, TIMEOUT, shm, |pg| {
        let mut buf = [1.0f32; 4];
        let first = match pg.rank() {
            0 => pg.barrier(),
            _ => pg.broadcast(&mut buf, 1),
        };
        first.and_then(|()| pg.barrier())
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        let text = match outcome {
            Ok(()) => panic!("rank {rank}: a barrier against a broadcast passed"),
            Err(e) => e.to_string(),
        };
        eprintln!("barrier against a finished broadcast: rank {rank}: {text}");
        assert!(
            text.contains("op #1 barrier") && text.contains("op #1 broadcast"),
            "rank {rank}: {text}"
        );
    }

    // Small all-reduces run in memory too: two that disagree on the count are named
    // (from the headers beside the data, never folded together), and so are two on
    // either side of the in-memory limit (one rank in memory, one sending frames: by the
    // control plane), before the deadline.
    for counts in [[2, 4], [256, 257]] {
        let outcomes = run_threads_with(2, TIMEOUT, shm, |pg| {
            let started = Instant::now();
            let mut buf = vec![1.0f32; counts[pg.rank()]];
            (pg.all_reduce(&mut buf, ReduceOp::Sum), started.elapsed())
        });
        for (rank, (outcome, took)) in outcomes.iter().enumerate() {
            let text = match outcome {
                Ok(()) => panic!("rank {rank}: all-reduces of {counts:?} elements passed"),
                Err(e) => e.to_string(),
            };
            eprintln!("all-reduces of {counts:?} elements: rank {rank} after {took:?}: {text}");
            assert!(*took < TIMEOUT, "rank {rank} took {took:?}: {text}");
            for count in counts {
                let call = format!("all_reduce(sum, {count} x f32)");
                assert!(text.contains(&call), "rank {rank} must name {call}: {text}");
            }
        }
    }

    for (n, other) in [(3, "broadcast"), (3, "all_reduce"), (2, "all_reduce")] {
        let outcomes = run_threads_with(n, TIMEOUT, shm, |pg| {
            let started = Instant::now();
            let mut buf = [1.0f32; 4];
            let result = match (pg.rank(), other) {
                (0, _) => pg.barrier(),
                (_, "broadcast") => pg.broadcast(&mut buf, 0),
                _ => pg.all_reduce(&mut buf, ReduceOp::Sum),
            };
            (result, started.elapsed())
        });
        for (rank, (result, took)) in outcomes.iter().enumerate() {
            let text = match result {
                Ok(()) => panic!("{other}: rank {rank} finished a call that cannot"),
                Err(e) => e.to_string(),
            };
            eprintln!("{n} ranks, {other}: rank {rank} after {took:?}: {text}");
            assert!(*took < PROMPT, "{other}: rank {rank} took {took:?}: {text}");
            assert!(
                text.contains("barrier") && text.contains(other),
                "{other}: rank {rank} must name both calls: {text}"
            );
        }
    }
}
