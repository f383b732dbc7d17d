//! The DDP layer over real process groups: N ranks with local batch b match one process
//! with batch N·b; no_sync accumulation; unused parameters; the error paths; hooks;
//! bucket views; the rebuild.

use crate::common;

use common::{heavy_lock, run_threads, GROUP_TIMEOUT};
use ringccl::ddp::{
    Bf16CompressHook, DdpConfig, DdpError, DistributedDataParallel, DistributedSampler,
    Fp16CompressHook, ParamSpec,
};
use ringccl::{DType, ProcessGroup};

const DIM: usize = 12;
const DATASET: usize = 96;

fn sample(i: usize) -> (Vec<f32>, f32) {
    let x: Vec<f32> = (0..DIM)
        .map(|j| (((i * 31 + j * 17) % 23) as f32 - 11.0) / 11.0)
        .collect();
    let y = x
        .iter()
        .enumerate()
        .map(|(j, v)| v * (j as f32 - 5.5))
        .sum::<f32>()
        + 0.25;
    (x, y)
}

fn specs() -> Vec<ParamSpec> {
    vec![
        ParamSpec::new("linear.weight", DIM, DType::F32),
        ParamSpec::new("linear.bias", 1, DType::F32),
    ]
}

/// Gradients of the mean squared error of `y = w.x + b` over `batch`: (dw, db).
fn grads(w: &[f32], b: f32, batch: &[usize]) -> (Vec<f32>, f32) {
    let mut dw = vec![0.0f32; DIM];
    let mut db = 0.0f32;
    for &i in batch {
        let (x, y) = sample(i);
        let err = x.iter().zip(w).map(|(x, w)| x * w).sum::<f32>() + b - y;
        for (g, x) in dw.iter_mut().zip(&x) {
            *g += err * x / batch.len() as f32;
        }
        db += err / batch.len() as f32;
    }
    (dw, db)
}

