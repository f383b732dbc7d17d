//! The DDP API's ergonomics, each fix checked on real groups (in-process, over
//! `local_groups`): grad() refuses instead of returning an empty slice; no_sync needs no
//! extra finish(); one error type with `?` both ways; the parameter dtype given once; DDP
//! owns its handle on the group; the sampler's batches resume mid-epoch.

use std::thread;

use ringccl::ddp::{
    BatchPosition, DdpConfig, DdpError, DistributedDataParallel, DistributedSampler,
};
use ringccl::{local_groups, DType, Error, ProcessGroup, ReduceOp};

/// Runs `body` on every rank of an in-process group of `n`, one thread each.
fn on_ranks<R: Send>(n: usize, body: impl Fn(ProcessGroup) -> R + Sync) -> Vec<R> {
    let groups = local_groups("gloo", n).expect("local groups");
    thread::scope(|scope| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|pg| scope.spawn(|| body(pg)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn linear(pg: &ProcessGroup) -> DistributedDataParallel<f32> {
    DistributedDataParallel::<f32>::with_params(
        pg,
        [("linear.weight", 3), ("linear.bias", 1)],
        DdpConfig::default(),
    )
    .expect("ddp")
}

#[test]
fn grad_is_an_error_never_an_empty_slice() {
    on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        let out_of_range = ddp.grad(2).unwrap_err();
        assert!(
            matches!(out_of_range, DdpError::InvalidArgument(_)),
            "{out_of_range}"
        );
        assert!(
            out_of_range.to_string().contains("no parameter #2"),
            "{out_of_range}"
        );

        // Both gradients marked: the one bucket is on the wire until finish().
        ddp.mark_grad_ready(1, &[1.0]).unwrap();
        ddp.mark_grad_ready(0, &[1.0, 2.0, 3.0]).unwrap();
        let in_flight = ddp.grad(0).unwrap_err().to_string();
        assert!(in_flight.contains("still being all-reduced"), "{in_flight}");
        assert!(in_flight.contains("finish()"), "{in_flight}");
        ddp.finish().unwrap();
        assert_eq!(ddp.grad(0).unwrap(), &[1.0, 2.0, 3.0]);
        assert_eq!(ddp.grads().unwrap().len(), 2);
    });
}

/// k micro-batches: k-1 without synchronisation, in the style `style`, then one
/// synchronised pass; returns the averaged gradient of the weight.
fn accumulate(pg: &ProcessGroup, k: usize, style: &str) -> Vec<f32> {
    let mut ddp = linear(pg);
    let grad = |m: usize| -> Vec<f32> {
        let base = (m * 10 + pg.rank()) as f32;
        vec![base, base + 0.5, -base]
    };
    for m in 0..k - 1 {
        match style {
            // torch's shape: the guard's scope, nothing else.
            "guard" => {
                let mut quiet = ddp.no_sync();
                quiet.mark_grad_ready(1, &[1.0]).unwrap();
                quiet.mark_grad_ready(0, &grad(m)).unwrap();
            }
            // Synchronisation off for the whole accumulation, passes back to back.
            "switch" => {
                ddp.set_no_sync(true);
                ddp.mark_grad_ready(1, &[1.0]).unwrap();
                ddp.mark_grad_ready(0, &grad(m)).unwrap();
            }
            // The old code: finish() inside the guard, or after it.
            "finish inside" => {
                let mut quiet = ddp.no_sync();
                quiet.mark_grad_ready(1, &[1.0]).unwrap();
                quiet.mark_grad_ready(0, &grad(m)).unwrap();
                quiet.finish().unwrap();
            }
            "finish after" => {
                {
                    let mut quiet = ddp.no_sync();
                    quiet.mark_grad_ready(1, &[1.0]).unwrap();
                    quiet.mark_grad_ready(0, &grad(m)).unwrap();
                }
                ddp.finish().unwrap();
            }
            other => panic!("unknown style {other}"),
        }
    }
    ddp.set_no_sync(false);
    ddp.mark_grad_ready(1, &[1.0]).unwrap();
    ddp.mark_grad_ready(0, &grad(k - 1)).unwrap();
    ddp.finish().unwrap();
    assert_eq!(ddp.grad(1).unwrap(), &[k as f32], "bias: k passes of 1.0");
    ddp.grad(0).unwrap().to_vec()
}

#[test]
fn no_sync_needs_no_extra_finish() {
    let k = 3;
    // Averaged over the 2 ranks, summed over the k micro-batches.
    let want: Vec<f32> = (0..3)
        .map(|j| {
            (0..k)
                .flat_map(|m| (0..2).map(move |r| (m, r)))
                .map(|(m, r)| {
                    let base = (m * 10 + r) as f32;
                    [base, base + 0.5, -base][j] / 2.0
                })
                .sum()
        })
        .collect();
    for style in ["guard", "switch", "finish inside", "finish after"] {
        for got in on_ranks(2, |pg| accumulate(&pg, k, style)) {
            assert_eq!(got, want, "{style}");
        }
    }
}

#[test]
fn one_error_type_with_question_mark_both_ways() {
    on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        // A backward callback that returns DdpError can call the group with `?`.
        let backward = |ddp: &mut DistributedDataParallel<f32>| -> Result<(), DdpError> {
            let mut loss = [1.0f32];
            pg.all_reduce(&mut loss, ReduceOp::Sum)?;
            ddp.mark_grad_ready(1, &[loss[0]])?;
            Ok(())
        };
        backward(&mut ddp).unwrap();
        // A trainer that returns ringccl::Error can call DDP with `?`.
        let finish = |ddp: &mut DistributedDataParallel<f32>| -> Result<(), Error> {
            ddp.finish()?;
            Ok(())
        };
        let missing = finish(&mut ddp).unwrap_err();
        let Error::Ddp(inner) = &missing else {
            panic!("expected Error::Ddp, got {missing:?}");
        };
        assert!(matches!(**inner, DdpError::MissingGrads { .. }), "{inner}");
        assert!(missing.to_string().contains("linear.weight"), "{missing}");
        // Back again: the same DdpError, not a wrapped copy.
        let back = DdpError::from(missing);
        assert!(matches!(back, DdpError::MissingGrads { .. }), "{back}");
        // A communication failure travels as the runtime's own variant both ways.
        let comm = DdpError::from(Error::InvalidArgument("bad root".into()));
        assert!(matches!(Error::from(comm), Error::InvalidArgument(_)));
    });
}

