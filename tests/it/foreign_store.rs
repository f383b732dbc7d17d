//! Start-up through a store someone else hosts (`init_process_group_with_store`, what
//! the PyTorch package does with torch's store), and gloo's issue order across threads
//! (`InitOptions::issue_from_any_thread`).

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::heavy_lock;
use ringccl::{Error, InitOptions, ReduceOp, SetupError, Store};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A store shared by the threads of this process, with a prefix per group: the kind of
/// store an application brings (torch's HashStore), reached over no network.
#[derive(Debug, Clone, Default)]
struct Shared {
    map: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    prefix: String,
    rank: usize,
}

impl Store for Shared {
    fn describe(&self) -> String {
        "the test's in-process store".into()
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn timeout(&self) -> Duration {
        TIMEOUT
    }
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
        let key = format!("{}{key}", self.prefix);
        self.map.lock().unwrap().insert(key, value.to_vec());
        Ok(())
    }
    fn set_if_absent(&mut self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>, SetupError> {
        let key = format!("{}{key}", self.prefix);
        let mut map = self.map.lock().unwrap();
        if let Some(old) = map.get(&key) {
            return Ok(Some(old.clone()));
        }
        map.insert(key, value.to_vec());
        Ok(None)
    }
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError> {
        let key = format!("{}{key}", self.prefix);
        Ok(self.map.lock().unwrap().get(&key).cloned())
    }
    fn scoped(&self, namespace: &str, rank: usize) -> Result<Box<dyn Store>, SetupError> {
        Ok(Box::new(Shared {
            map: Arc::clone(&self.map),
            prefix: format!("{}{namespace}", self.prefix),
            rank,
        }))
    }
}

fn store_for(shared: &Shared, rank: usize) -> Box<dyn Store> {
    Box::new(Shared {
        rank,
        ..shared.clone()
    })
}

#[test]
fn three_ranks_start_through_a_store_of_the_callers_and_form_sub_groups() {
    let _lock = heavy_lock();
    let shared = Shared::default();
    let n = 3;
    let results: Vec<Result<(f32, Option<f32>), Error>> = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = store_for(&shared, rank);
                s.spawn(move || {
                    let opts = InitOptions::new(rank, n, "").timeout(TIMEOUT);
                    let pg = ringccl::init_process_group_with_store("gloo", store, opts)?;
                    let mut x = [rank as f32 + 1.0; 16];
                    pg.all_reduce(&mut x, ReduceOp::Sum)?;
                    assert!(x.iter().all(|&v| v == x[0]));
                    // A group formed from this one goes through the same store.
                    let pair = pg.new_group(&[0, 2])?;
                    let sub = match pair {
                        Some(pair) => {
                            let mut y = [rank as f32; 4];
                            pair.all_reduce(&mut y, ReduceOp::Max)?;
                            Some(y[0])
                        }
                        None => None,
                    };
                    Ok((x[0], sub))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, result) in results.into_iter().enumerate() {
        let (sum, sub) = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(sum, 6.0, "rank {rank}");
        assert_eq!(sub, (rank != 1).then_some(2.0), "rank {rank}");
    }
}

#[test]
fn a_world_size_the_store_disagrees_with_fails_every_rank() {
    let _lock = heavy_lock();
    let shared = Shared::default();
    let errors: Vec<Error> = thread::scope(|s| {
        let handles: Vec<_> = [(0, 2), (1, 3)]
            .into_iter()
            .map(|(rank, world)| {
                let store = store_for(&shared, rank);
                s.spawn(move || {
                    let opts = InitOptions::new(rank, world, "").timeout(Duration::from_secs(20));
                    ringccl::init_process_group_with_store("gloo", store, opts).unwrap_err()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .all(|t| t.contains("world") || t.contains("WORLD_SIZE")),
        "{text:?}"
    );
}

#[test]
fn nccl_through_a_callers_store_is_refused_with_the_way_out() {
    let store = store_for(&Shared::default(), 0);
    let err = ringccl::init_process_group_with_store("nccl", store, InitOptions::new(0, 1, ""))
        .unwrap_err();
    assert!(matches!(err, Error::BackendUnavailable { .. }), "{err}");
    assert!(err.to_string().contains("init_process_group"), "{err}");
}

#[test]
fn calls_from_two_threads_run_in_issue_order_with_issue_from_any_thread() {
    let _lock = heavy_lock();
    let shared = Shared::default();
    let n = 2;
    // On each rank, thread A queues an async all-reduce, then thread B (while A's is
    // still pending) issues a blocking one: both are accepted, and run in issue order.
    let sums: Vec<(Vec<f32>, Vec<f32>)> = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = store_for(&shared, rank);
                s.spawn(move || {
                    let opts = InitOptions::new(rank, n, "")
                        .timeout(TIMEOUT)
                        .issue_from_any_thread();
                    let pg = ringccl::init_process_group_with_store("gloo", store, opts).unwrap();
                    let mut firsts = Vec::new();
                    let mut seconds = Vec::new();
                    for round in 0..50 {
                        let first = pg
                            .all_reduce_async(vec![round as f32; 1 << 12], ReduceOp::Sum)
                            .unwrap();
                        let other = pg.clone();
                        let second = thread::spawn(move || {
                            let mut b = [1.0f32 + round as f32; 8];
                            other.all_reduce(&mut b, ReduceOp::Sum).map(|()| b[0])
                        })
                        .join()
                        .unwrap()
                        .unwrap();
                        firsts.push(first.wait().unwrap()[0]);
                        seconds.push(second);
                    }
                    (firsts, seconds)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (firsts, seconds) in sums {
        for round in 0..50 {
            assert_eq!(firsts[round], 2.0 * round as f32);
            assert_eq!(seconds[round], 2.0 * (1.0 + round as f32));
        }
    }
}

#[test]
fn without_issue_from_any_thread_the_second_thread_is_refused() {
    let _lock = heavy_lock();
    let pg = ringccl::init_process_group("gloo", InitOptions::new(0, 1, "127.0.0.1:0")).unwrap();
    // The first call stays pending until the second thread has been answered.
    let (release, hold) = std::sync::mpsc::channel::<()>();
    let pending = pg
        .run_async("hold", move |_, _| {
            let _ = hold.recv_timeout(TIMEOUT);
            Ok(())
        })
        .unwrap();
    let other = pg.clone();
    let err = thread::spawn(move || other.barrier())
        .join()
        .unwrap()
        .unwrap_err();
    release.send(()).unwrap();
    assert!(matches!(err, Error::ConcurrentUse { .. }), "{err}");
    let _ = pending.wait();
}
