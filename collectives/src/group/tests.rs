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