#[test]
fn parameters_are_given_without_repeating_the_dtype() {
    on_ranks(2, |pg| {
        let ddp = DistributedDataParallel::<f64>::with_params(
            &pg,
            vec![("a".to_string(), 4), ("b".to_string(), 2)],
            DdpConfig::default(),
        )
        .unwrap();
        assert!(ddp.params().iter().all(|p| p.dtype == DType::F64));
        assert_eq!(ddp.params()[1].numel, 2);
    });
}

/// A trainer keeps the group, the model and DDP side by side in one struct.
struct Trainer {
    pg: ProcessGroup,
    ddp: DistributedDataParallel<f32>,
    weight: Vec<f32>,
}

impl Trainer {
    fn step(&mut self, grad: &[f32]) -> Result<f32, Error> {
        self.ddp.mark_grad_ready(1, &[0.0])?;
        self.ddp.mark_grad_ready(0, grad)?;
        self.ddp.finish()?;
        for (w, g) in self.weight.iter_mut().zip(self.ddp.grad(0)?) {
            *w -= g;
        }
        let mut sum = [self.weight.iter().sum::<f32>()];
        self.pg.all_reduce(&mut sum, ReduceOp::Sum)?;
        Ok(sum[0])
    }
}

#[test]
fn ddp_owns_its_handle_on_the_group() {
    let sums = on_ranks(2, |pg| {
        let ddp = linear(&pg);
        let mut trainer = Trainer {
            pg: pg.clone(),
            ddp,
            weight: vec![0.0; 3],
        };
        drop(pg); // the trainer's handles keep the group alive
        let grad = [trainer.pg.rank() as f32; 3];
        trainer.step(&grad).unwrap()
    });
    // Each weight: -(0 + 1) / 2; 3 of them on each of 2 ranks.
    assert_eq!(sums, vec![-3.0, -3.0]);
}