/// `steps` SGD steps of the linear model, data-parallel over `pg` with local batch
/// `local`; returns the final parameters.
fn train(pg: &ProcessGroup, local: usize, steps: usize, config: DdpConfig) -> Vec<f32> {
    let mut ddp = DistributedDataParallel::<f32>::new(pg, &specs(), config).unwrap();
    let (mut w, mut b) = (vec![0.1f32; DIM], vec![0.0f32]);
    if pg.rank() != 0 {
        w.fill(7.0); // broadcast_parameters must overwrite this
    }
    ddp.broadcast_parameters(&mut [&mut w, &mut b]).unwrap();
    let mut sampler = DistributedSampler::new(DATASET, pg.world_size(), pg.rank())
        .unwrap()
        .seed(3);
    let per_epoch = sampler.num_samples() / local;
    let mut indices = Vec::new();
    for step in 0..steps {
        if step % per_epoch == 0 {
            sampler.set_epoch((step / per_epoch) as u64);
            indices = sampler.indices();
        }
        let at = (step % per_epoch) * local;
        let (dw, db) = grads(&w, b[0], &indices[at..at + local]);
        ddp.mark_grad_ready(1, &[db]).unwrap();
        ddp.mark_grad_ready(0, &dw).unwrap();
        ddp.finish().unwrap();
        for (p, g) in w.iter_mut().zip(ddp.grad(0).unwrap()) {
            *p -= 0.05 * g;
        }
        b[0] -= 0.05 * ddp.grad(1).unwrap()[0];
    }
    w.push(b[0]);
    w
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn n_ranks_with_batch_b_match_one_process_with_batch_n_times_b() {
    let _heavy = heavy_lock();
    let alone = run_threads(1, GROUP_TIMEOUT, |pg| {
        train(&pg, 24, 20, DdpConfig::default())
    });
    for n in [2, 3, 4] {
        let together = run_threads(n, GROUP_TIMEOUT, |pg| {
            train(&pg, 24 / n, 20, DdpConfig::default())
        });
        for (rank, params) in together.iter().enumerate() {
            assert_eq!(
                bytes(params),
                bytes(&together[0]),
                "replicas must stay bit-identical (rank {rank})"
            );
        }
        assert!(
            close(&together[0], &alone[0], 1e-5),
            "n={n}: {:?} vs {:?}",
            together[0],
            alone[0]
        );
        // Not trivially equal: the model moved.
        assert!(!close(&together[0], &[0.1; DIM + 1], 1e-3));
    }
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn tiny_buckets_and_bucket_views_give_the_same_result() {
    let _heavy = heavy_lock();
    let reference = run_threads(3, GROUP_TIMEOUT, |pg| {
        train(&pg, 8, 10, DdpConfig::default())
    });
    // One parameter per bucket, several buckets in flight.
    let tiny = run_threads(3, GROUP_TIMEOUT, |pg| {
        train(
            &pg,
            8,
            10,
            DdpConfig::default()
                .first_bucket_bytes(1)
                .bucket_cap_bytes(1),
        )
    });
    assert!(close(&tiny[0], &reference[0], 1e-6));
    // Views: the trainer writes into the bucket; DDP divides once per bucket.
    let views = run_threads(3, GROUP_TIMEOUT, |pg| {
        let config = DdpConfig::default().gradient_as_bucket_view(true);
        let mut ddp = DistributedDataParallel::<f32>::new(&pg, &specs(), config).unwrap();
        let batch: Vec<usize> = (pg.rank() * 8..pg.rank() * 8 + 8).collect();
        let (dw, db) = grads(&[0.1; DIM], 0.0, &batch);
        ddp.grad_view_mut(1).unwrap()[0] = db;
        ddp.mark_grad_ready_in_view(1).unwrap();
        ddp.grad_view_mut(0).unwrap().copy_from_slice(&dw);
        ddp.mark_grad_ready_in_view(0).unwrap();
        ddp.finish().unwrap();
        let mut out = ddp.grad(0).unwrap().to_vec();
        out.push(ddp.grad(1).unwrap()[0]);
        out
    });
    let all: Vec<usize> = (0..24).collect();
    let (dw, db) = grads(&[0.1; DIM], 0.0, &all);
    let mut want = dw;
    want.push(db);
    for got in &views {
        assert!(close(got, &want, 1e-5), "{got:?} vs {want:?}");
    }
}

#[test]
fn no_sync_accumulates_k_micro_steps_into_one_step() {
    let _heavy = heavy_lock();
    let k = 3;
    let results = run_threads(2, GROUP_TIMEOUT, |pg| {
        let mut ddp =
            DistributedDataParallel::<f32>::new(&pg, &specs(), DdpConfig::default()).unwrap();
        let micro =
            |m: usize| -> Vec<usize> { (0..4).map(|i| (m * 2 + pg.rank()) * 4 + i).collect() };
        let w = vec![0.2f32; DIM];
        // k-1 micro-steps without communication, then the synchronised one.
        for m in 0..k {
            let (dw, db) = grads(&w, 0.0, &micro(m));
            if m + 1 < k {
                let mut quiet = ddp.no_sync();
                quiet.mark_grad_ready(0, &dw).unwrap();
                quiet.mark_grad_ready(1, &[db]).unwrap();
                quiet.finish().unwrap();
            } else {
                ddp.mark_grad_ready(0, &dw).unwrap();
                ddp.mark_grad_ready(1, &[db]).unwrap();
                ddp.finish().unwrap();
            }
        }
        ddp.grad(0).unwrap().to_vec()
    });
    // Expected: the sum over micro-steps of the rank-averaged gradients.
    let w = vec![0.2f32; DIM];
    let mut want = vec![0.0f32; DIM];
    for m in 0..k {
        for rank in 0..2 {
            let batch: Vec<usize> = (0..4).map(|i| (m * 2 + rank) * 4 + i).collect();
            let (dw, _) = grads(&w, 0.0, &batch);
            for (t, g) in want.iter_mut().zip(dw) {
                *t += g / 2.0;
            }
        }
    }
    for got in &results {
        assert!(close(got, &want, 1e-5), "{got:?} vs {want:?}");
    }
    // And a plain step afterwards starts from zero again (no leftover accumulation).
}

#[test]
fn unused_parameters_are_an_error_or_zero_with_find_unused() {
    let _heavy = heavy_lock();
    let params = vec![
        ParamSpec::new("used", 4, DType::F32),
        ParamSpec::new("head.unused", 2, DType::F32),
    ];
    let errors = run_threads(2, GROUP_TIMEOUT, |pg| {
        let mut ddp =
            DistributedDataParallel::<f32>::new(&pg, &params, DdpConfig::default()).unwrap();
        ddp.mark_grad_ready(0, &[1.0; 4]).unwrap();
        ddp.finish().unwrap_err().to_string()
    });
    for e in &errors {
        assert!(e.contains("#1 \"head.unused\""), "{e}");
        assert!(e.contains("find_unused_parameters"), "{e}");
    }
    let grads = run_threads(2, GROUP_TIMEOUT, |pg| {
        let config = DdpConfig::default().find_unused_parameters(true);
        let mut ddp = DistributedDataParallel::<f32>::new(&pg, &params, config).unwrap();
        ddp.mark_grad_ready(0, &[pg.rank() as f32 + 1.0; 4])
            .unwrap();
        // Only rank 1 uses the head in this step.
        if pg.rank() == 1 {
            ddp.mark_grad_ready(1, &[4.0, 8.0]).unwrap();
        }
        ddp.finish().unwrap();
        assert!(ddp.unused_everywhere().is_empty(), "rank 1 used the head");
        (ddp.grad(0).unwrap().to_vec(), ddp.grad(1).unwrap().to_vec())
    });
    for (used, unused) in &grads {
        assert_eq!(used, &vec![1.5f32; 4]);
        assert_eq!(unused, &vec![2.0f32, 4.0]); // (0 + 4) / 2, (0 + 8) / 2
    }
}

/// Under find_unused_parameters every rank learns which parameters no rank produced a
/// gradient for in the step (torch's globally unused parameters, whose gradient torch
/// leaves untouched): here the head, in the second step; a gradient accumulated under
/// no_sync counts as used in the synchronised step that follows. Every step matches
/// PyTorch DDP's (`scripts/torch_unused_parity.py`, torch 2.15: the head's gradient 1 at
/// step 1, left `None` at step 2, 1 at step 3).
#[test]
fn parameters_unused_on_every_rank_are_named_on_every_rank() {
    let _heavy = heavy_lock();
    let params = vec![
        ParamSpec::new("trunk", 4, DType::F32),
        ParamSpec::new("head", 2, DType::F32),
    ];
    let seen = run_threads(3, GROUP_TIMEOUT, |pg| {
        let config = DdpConfig::default().find_unused_parameters(true);
        let mut ddp = DistributedDataParallel::<f32>::new(&pg, &params, config).unwrap();
        let mut seen = Vec::new();
        // Step 1: only rank 2 uses the head.
        ddp.mark_grad_ready(0, &[1.0; 4]).unwrap();
        if pg.rank() == 2 {
            ddp.mark_grad_ready(1, &[3.0, 3.0]).unwrap();
        }
        ddp.finish().unwrap();
        seen.push(ddp.unused_everywhere().to_vec());
        // torch's figures for this step (scripts/torch_unused_parity.py): trunk 1, head
        // (0 + 0 + 3) / 3 = 1.
        assert_eq!(ddp.grad(0).unwrap(), [1.0f32; 4]);
        assert_eq!(ddp.grad(1).unwrap(), [1.0f32; 2]);
        // Step 2: nobody uses it (torch: the head's .grad stays None).
        ddp.mark_grad_ready(0, &[1.0; 4]).unwrap();
        ddp.finish().unwrap();
        seen.push(ddp.unused_everywhere().to_vec());
        let head = ddp.grad(1).unwrap().to_vec();
        // Step 3: rank 0 uses it in a micro-batch without synchronisation only.
        ddp.set_no_sync(true);
        ddp.mark_grad_ready(0, &[1.0; 4]).unwrap();
        if pg.rank() == 0 {
            ddp.mark_grad_ready(1, &[3.0, 3.0]).unwrap();
        }
        ddp.finish().unwrap();
        ddp.set_no_sync(false);
        ddp.mark_grad_ready(0, &[1.0; 4]).unwrap();
        ddp.finish().unwrap();
        seen.push(ddp.unused_everywhere().to_vec());
        // torch: trunk 1 + 1 accumulated, head (3 + 0 + 0) / 3.
        assert_eq!(ddp.grad(0).unwrap(), [2.0f32; 4]);
        assert_eq!(ddp.grad(1).unwrap(), [1.0f32; 2]);
        (seen, head)
    });
    for (seen, head) in &seen {
        assert_eq!(seen, &vec![vec![], vec![1], vec![]]);
        assert_eq!(head, &vec![0.0f32; 2], "an unused gradient reads zero");
    }
}

/// Ranks whose DDP settings would run different collectives (here one rank with
/// find_unused_parameters, whose steps add the used-parameter sum) are refused when DDP
/// is created, on every rank, naming the setting and the rank.
#[test]
fn ranks_with_different_ddp_settings_are_refused_at_creation() {
    let _heavy = heavy_lock();
    let params = vec![ParamSpec::new("w", 4, DType::F32)];
    let errors = run_threads(3, GROUP_TIMEOUT, |pg| {
        let config = DdpConfig::default().find_unused_parameters(pg.rank() == 2);
        match DistributedDataParallel::<f32>::new(&pg, &params, config) {
            Ok(_) => "created".to_string(),
            Err(e) => e.to_string(),
        }
    });
    for e in &errors {
        assert!(
            e.contains("find_unused_parameters: rank 0 has false, rank 2 has true"),
            "{e}"
        );
    }
    let created = run_threads(2, GROUP_TIMEOUT, |pg| {
        let config = DdpConfig::default().bucket_cap_bytes(1 << 20);
        DistributedDataParallel::<f32>::new(&pg, &params, config).is_ok()
    });
    assert_eq!(created, [true, true], "the same settings everywhere pass");
}

#[test]
fn marking_twice_and_skipping_finish_are_errors_that_say_what_to_do() {
    let _heavy = heavy_lock();
    run_threads(1, GROUP_TIMEOUT, |pg| {
        let mut ddp =
            DistributedDataParallel::<f32>::new(&pg, &specs(), DdpConfig::default()).unwrap();
        ddp.mark_grad_ready(0, &[0.0; DIM]).unwrap();
        let twice = ddp.mark_grad_ready(0, &[0.0; DIM]).unwrap_err();
        assert!(
            matches!(twice, DdpError::GradReadyTwice { index: 0, .. }),
            "{twice}"
        );
        assert!(twice.to_string().contains("\"linear.weight\""), "{twice}");

        let mut ddp =
            DistributedDataParallel::<f32>::new(&pg, &specs(), DdpConfig::default()).unwrap();
        ddp.mark_grad_ready(1, &[0.0]).unwrap();
        ddp.mark_grad_ready(0, &[0.0; DIM]).unwrap();
        let next = ddp.mark_grad_ready(1, &[0.0]).unwrap_err();
        assert!(matches!(next, DdpError::StepNotFinished { .. }), "{next}");
        assert!(next.to_string().contains("finish()"), "{next}");

        // Both errors poison the instance (tests/ddp_api.rs pins each error's effect).
        let after = ddp.mark_grad_ready(0, &[0.0; DIM]);
        assert!(matches!(after, Err(DdpError::Broken(_))), "{after:?}");

        // A wrong length is refused before anything changes: the instance stays usable.
        let mut ddp =
            DistributedDataParallel::<f32>::new(&pg, &specs(), DdpConfig::default()).unwrap();
        let wrong_len = ddp.mark_grad_ready(0, &[0.0; 3]);
        assert!(matches!(wrong_len, Err(DdpError::InvalidArgument(_))));
        ddp.mark_grad_ready(0, &[0.0; DIM]).unwrap();
    });
}

#[test]
fn different_parameters_on_different_ranks_are_named() {
    let _heavy = heavy_lock();
    let errors = run_threads(3, GROUP_TIMEOUT, |pg| {
        let mut params = specs();
        params.push(ParamSpec::new("extra", 5, DType::F32));
        if pg.rank() == 2 {
            params[1] = ParamSpec::new("linear.bias", 2, DType::F32);
        }
        DistributedDataParallel::<f32>::new(&pg, &params, DdpConfig::default())
            .unwrap_err()
            .to_string()
    });
    assert!(errors[2].contains("parameter #1"), "{}", errors[2]);
    assert!(
        errors[2].contains("[1 x f32]") && errors[2].contains("[2 x f32]"),
        "{}",
        errors[2]
    );
    for e in &errors[..2] {
        assert!(e.contains("rank 2") && e.contains("parameter #1"), "{e}");
    }
}

#[test]
fn compression_hooks_stay_close_to_the_exact_average() {
    let _heavy = heavy_lock();
    for hook in ["fp16", "bf16"] {
        let results = run_threads(2, GROUP_TIMEOUT, |pg| {
            let mut ddp =
                DistributedDataParallel::<f32>::new(&pg, &specs(), DdpConfig::default()).unwrap();
            match hook {
                "fp16" => ddp.register_comm_hook(Fp16CompressHook),
                _ => ddp.register_comm_hook(Bf16CompressHook),
            }
            let g: Vec<f32> = (0..DIM)
                .map(|j| (j as f32 + 1.0) / 3.0 + pg.rank() as f32)
                .collect();
            ddp.mark_grad_ready(1, &[0.1]).unwrap();
            ddp.mark_grad_ready(0, &g).unwrap();
            ddp.finish().unwrap();
            ddp.grad(0).unwrap().to_vec()
        });
        let want: Vec<f32> = (0..DIM).map(|j| (j as f32 + 1.0) / 3.0 + 0.5).collect();
        let tol = if hook == "fp16" { 2e-3 } else { 1e-2 };
        assert!(close(&results[0], &want, tol), "{hook}: {:?}", results[0]);
        assert_eq!(results[0], results[1], "{hook}: ranks agree bit for bit");
        assert!(
            !close(&results[0], &want, 1e-7),
            "{hook}: the hook really narrowed"
        );
    }
}

#[test]
fn buckets_are_rebuilt_once_from_rank_zeros_arrival_order() {
    let _heavy = heavy_lock();
    let params: Vec<ParamSpec> = (0..6)
        .map(|i| ParamSpec::new(format!("p{i}"), 100, DType::F32))
        .collect();
    let layouts = run_threads(2, GROUP_TIMEOUT, |pg| {
        let config = DdpConfig::default()
            .first_bucket_bytes(800)
            .bucket_cap_bytes(800);
        let mut ddp = DistributedDataParallel::<f32>::new(&pg, &params, config).unwrap();
        let before = ddp.bucket_layout();
        // Rank 0's gradients arrive in registration order; rank 1's in reverse.
        let order: Vec<usize> = if pg.rank() == 0 {
            (0..6).collect()
        } else {
            (0..6).rev().collect()
        };
        for &i in &order {
            ddp.mark_grad_ready(i, &[i as f32; 100]).unwrap();
        }
        ddp.finish().unwrap();
        let after = ddp.bucket_layout();
        let kept = ddp.grad(4).unwrap().to_vec();
        // A second step keeps the layout.
        for &i in &order {
            ddp.mark_grad_ready(i, &[1.0; 100]).unwrap();
        }
        ddp.finish().unwrap();
        (before, after, kept, ddp.bucket_layout())
    });
    for (before, after, kept, later) in &layouts {
        assert_eq!(before, &vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
        assert_eq!(after, &vec![vec![0, 1], vec![2, 3], vec![4, 5]]);
        assert_eq!(kept, &vec![4.0f32; 100], "gradients survive the rebuild");
        assert_eq!(later, after);
    }
}
