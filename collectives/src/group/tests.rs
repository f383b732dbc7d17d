//! The runner over the in-memory transport: the rules every backend shares.

use std::thread;
use std::time::Duration;

use crate::{
    Backend, BufferMut, BufferRef, Deadline, Error, HostBackend, HostConfig, MemoryConfig,
    MemoryTransport, ReduceOp,
};

fn group(n: usize) -> Vec<HostBackend<MemoryTransport>> {
    MemoryTransport::mesh(n, MemoryConfig::default())
        .into_iter()
        .map(|t| HostBackend::new("test", t, HostConfig::default()))
        .collect()
}

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

#[test]
fn collectives_run_and_agree_on_every_rank() {
    let results: Vec<Vec<f32>> = thread::scope(|s| {
        let handles: Vec<_> = group(3)
            .into_iter()
            .map(|b| {
                s.spawn(move || {
                    let mut x = vec![b.rank() as f32 + 0.1; 1000];
                    b.all_reduce(BufferMut::from_slice(&mut x), ReduceOp::Sum, soon())
                        .unwrap();
                    b.barrier(soon()).unwrap();
                    x
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|r| r == &results[0]));
    assert!((results[0][0] - 3.3).abs() < 1e-5);
}

#[test]
fn a_bad_argument_is_refused_before_anything_moves_and_the_group_stays_usable() {
    let b = group(1).pop().unwrap();
    let err = b
        .broadcast(BufferMut::from_slice(&mut [0u8; 4]), 3, soon())
        .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    let err = b
        .send(BufferRef::from_slice(&[0u8; 4]), 0, 1, soon())
        .unwrap_err();
    assert!(err.to_string().contains("cannot send to itself"), "{err}");
    b.barrier(soon()).unwrap();
}

#[test]
fn the_deadline_passed_down_is_the_one_that_fires_and_breaks_the_group() {
    // Rank 1 never calls: rank 0's call must end at its own short deadline.
    let mut ranks = group(2);
    let _idle = ranks.pop();
    let b = ranks.pop().unwrap();
    let short = Duration::from_millis(200);
    let err = b
        .all_reduce(
            BufferMut::from_slice(&mut [1.0f32; 8]),
            ReduceOp::Sum,
            Deadline::after(short),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::Timeout { peer: 1, timeout, .. } if timeout == short),
        "{err:?}"
    );
    let later = b.barrier(soon()).unwrap_err();
    assert!(matches!(later, Error::GroupBroken { .. }), "{later:?}");
}

#[test]
fn a_mismatch_breaks_the_group_on_the_rank_that_sees_it() {
    let errors: Vec<Error> = thread::scope(|s| {
        let handles: Vec<_> = group(2)
            .into_iter()
            .map(|b| {
                s.spawn(move || {
                    let mut x = [1.0f32; 4];
                    let first = if b.rank() == 0 {
                        b.all_reduce(BufferMut::from_slice(&mut x), ReduceOp::Sum, soon())
                    } else {
                        b.broadcast(BufferMut::from_slice(&mut x), 0, soon())
                    };
                    (first, b.barrier(Deadline::after(Duration::from_secs(2))))
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| {
                let (first, second) = h.join().unwrap();
                first.err().inspect(|_| assert!(second.is_err()))
            })
            .collect()
    });
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, Error::CollectiveMismatch { .. })),
        "{errors:?}"
    );
}

/// An engine for the runner's own paths: its calls panic (`panics`) or do nothing, and
/// it counts how often it is told to abort.
#[derive(Debug, Default)]
struct TestEngine {
    panics: bool,
    aborts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl crate::Engine for TestEngine {
    fn execute(
        &mut self,
        _op: &crate::OpDesc,
        _request: crate::Request<'_>,
        _deadline: Deadline,
    ) -> Result<(), Error> {
        if self.panics {
            panic!("kernel exploded");
        }
        Ok(())
    }

    fn abort(&mut self) {
        self.aborts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_panic_inside_a_call_aborts_the_group_and_still_unwinds() {
    let panicking = TestEngine {
        panics: true,
        ..TestEngine::default()
    };
    let runner = crate::GroupRunner::with_engine("test", 0, 2, Duration::from_secs(5), panicking);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runner.barrier(soon())));
    assert!(unwound.is_err(), "the panic must reach the caller");
    let record = runner.control().aborted().expect("the group is aborted");
    assert_eq!(record.origin, 0);
    assert!(
        record.reason.contains("kernel exploded"),
        "{}",
        record.reason
    );
    // No poisoned lock: the next call fails cleanly, quoting the panic.
    match runner.barrier(soon()) {
        Err(Error::GroupBroken { cause, .. }) => assert!(cause.contains("kernel exploded")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_peers_abort_fails_the_next_call_naming_it_and_backend_abort_breaks_the_group() {
    let mut ranks = group(2);
    let b = ranks.pop().unwrap();
    b.control()
        .abort(0, "op #3 all_reduce: mismatch".into(), None);
    match b.barrier(soon()) {
        Err(e @ Error::GroupAborted { rank: 1, by: 0, .. }) => {
            assert!(
                e.to_string().starts_with("rank 0 aborted the group: op #3"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
    let a = ranks.pop().unwrap();
    a.abort("queued call timed out");
    match a.barrier(soon()) {
        Err(Error::GroupBroken { cause, .. }) => assert!(cause.contains("queued call timed out")),
        other => panic!("{other:?}"),
    }
}

fn overdue(rank: usize) -> Error {
    Error::Timeout {
        rank,
        peer: 1,
        op: crate::OpDesc::barrier(4),
        moved: 0,
        expected: 0,
        timeout: Duration::from_secs(2),
        gone: Vec::new(),
        cause: None,
    }
}

#[test]
fn tending_between_calls_takes_no_number_and_an_error_it_returns_breaks_the_group() {
    let b = group(1).pop().unwrap();
    assert_eq!(b.tend(|_| Ok(7)).unwrap(), 7);
    b.barrier(soon()).unwrap();
    let err = b.tend(|_| Err::<(), _>(overdue(0))).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    match b.barrier(soon()) {
        Err(Error::GroupBroken { cause, .. }) => assert!(cause.contains("op #4"), "{cause}"),
        other => panic!("{other:?}"),
    }
    assert!(
        b.tend(|_| Ok(())).is_err(),
        "a broken group refuses tending too"
    );
}

#[test]
fn an_error_found_unattended_aborts_at_once_and_the_next_call_returns_it() {
    let mut ranks = group(2);
    let b = ranks.remove(0);
    assert_eq!(b.tend_unattended(|_| Ok(3)), Some(3));
    // A failure that does not break the group is only logged.
    let mild = Error::InvalidArgument("not a break".into());
    assert_eq!(b.tend_unattended(|_| Err::<(), _>(mild)), None);
    assert!(b.control().aborted().is_none());
    assert_eq!(b.tend_unattended(|_| Err::<(), _>(overdue(0))), None);
    let record = b
        .control()
        .aborted()
        .expect("aborted at once, with nobody calling");
    assert!(record.reason.contains("op #4"), "{}", record.reason);
    match b.barrier(soon()) {
        Err(Error::Timeout { op, .. }) => assert_eq!(op.seq, 4, "the error itself, typed"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(b.barrier(soon()), Err(Error::GroupBroken { .. })));
    assert_eq!(b.tend_unattended(|_| Ok(())), None);
}

#[test]
fn a_peers_abort_releases_the_engine_from_the_unattended_watch_at_once() {
    use std::sync::atomic::Ordering;
    let engine = TestEngine::default();
    let aborts = std::sync::Arc::clone(&engine.aborts);
    let runner = crate::GroupRunner::with_engine("test", 0, 2, Duration::from_secs(5), engine);
    assert_eq!(runner.tend_unattended(|_| Ok(1)), Some(1));
    assert_eq!(aborts.load(Ordering::SeqCst), 0);
    runner
        .control()
        .abort(1, "rank 1 timed out in op #9".into(), None);
    // Nobody calls: the watch alone releases the engine, so that a device waiting on
    // the dead group is freed.
    assert_eq!(runner.tend_unattended(|_| Ok(1)), None);
    assert_eq!(aborts.load(Ordering::SeqCst), 1);
    // The next call (or tending) returns the peer's abort, naming it.
    match runner.tend(|_| Ok(())) {
        Err(Error::GroupAborted { by: 1, reason, .. }) => assert!(reason.contains("op #9")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        runner.barrier(soon()),
        Err(Error::GroupBroken { .. })
    ));
}

#[test]
fn an_error_found_while_tending_after_a_peers_abort_is_that_abort() {
    let runner = crate::GroupRunner::with_engine(
        "test",
        0,
        2,
        Duration::from_secs(5),
        TestEngine::default(),
    );
    let err = runner.tend(|engine| {
        // The abort lands while the body runs; the body sees it as a broken group.
        let _ = engine;
        Err::<(), _>(Error::GroupBroken {
            rank: 0,
            cause: "aborted".into(),
        })
        .inspect_err(|_| {
            runner.control().abort(1, "rank 1 gave up".into(), None);
        })
    });
    assert!(
        matches!(err, Err(Error::GroupAborted { by: 1, .. })),
        "{err:?}"
    );
}