#[test]
fn sampler_batches_resume_mid_epoch_on_every_rank() {
    // Two ranks stop after 7 steps and resume from the saved position; together they
    // visit what they would have visited without the stop.
    for rank in 0..2 {
        let sampler = DistributedSampler::new(90, 2, rank).unwrap().seed(5);
        let straight: Vec<_> = sampler.batches(10).unwrap().take(12).collect();
        let mut first = sampler.batches(10).unwrap();
        let before: Vec<_> = first.by_ref().take(7).collect();
        let saved = first.position();
        assert_eq!(saved, BatchPosition { epoch: 1, step: 3 }); // 4 batches per epoch
        let after: Vec<_> = sampler.batches_from(10, saved).unwrap().take(5).collect();
        assert_eq!([before, after].concat(), straight);
    }
}

/// Trains `steps` steps on 3 ranks (ring all-reduce) whose backward marks gradients in a
/// scrambled order, starting from `params`; with `order`, the buckets are laid out in it
/// first (a resumed run). Returns rank 0's parameters and its DDP's bucket order.
fn scrambled_training(
    params: &[Vec<f32>],
    first_step: usize,
    steps: usize,
    order: Option<&[usize]>,
) -> (Vec<Vec<f32>>, Vec<usize>) {
    use ringccl::{local_groups_with, AllReduceAlgo, InitOptions};
    let opts = InitOptions::new(0, 3, "127.0.0.1:0").all_reduce_algo(AllReduceAlgo::Ring);
    let groups = local_groups_with("gloo", 3, opts).expect("local groups");
    let outcomes: Vec<(Vec<Vec<f32>>, Vec<usize>)> = thread::scope(|scope| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|pg| {
                scope.spawn(move || {
                    let names = ["a", "b", "c", "d"];
                    let config = DdpConfig::default().bucket_cap_bytes(2048);
                    let shapes = names.iter().zip(params).map(|(n, p)| (*n, p.len()));
                    let mut ddp =
                        DistributedDataParallel::<f32>::with_params(&pg, shapes, config).unwrap();
                    if let Some(order) = order {
                        ddp.restore_bucket_order(order).unwrap();
                    }
                    let mut params = params.to_vec();
                    for step in first_step..first_step + steps {
                        // Not the reverse of registration: the first step's rebuild moves
                        // the buckets.
                        for i in [1, 3, 0, 2] {
                            let grad: Vec<f32> = params[i]
                                .iter()
                                .enumerate()
                                .map(|(j, p)| {
                                    (p * 1.7 + (pg.rank() * 31 + step * 7 + j) as f32 * 0.013).sin()
                                })
                                .collect();
                            ddp.mark_grad_ready(i, &grad).unwrap();
                        }
                        ddp.finish().unwrap();
                        for (i, p) in params.iter_mut().enumerate() {
                            for (v, g) in p.iter_mut().zip(ddp.grad(i).unwrap()) {
                                *v -= 0.1 * g;
                            }
                        }
                    }
                    (params, ddp.bucket_order())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    outcomes.into_iter().next().unwrap()
}

/// A resumed run that restores the saved bucket order reduces every step in the same
/// buckets as the uninterrupted run: the same parameters, bit for bit.
#[test]
fn a_restored_bucket_order_makes_a_resumed_run_bit_identical() {
    let start: Vec<Vec<f32>> = [300usize, 200, 500, 100]
        .iter()
        .enumerate()
        .map(|(k, &len)| {
            (0..len)
                .map(|j| ((k * 1000 + j) as f32 * 0.37).cos())
                .collect()
        })
        .collect();
    let (whole, order) = scrambled_training(&start, 0, 4, None);
    assert_ne!(order, vec![3, 2, 1, 0], "the rebuild moved the buckets");
    let (half, saved) = scrambled_training(&start, 0, 2, None);
    assert_eq!(saved, order);
    let (resumed, kept) = scrambled_training(&half, 2, 2, Some(&saved));
    assert_eq!(kept, order, "no second rebuild after a restore");
    let bits = |p: &[Vec<f32>]| -> Vec<u32> { p.iter().flatten().map(|v| v.to_bits()).collect() };
    assert_eq!(
        bits(&resumed),
        bits(&whole),
        "bit-identical to the uninterrupted run"
    );
    let (unrestored, _) = scrambled_training(&half, 2, 2, None);
    eprintln!(
        "without the restore, the resumed parameters are {}",
        if bits(&unrestored) == bits(&whole) {
            "the same bits (by luck of this data)"
        } else {
            "different bits"
        }
    );
}
