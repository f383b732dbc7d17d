//! The library's DataParallel against one process, on a linear model: gradients, uneven
//! shards, failing replicas.

use ringccl::ddp::{DataParallel, DdpError, Replica};

const DIM: usize = 6;

#[derive(Clone)]
struct Linear {
    w: Vec<f64>,
    b: Vec<f64>,
}

impl Replica<f64> for Linear {
    fn params(&self) -> Vec<&[f64]> {
        vec![&self.w, &self.b]
    }
    fn params_mut(&mut self) -> Vec<&mut [f64]> {
        vec![&mut self.w, &mut self.b]
    }
}

fn sample(i: usize) -> (Vec<f64>, f64) {
    let x: Vec<f64> = (0..DIM)
        .map(|j| ((i * 7 + j * 3) % 11) as f64 / 5.0 - 1.0)
        .collect();
    let y = x.iter().enumerate().map(|(j, v)| v * j as f64).sum::<f64>() - 0.5;
    (x, y)
}

/// Gradient of the mean squared error over `batch`, as one process computes it.
fn gradient(model: &Linear, batch: &[usize]) -> (Vec<f64>, f64) {
    let mut dw = vec![0.0; DIM];
    let mut db = 0.0;
    for &i in batch {
        let (x, y) = sample(i);
        let err = x.iter().zip(&model.w).map(|(x, w)| x * w).sum::<f64>() + model.b[0] - y;
        dw.iter_mut()
            .zip(&x)
            .for_each(|(g, x)| *g += err * x / batch.len() as f64);
        db += err / batch.len() as f64;
    }
    (dw, db)
}

fn train_dp(replicas: usize, batch: usize, steps: usize) -> Linear {
    let model = Linear {
        w: vec![0.1; DIM],
        b: vec![0.0],
    };
    let mut dp = DataParallel::new(model, replicas).unwrap();
    for step in 0..steps {
        let indices: Vec<usize> = (step * batch..(step + 1) * batch).collect();
        dp.step(&indices, |model, shard, grads| {
            let (dw, db) = gradient(model, shard);
            grads.set(0, &dw)?;
            grads.set(1, &[db])?;
            Ok::<_, DdpError>(shard.len())
        })
        .unwrap();
        dp.update(|master, grads| {
            for (p, g) in master.params_mut().into_iter().zip(grads) {
                p.iter_mut().zip(g).for_each(|(p, g)| *p -= 0.1 * g);
            }
        });
    }
    dp.master().clone()
}

fn close(a: &Linear, b: &Linear, tolerance: f64) -> bool {
    a.params()
        .iter()
        .flat_map(|p| p.iter())
        .zip(b.params().iter().flat_map(|p| p.iter()))
        .all(|(x, y)| (x - y).abs() <= tolerance * y.abs().max(1e-3))
}

#[test]
fn data_parallel_matches_one_process_even_and_uneven() {
    let one = train_dp(1, 24, 30);
    for replicas in [2, 3, 4] {
        let many = train_dp(replicas, 24, 30);
        assert!(close(&many, &one, 1e-9), "{replicas} replicas of 24");
    }
    // 10 does not divide by 4 (shards of 3, 3, 2, 2): weighted by shard length.
    let uneven = train_dp(4, 10, 30);
    assert!(close(&uneven, &train_dp(1, 10, 30), 1e-9), "uneven shards");
    // A batch shorter than the replica count leaves replicas idle, not wrong.
    assert!(
        close(&train_dp(5, 3, 30), &train_dp(1, 3, 30), 1e-9),
        "idle replicas"
    );
}

#[test]
fn each_replica_runs_on_its_own_thread_with_the_masters_parameters() {
    let model = Linear {
        w: vec![1.0; DIM],
        b: vec![2.0],
    };
    let mut dp = DataParallel::new(model, 3).unwrap();
    dp.update(|master, _| master.b[0] = 7.0);
    let seen = dp
        .step(&[0, 1, 2], |model, _, grads| {
            grads.set(0, &[0.0; DIM])?;
            grads.set(1, &[0.0])?;
            let thread = std::thread::current().id();
            Ok::<_, DdpError>((grads.replica(), model.b[0], thread))
        })
        .unwrap();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(
        seen.iter().all(|s| s.1 == 7.0),
        "replicated after the update: {seen:?}"
    );
    assert_ne!(seen[0].2, seen[1].2);
    assert_ne!(seen[1].2, seen[2].2);
    assert_eq!(
        seen[0].2,
        std::thread::current().id(),
        "the master runs here"
    );
}

#[test]
fn failing_replicas_are_named() {
    let model = Linear {
        w: vec![0.0; DIM],
        b: vec![0.0],
    };
    let mut dp = DataParallel::new(model, 3).unwrap();
    let missing = dp
        .step(&[0, 1, 2], |_, _, grads| {
            grads.set(0, &[0.0; DIM])?;
            if grads.replica() != 2 {
                grads.set(1, &[0.0])?;
            }
            Ok::<_, DdpError>(())
        })
        .unwrap_err();
    assert!(
        matches!(missing, DdpError::Replica { replica: 2, .. }),
        "{missing}"
    );
    assert!(missing.to_string().contains("parameter #1"), "{missing}");

    let panicked = dp
        .step(&[0, 1, 2], |_, _, grads| {
            if grads.replica() == 1 {
                panic!("shard broke");
            }
            grads.set(0, &[0.0; DIM])?;
            grads.set(1, &[0.0])?;
            Ok::<_, DdpError>(())
        })
        .unwrap_err();
    assert!(panicked.to_string().contains("replica 1"), "{panicked}");
    assert!(panicked.to_string().contains("shard broke"), "{panicked}");

    let wrong = dp
        .step(&[0], |_, _, grads| grads.set(0, &[0.0; 2]))
        .unwrap_err();
    assert!(wrong.to_string().contains("6"), "{wrong}");
    assert!(DataParallel::new(
        Linear {
            w: vec![],
            b: vec![]
        },
        0
    )
    .is_err());
}
