//! Every way to get it wrong ends in a clear error within the deadline, never a hang or
//! a panic.

use crate::common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads, run_threads_on};
use ringccl::{init_process_group, Error, InitOptions, ReduceOp, StoreListener};

const SHORT: Duration = Duration::from_secs(2);
/// Upper bound for "failed within the deadline" on a loaded machine.
const PROMPT: Duration = Duration::from_secs(20);

#[test]
fn unknown_backend_lists_the_valid_names() {
    let err = init_process_group("mpi", InitOptions::new(0, 1, "127.0.0.1:0")).unwrap_err();
    assert!(matches!(err, Error::UnknownBackend { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("\"mpi\"") && text.contains("gloo") && text.contains("nccl"),
        "{text}"
    );
}

#[test]
fn backend_names_are_case_insensitive() {
    for name in ["gloo", "GLOO", "Gloo"] {
        let pg = init_process_group(name, InitOptions::new(0, 1, "127.0.0.1:0")).unwrap();
        assert_eq!(pg.backend(), "gloo");
        assert_eq!((pg.rank(), pg.world_size()), (0, 1));
    }
}

#[test]
fn rank_out_of_range_is_rejected() {
    let err = init_process_group("gloo", InitOptions::new(4, 4, "127.0.0.1:1")).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("rank 4"), "{err}");
}

#[test]
fn unreachable_master_fails_within_the_deadline() {
    // A port that was just free: nobody listens there.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let started = Instant::now();
    let err = init_process_group(
        "gloo",
        InitOptions::new(1, 2, &addr.to_string()).timeout(SHORT),
    )
    .unwrap_err();
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    assert!(
        matches!(err, Error::StoreUnreachable { rank: 1, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&addr.to_string()) && text.contains("MASTER_ADDR"),
        "{text}"
    );
}

#[test]
fn silent_master_fails_within_the_deadline() {
    // Something listens but never speaks the store protocol.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let started = Instant::now();
    let err = init_process_group(
        "gloo",
        InitOptions::new(1, 2, &addr.to_string()).timeout(SHORT),
    )
    .unwrap_err();
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    assert!(
        matches!(err, Error::RendezvousTimeout { rank: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

#[test]
fn missing_rank_times_out_naming_it() {
    let _guard = heavy_lock();
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let started = Instant::now();
    // Ranks 0 and 1 of 3 start; rank 2 never does.
    let rank1 = thread::spawn({
        let addr = addr.clone();
        move || init_process_group("gloo", InitOptions::new(1, 3, &addr).timeout(SHORT))
    });
    let err0 = init_process_group(
        "gloo",
        InitOptions::new(0, 3, &addr)
            .timeout(SHORT)
            .store_listener(listener),
    )
    .unwrap_err();
    let err1 = rank1.join().unwrap().unwrap_err();
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    for err in [&err0, &err1] {
        assert!(matches!(err, Error::RendezvousTimeout { .. }), "{err:?}");
    }
    assert!(err0.to_string().contains("rank(s) 2"), "{err0}");
}

#[test]
fn taken_port_is_reported_as_such() {
    let taken = StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let err = init_process_group("gloo", InitOptions::new(0, 2, &addr).timeout(SHORT)).unwrap_err();
    assert!(matches!(err, Error::StoreBind { .. }), "{err:?}");
    assert!(err.to_string().contains("already in use"), "{err}");
}

#[test]
fn strangers_on_the_store_port_do_not_disturb_rendezvous() {
    let _guard = heavy_lock();
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut http = TcpStream::connect(addr).unwrap();
    http.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let _scanner = TcpStream::connect(addr).unwrap(); // connects and says nothing
    let mut oversized = TcpStream::connect(addr).unwrap();
    oversized
        .write_all(b"RCCLSTOR\x02\x00\x00\x00\x02\xff\xff\xff\xff\xff\xff\xff\xff")
        .unwrap();
    let sums = run_threads_on(listener, 3, SHORT * 10, |pg| {
        let mut x = [pg.rank() as f32 + 1.0];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        x[0]
    });
    assert_eq!(sums, vec![6.0; 3]);
}

#[test]
fn mismatched_collectives_are_named_instead_of_hanging() {
    let _guard = heavy_lock();
    let errors = run_threads(2, SHORT * 5, |pg| {
        let mut buf = vec![1.0f32; 1024];
        if pg.rank() == 0 {
            let first = pg.broadcast(&mut buf, 0);
            // Rank 0's broadcast only sends; whatever happens next, report it.
            first.and_then(|()| pg.barrier()).err()
        } else {
            pg.all_reduce(&mut buf, ReduceOp::Sum).err()
        }
    });
    let err1 = errors[1].as_ref().expect("rank 1 must fail");
    match err1 {
        Error::CollectiveMismatch { .. } => assert_eq!(
            err1.to_string().split(':').next().unwrap(),
            "rank 1 is in op #1 all_reduce(sum, 1024 x f32) but rank 0 is in op #1 broadcast(root=0, 1024 x f32)"
        ),
        // Rank 0, already in its barrier, may see rank 1's all-reduce frame and abort the
        // group first; rank 1 then reports rank 0's mismatch.
        Error::GroupAborted { by: 0, reason, .. } => assert!(
            reason.contains("rank 0 is in op #2 barrier") && reason.contains("all_reduce"),
            "{err1}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        errors[0].is_some(),
        "rank 0 must not hang or succeed its barrier"
    );
}

#[test]
fn count_mismatch_is_detected() {
    let _guard = heavy_lock();
    let errors = run_threads(3, SHORT * 5, |pg| {
        let mut buf = vec![1i32; 100 + usize::from(pg.rank() == 2)];
        pg.all_reduce(&mut buf, ReduceOp::Sum).err()
    });
    assert!(
        errors
            .iter()
            .flatten()
            .any(|e| matches!(e, Error::CollectiveMismatch { .. })),
        "{errors:?}"
    );
    assert!(errors.iter().all(Option::is_some), "{errors:?}");
}

#[test]
fn lost_peer_is_named_and_breaks_the_group() {
    let _guard = heavy_lock();
    let results = run_threads(3, SHORT * 5, |pg| {
        if pg.rank() == 2 {
            drop(pg); // rank 2 dies right after joining
            return None;
        }
        let mut buf = vec![1.0f64; 1 << 20];
        let started = Instant::now();
        let first = pg.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        let elapsed = started.elapsed();
        let second = pg.barrier().unwrap_err();
        Some((first, elapsed, second))
    });
    for (rank, result) in results.iter().enumerate().take(2) {
        let (first, elapsed, second) = result.as_ref().unwrap();
        assert!(*elapsed < PROMPT, "rank {rank} took {elapsed:?}");
        assert!(
            matches!(first, Error::PeerLost { .. }),
            "rank {rank}: {first:?}"
        );
        assert!(
            matches!(second, Error::GroupBroken { .. }),
            "rank {rank}: {second:?}"
        );
    }
    // Rank 1 talks to rank 2 directly in the ring, so it must name it.
    assert!(
        matches!(
            results[1].as_ref().unwrap().0,
            Error::PeerLost {
                rank: 2,
                observer: 1,
                ..
            }
        ),
        "{:?}",
        results[1]
    );
}

#[test]
fn silent_peer_times_out_naming_peer_and_op() {
    let _guard = heavy_lock();
    let timeout = Duration::from_millis(700);
    let results = run_threads(2, timeout, |pg| {
        let mut buf = vec![1.0f32; 1000];
        if pg.rank() == 1 {
            thread::sleep(timeout * 3);
            return None;
        }
        let started = Instant::now();
        let err = pg.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        Some((err, started.elapsed()))
    });
    let (err, elapsed) = results[0].as_ref().unwrap();
    assert!(*elapsed >= timeout && *elapsed < PROMPT, "{elapsed:?}");
    assert!(
        matches!(
            err,
            Error::Timeout {
                rank: 0,
                peer: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("waiting for rank 1") && text.contains("op #1 all_reduce(sum, 1000 x f32)"),
        "{text}"
    );
}

#[test]
fn a_single_call_can_have_its_own_deadline() {
    let _guard = heavy_lock();
    let short = Duration::from_millis(700);
    // The group's deadline is long; one barrier gets a short one.
    let results = run_threads(2, Duration::from_secs(120), |pg| {
        if pg.rank() == 1 {
            thread::sleep(short * 4);
            return None;
        }
        let started = Instant::now();
        let err = pg.barrier_with_timeout(short).unwrap_err();
        Some((err, started.elapsed()))
    });
    let (err, elapsed) = results[0].as_ref().unwrap();
    assert!(*elapsed >= short && *elapsed < PROMPT, "{elapsed:?}");
    assert!(
        matches!(err, Error::Timeout { peer: 1, timeout, .. } if *timeout == short),
        "{err:?}"
    );
}

#[test]
fn bad_arguments_are_rejected_before_any_communication() {
    let pg = init_process_group("gloo", InitOptions::new(0, 1, "127.0.0.1:0")).unwrap();
    let err = pg.broadcast(&mut [1u8], 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = pg.all_reduce(&mut [1i64], ReduceOp::Avg).unwrap_err();
    assert!(matches!(err, Error::UnsupportedOp { .. }), "{err:?}");
    // The group is still usable.
    let mut x = [2.0f32];
    pg.all_reduce(&mut x, ReduceOp::Avg).unwrap();
    assert_eq!(x, [2.0]);
}

#[test]
fn ranks_with_different_algorithms_get_a_clear_error() {
    let _guard = heavy_lock();
    let errors = common::run_threads_with(
        2,
        SHORT * 5,
        |opts| {
            let algo = if opts.rank() == 0 {
                ringccl::AllReduceAlgo::Ring
            } else {
                ringccl::AllReduceAlgo::RecursiveDoubling
            };
            opts.all_reduce_algo(algo)
        },
        |pg| {
            let mut buf = vec![1.0f32; 64];
            pg.all_reduce(&mut buf, ReduceOp::Sum).err()
        },
    );
    let text: Vec<String> = errors.iter().flatten().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("ring") && t.contains("recursive doubling")),
        "{text:?}"
    );
}

#[test]
fn point_to_point_tag_mismatch_is_named() {
    let _guard = heavy_lock();
    let errors = run_threads(2, SHORT * 5, |pg| {
        if pg.rank() == 0 {
            pg.send(&[1i32, 2, 3], 1, 7).err()
        } else {
            let mut buf = [0i32; 3];
            pg.recv(&mut buf, 0, 8).err()
        }
    });
    let err = errors[1].as_ref().expect("the receiver must fail");
    assert!(matches!(err, Error::CollectiveMismatch { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("tag=8") && text.contains("tag=7"), "{text}");
}

#[test]
fn point_to_point_to_self_or_out_of_range_is_rejected() {
    let pg = init_process_group("gloo", InitOptions::new(0, 1, "127.0.0.1:0")).unwrap();
    assert!(matches!(
        pg.send(&[1u8], 0, 0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pg.recv(&mut [1u8], 5, 0),
        Err(Error::InvalidArgument(_))
    ));
    let mut out = [0f32; 3];
    assert!(matches!(
        pg.all_gather(&[1f32, 2.0], &mut out),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pg.reduce_scatter(&[1f32, 2.0], &mut out, ReduceOp::Sum),
        Err(Error::InvalidArgument(_))
    ));
}
