//! Issue 16: `ringccl::local_groups`, ranks of one group living in one process, one per
//! thread, connected in memory. They run the whole collective matrix exact and
//! bit-identical, and keep the guarantees of ranks in separate processes: a mismatch
//! is named within about a second, a rank that gives up stops the others, and a rank
//! whose group is dropped is named by the others.

use crate::common;

use std::thread;
use std::time::{Duration, Instant};

use common::heavy_lock;
use common::matrix::{assert_identical, matrix};
use ringccl::{
    local_groups, local_groups_with, AllReduceAlgo, Error, InitOptions, ProcessGroup, ReduceOp,
};

/// `n` local ranks whose calls have a minute: only detection and aborts end them early.
fn patient_ranks(n: usize) -> Vec<ProcessGroup> {
    let opts = InitOptions::new(0, n, "127.0.0.1:0").timeout(Duration::from_secs(60));
    local_groups_with("gloo", n, opts).expect("local groups")
}

/// Runs `body` on every rank, each on its own thread; returns what each returned.
fn on_every_rank<R: Send>(
    ranks: &[ProcessGroup],
    body: impl Fn(&ProcessGroup) -> R + Sync,
) -> Vec<R> {
    thread::scope(|s| {
        let handles: Vec<_> = ranks.iter().map(|pg| s.spawn(|| body(pg))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

#[test]
fn local_ranks_run_the_whole_matrix_exact_and_bit_identical() {
    for n in [1, 2, 3, 5] {
        let _guard = heavy_lock();
        let started = Instant::now();
        let ranks = local_groups("gloo", n).expect("local groups");
        assert_eq!(ranks.len(), n);
        for (rank, pg) in ranks.iter().enumerate() {
            assert_eq!((pg.rank(), pg.world_size()), (rank, n));
            assert_eq!(pg.peer_transport(rank), "self");
            if n > 1 {
                assert_eq!(pg.peer_transport((rank + 1) % n), "memory");
            }
        }
        let lines = on_every_rank(&ranks, matrix);
        assert_identical(&lines);
        eprintln!(
            "local n={n}: {} cases bit-identical in {:?}",
            lines[0].len(),
            started.elapsed()
        );
    }
}

/// Rank 2 broadcasts while the others all-reduce the same count: no frame need ever
/// reach a rank that would notice, so only the control threads' questions find it.
#[test]
fn a_mismatch_between_local_ranks_is_named_within_about_a_second() {
    let _guard = heavy_lock();
    let ranks = patient_ranks(3);
    let started = Instant::now();
    let outcomes = on_every_rank(&ranks, |pg| {
        let mut buf = vec![1.0f32; 1024];
        let outcome = if pg.rank() == 2 {
            pg.broadcast(&mut buf, 0)
        } else {
            pg.all_reduce(&mut buf, ReduceOp::Sum)
        };
        (started.elapsed(), outcome)
    });
    for (rank, (after, outcome)) in outcomes.iter().enumerate() {
        eprintln!("rank {rank} after {after:?}: {outcome:?}");
        let text = outcome
            .as_ref()
            .expect_err("a mismatch must fail")
            .to_string();
        assert!(
            text.contains("broadcast") && text.contains("all_reduce"),
            "rank {rank}: {text}"
        );
        assert!(*after < Duration::from_secs(10), "rank {rank}: {after:?}");
    }
}

/// Rank 1 never calls; rank 0 gives up after its own 1 s deadline and aborts the group,
/// so rank 2, whose deadline is a minute, fails at once naming rank 0's reason.
#[test]
fn a_local_rank_that_gives_up_stops_the_others() {
    let _guard = heavy_lock();
    let ranks = patient_ranks(3);
    let started = Instant::now();
    let outcomes = on_every_rank(&ranks, |pg| match pg.rank() {
        0 => {
            let outcome = pg.barrier_with_timeout(Duration::from_secs(1));
            Some((started.elapsed(), outcome))
        }
        2 => {
            let outcome = pg.barrier();
            Some((started.elapsed(), outcome))
        }
        _ => None,
    });
    let (at_0, first) = outcomes[0].as_ref().expect("rank 0 reports");
    let (at_2, second) = outcomes[2].as_ref().expect("rank 2 reports");
    eprintln!("rank 0 after {at_0:?}: {first:?}\nrank 2 after {at_2:?}: {second:?}");
    assert!(first.is_err() && second.is_err());
    let text = second.as_ref().unwrap_err().to_string();
    assert!(text.contains("rank 0 aborted the group"), "{text}");
    assert!(*at_2 < Duration::from_secs(10), "{at_2:?}");
}

/// A rank whose group is dropped while the others wait in a collective is named by them.
#[test]
fn a_local_rank_that_leaves_is_named_by_the_others() {
    let _guard = heavy_lock();
    let mut ranks = patient_ranks(2);
    let gone = ranks.pop().expect("rank 1");
    let started = Instant::now();
    let waiter = thread::spawn(move || {
        let pg = ranks.pop().expect("rank 0");
        let mut x = [1i64; 16];
        pg.all_reduce(&mut x, ReduceOp::Sum)
    });
    thread::sleep(Duration::from_millis(200));
    let dropping = Instant::now();
    drop(gone);
    eprintln!("dropping rank 1's group took {:?}", dropping.elapsed());
    let outcome = waiter.join().unwrap();
    let took = started.elapsed();
    eprintln!("rank 0 after {took:?}: {outcome:?}");
    let text = outcome.expect_err("rank 1 left").to_string();
    assert!(text.contains("rank 1"), "{text}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn odd_requests_are_errors_that_say_why() {
    assert!(matches!(
        local_groups("gloo", 0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        local_groups("mpi", 2),
        Err(Error::UnknownBackend { .. })
    ));
}

/// `n` local ranks that all-reduce through each other's buffers at every size.
fn peer_memory_ranks(n: usize, timeout: Duration) -> Vec<ProcessGroup> {
    let opts = InitOptions::new(0, n, "127.0.0.1:0")
        .timeout(timeout)
        .all_reduce_algo(AllReduceAlgo::PeerMemory);
    local_groups_with("gloo", n, opts).expect("local groups")
}

/// A buffer large enough for any all-reduce algorithm choice to read peers' buffers.
const LARGE: usize = 300_007;

#[test]
fn the_peer_memory_all_reduce_runs_the_whole_matrix_exact_and_bit_identical() {
    for n in [2, 3, 5] {
        let _guard = heavy_lock();
        let started = Instant::now();
        let ranks = peer_memory_ranks(n, Duration::from_secs(120));
        let lines = on_every_rank(&ranks, matrix);
        assert_identical(&lines);
        eprintln!(
            "peer memory n={n}: {} cases bit-identical in {:?}",
            lines[0].len(),
            started.elapsed()
        );
    }
}

/// Rank 2 broadcasts while the others all-reduce through each other's buffers: rank 2
/// never posts, and the control threads' questions name the mismatch.
#[test]
fn a_mismatch_against_a_peer_memory_all_reduce_is_named_within_seconds() {
    let _guard = heavy_lock();
    let ranks = peer_memory_ranks(3, Duration::from_secs(60));
    let started = Instant::now();
    let outcomes = on_every_rank(&ranks, |pg| {
        let mut buf = vec![1.0f32; LARGE];
        let outcome = if pg.rank() == 2 {
            pg.broadcast(&mut buf, 0)
        } else {
            pg.all_reduce(&mut buf, ReduceOp::Sum)
        };
        (started.elapsed(), outcome)
    });
    for (rank, (after, outcome)) in outcomes.iter().enumerate() {
        eprintln!("rank {rank} after {after:?}: {outcome:?}");
        let text = outcome
            .as_ref()
            .expect_err("a mismatch must fail")
            .to_string();
        assert!(
            text.contains("broadcast") && text.contains("all_reduce"),
            "rank {rank}: {text}"
        );
        assert!(*after < Duration::from_secs(20), "rank {rank}: {after:?}");
    }
}

/// Two ranks all-reduce different counts through each other's buffers: both see it
/// before either reads the other's buffer.
#[test]
fn different_counts_in_a_peer_memory_all_reduce_are_a_mismatch_not_a_crash() {
    let _guard = heavy_lock();
    let ranks = peer_memory_ranks(2, Duration::from_secs(60));
    let outcomes = on_every_rank(&ranks, |pg| {
        let mut buf = vec![1.0f64; LARGE + pg.rank() * 1000];
        pg.all_reduce(&mut buf, ReduceOp::Sum)
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        let text = outcome.as_ref().expect_err("different counts").to_string();
        assert!(text.contains("rank"), "rank {rank}: {text}");
        assert!(
            text.contains(&LARGE.to_string()) || text.contains(&(LARGE + 1000).to_string()),
            "names the counts: {text}"
        );
    }
}

/// Rank 1 never calls: the others give up at their deadline, naming rank 1.
#[test]
fn a_peer_memory_all_reduce_waits_only_until_its_deadline() {
    let _guard = heavy_lock();
    let ranks = peer_memory_ranks(3, Duration::from_secs(60));
    let started = Instant::now();
    let outcomes = on_every_rank(&ranks, |pg| {
        (pg.rank() != 1).then(|| {
            let mut buf = vec![1.0f32; LARGE];
            let outcome =
                pg.all_reduce_with_timeout(&mut buf, ReduceOp::Sum, Duration::from_secs(1));
            (started.elapsed(), outcome)
        })
    });
    for (rank, outcome) in outcomes.iter().enumerate() {
        let Some((after, outcome)) = outcome else {
            continue;
        };
        eprintln!("rank {rank} after {after:?}: {outcome:?}");
        let text = outcome.as_ref().expect_err("rank 1 never came").to_string();
        assert!(
            text.contains("rank 1") || text.contains("aborted"),
            "rank {rank}: {text}"
        );
        assert!(
            *after >= Duration::from_millis(900) || text.contains("aborted"),
            "{after:?}"
        );
        assert!(*after < Duration::from_secs(20), "rank {rank}: {after:?}");
    }
}

/// A rank whose group is dropped while the other waits for it in a peer-memory
/// all-reduce is named by it.
#[test]
fn a_rank_that_leaves_a_peer_memory_all_reduce_is_named() {
    let _guard = heavy_lock();
    let mut ranks = peer_memory_ranks(2, Duration::from_secs(60));
    let gone = ranks.pop().expect("rank 1");
    let started = Instant::now();
    let waiter = thread::spawn(move || {
        let pg = ranks.pop().expect("rank 0");
        let mut x = vec![1i64; LARGE];
        pg.all_reduce(&mut x, ReduceOp::Sum)
    });
    thread::sleep(Duration::from_millis(200));
    drop(gone);
    let outcome = waiter.join().unwrap();
    let took = started.elapsed();
    eprintln!("rank 0 after {took:?}: {outcome:?}");
    let text = outcome.expect_err("rank 1 left").to_string();
    assert!(text.contains("rank 1"), "{text}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}
