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
        let ddp = linear(&pg);
        let out_of_range = ddp.grad(2).unwrap_err();
        assert!(
            matches!(out_of_range, DdpError::InvalidArgument(_)),
            "{out_of_range}"
        );
        assert!(
            out_of_range.to_string().contains("no parameter #2"),
            "{out_of_range}"
        );
        assert!(
            out_of_range
                .to_string()
                .contains(&format!("rank {}", pg.rank())),
            "{out_of_range}"
        );
    });
}

/// `grad` reads averages only: from a synchronised step's `finish` until the next
/// gradient is marked. Before that it says why, instead of handing out this rank's own
/// gradient as if it were the average; and the refusal changes nothing.
#[test]
fn grad_before_finish_is_an_error_that_says_so() {
    let averages = on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        let rank = pg.rank() as f32;
        let fresh = ddp.grad(0).unwrap_err().to_string();
        assert!(fresh.contains("no synchronised step"), "{fresh}");

        // The bias alone: its bucket (the only one) waits for the weight.
        ddp.mark_grad_ready(1, &[rank]).unwrap();
        for i in [0, 1] {
            let early = ddp.grad(i).unwrap_err();
            assert!(matches!(early, DdpError::InvalidArgument(_)), "{early}");
            let text = early.to_string();
            assert!(
                text.contains(&format!("grad({i}) before finish()")),
                "{text}"
            );
            assert!(text.contains("step 0"), "{text}");
            assert!(text.contains("not averaged"), "{text}");
        }
        assert!(ddp.grads().is_err());
        // Both marked: the bucket is on the wire.
        ddp.mark_grad_ready(0, &[rank, 2.0 * rank, 3.0]).unwrap();
        let in_flight = ddp.grad(0).unwrap_err().to_string();
        assert!(in_flight.contains("before finish()"), "{in_flight}");
        ddp.finish().unwrap();
        let first = ddp.grads().unwrap();

        // The next step's first gradient: the last averages are no longer readable.
        ddp.mark_grad_ready(1, &[10.0 + rank]).unwrap();
        let text = ddp.grad(0).unwrap_err().to_string();
        assert!(text.contains("step 1"), "{text}");
        ddp.mark_grad_ready(0, &[1.0; 3]).unwrap();
        ddp.finish().unwrap();
        (first, ddp.grads().unwrap())
    });
    for (first, second) in &averages {
        // (0 + 1) / 2 for the rank-dependent entries: never a rank's own value.
        assert_eq!(first, &vec![vec![0.5, 1.0, 3.0], vec![0.5]]);
        assert_eq!(second, &vec![vec![1.0; 3], vec![10.5]]);
    }
}

/// Under no_sync the buckets hold this rank's accumulated gradients (already divided by
/// the world size), which torch would show as `.grad` but which are no average: `grad`
/// refuses until the synchronised pass's `finish`.
#[test]
fn grad_under_no_sync_is_an_error_until_the_synchronised_finish() {
    let got = on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        let rank = pg.rank() as f32;
        {
            let mut quiet = ddp.no_sync();
            quiet.mark_grad_ready(1, &[rank]).unwrap();
            quiet.mark_grad_ready(0, &[rank; 3]).unwrap();
            let inside = quiet.grad(0).unwrap_err().to_string();
            assert!(inside.contains("no_sync"), "{inside}");
        }
        let after = ddp.grad(1).unwrap_err().to_string();
        assert!(after.contains("no_sync"), "{after}");
        assert!(after.contains("next synchronised pass"), "{after}");
        ddp.mark_grad_ready(1, &[1.0]).unwrap();
        ddp.mark_grad_ready(0, &[1.0; 3]).unwrap();
        ddp.finish().unwrap();
        ddp.grads().unwrap()
    });
    for grads in &got {
        // Summed over the two passes, averaged over the ranks: (0 + 1) / 2 + 1.
        assert_eq!(grads, &vec![vec![1.5; 3], vec![1.5]]);
    }
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

// Each DdpError's documented effect (DdpError's rustdoc, and docs/ddp.md "Errors"): the
// error, then what the following calls return.

/// The call returned `DdpError::Broken` naming `first` (a piece of the first error).
fn assert_broken<V: std::fmt::Debug>(result: Result<V, DdpError>, first: &str) {
    match result {
        Err(DdpError::Broken(cause)) => assert!(cause.contains(first), "{cause}"),
        other => panic!("expected Broken naming {first:?}, got {other:?}"),
    }
}

/// Every call of a poisoned instance that returns a `Result` refuses, `grad` included,
/// naming the first error; the process group is not affected (unless that error was the
/// group's own).
fn assert_poisoned(ddp: &mut DistributedDataParallel<f32>, first: &str) {
    assert_broken(ddp.mark_grad_ready(1, &[1.0]), first);
    assert_broken(ddp.mark_grad_ready(0, &[1.0; 3]), first);
    assert_broken(ddp.finish(), first);
    assert_broken(ddp.grad(0), first);
    assert_broken(ddp.grad(1), first);
    assert_broken(ddp.grads(), first);
    assert_broken(
        ddp.broadcast_parameters(&mut [&mut [0.0; 3], &mut [0.0]]),
        first,
    );
    assert_broken(ddp.restore_bucket_order(&[0, 1]), first);
    assert_broken(ddp.mark_grad_ready_in_view(0), first);
    assert_broken(ddp.grad_view_mut(0), first);
    // Still the first error after more misuse.
    assert_broken(ddp.mark_grad_ready(7, &[]), first);
}

#[test]
fn invalid_arguments_leave_the_instance_usable() {
    let grads = on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        let rank = pg.rank();
        let refused = [
            ddp.mark_grad_ready(5, &[1.0]).unwrap_err(),
            ddp.mark_grad_ready(0, &[1.0]).unwrap_err(), // 1 element, not 3
            ddp.mark_grad_ready_in_view(0).unwrap_err(), // no gradient_as_bucket_view
            ddp.grad_view_mut(0).unwrap_err(),
            ddp.broadcast_parameters(&mut []).unwrap_err(),
            ddp.grad(0).unwrap_err(), // before any finish()
        ];
        for error in &refused {
            assert!(matches!(error, DdpError::InvalidArgument(_)), "{error}");
            assert!(
                error.to_string().contains(&format!("rank {rank}")),
                "{error}"
            );
        }
        assert!(refused[1].to_string().contains("registered with 3"));
        // Mid-pass, the layout cannot change; the pass goes on regardless.
        ddp.mark_grad_ready(1, &[rank as f32]).unwrap();
        let mid_pass = ddp.restore_bucket_order(&[0, 1]).unwrap_err();
        assert!(
            matches!(mid_pass, DdpError::InvalidArgument(_)),
            "{mid_pass}"
        );
        ddp.mark_grad_ready(0, &[rank as f32; 3]).unwrap();
        ddp.finish().unwrap();
        // Between passes, an order that is no permutation is refused on every rank alike.
        let not_a_permutation = ddp.restore_bucket_order(&[1, 1]).unwrap_err();
        assert!(
            matches!(not_a_permutation, DdpError::InvalidArgument(_)),
            "{not_a_permutation}"
        );
        ddp.restore_bucket_order(&[0, 1]).unwrap();
        ddp.grads().unwrap()
    });
    for grads in &grads {
        assert_eq!(grads, &vec![vec![0.5; 3], vec![0.5]]);
    }
}

#[test]
fn grad_ready_twice_poisons_the_instance() {
    on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        ddp.mark_grad_ready(1, &[1.0]).unwrap();
        let twice = ddp.mark_grad_ready(1, &[2.0]).unwrap_err();
        assert!(
            matches!(
                twice,
                DdpError::GradReadyTwice {
                    index: 1,
                    step: 0,
                    ..
                }
            ),
            "{twice}"
        );
        assert_poisoned(&mut ddp, "marked ready twice");
        // DDP's own misuse leaves the group alone.
        pg.barrier().unwrap();
    });
}

#[test]
fn step_not_finished_poisons_the_instance() {
    on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        ddp.mark_grad_ready(1, &[1.0]).unwrap();
        ddp.mark_grad_ready(0, &[1.0; 3]).unwrap(); // the bucket goes on the wire
        let early = ddp.mark_grad_ready(1, &[1.0]).unwrap_err();
        assert!(
            matches!(
                early,
                DdpError::StepNotFinished {
                    index: 1,
                    step: 0,
                    ..
                }
            ),
            "{early}"
        );
        assert_poisoned(&mut ddp, "before step 0 was finished");
        // The bucket's all-reduce still completed on both ranks, before this barrier.
        pg.barrier().unwrap();
    });
}

#[test]
fn missing_grads_poison_the_instance() {
    on_ranks(2, |pg| {
        let mut ddp = linear(&pg);
        ddp.mark_grad_ready(1, &[1.0]).unwrap();
        let missing = ddp.finish().unwrap_err();
        assert!(
            matches!(&missing, DdpError::MissingGrads { step: 0, missing, .. }
                if missing == &[(0, "linear.weight".to_string())]),
            "{missing}"
        );
        assert_poisoned(&mut ddp, "received no gradient");
        pg.barrier().unwrap();
    });
}

/// A failed collective: rank 1 issues an all-reduce of another size while rank 0's
/// bucket is on the wire; the group names the mismatch on both ranks.
#[test]
fn communication_errors_poison_the_instance() {
    use ringccl::{local_groups_with, InitOptions};
    use std::time::Duration;
    let opts = InitOptions::new(0, 2, "127.0.0.1:0").timeout(Duration::from_secs(20));
    let groups = local_groups_with("gloo", 2, opts).expect("local groups");
    thread::scope(|scope| {
        for pg in groups {
            scope.spawn(move || {
                let mut ddp = linear(&pg);
                if pg.rank() == 1 {
                    let mut other = [1.0f32; 5];
                    assert!(pg.all_reduce(&mut other, ReduceOp::Sum).is_err());
                    return;
                }
                ddp.mark_grad_ready(1, &[1.0]).unwrap();
                ddp.mark_grad_ready(0, &[1.0; 3]).unwrap();
                let failed = ddp.finish().unwrap_err();
                assert!(matches!(failed, DdpError::Comm(_)), "{failed}");
                let first = failed.to_string();
                let first = first.split(':').next().unwrap_or_default();
                assert_poisoned(&mut ddp, first);
            });
        }
    });
}

/// A communicator that hands the used-parameter map (the only f32 all-reduce of an f64
/// DDP) back as f64: DDP's bookkeeping cannot be right after that.
#[derive(Clone)]
struct Garbling(ProcessGroup);

impl ringccl::ddp::Communicator for Garbling {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn all_reduce_sum_async(
        &self,
        buf: ringccl::ddp::GradBuf,
    ) -> Result<ringccl::ddp::Pending<ringccl::ddp::GradBuf>, ringccl::RuntimeError> {
        use ringccl::ddp::{Communicator, GradBuf, Ready};
        match buf {
            GradBuf::F32(map) => Ok(Box::new(Ready(GradBuf::F64(
                map.into_iter().map(f64::from).collect(),
            )))),
            other => Communicator::all_reduce_sum_async(&self.0, other),
        }
    }
    fn broadcast(
        &self,
        buf: ringccl::BufferMut<'_>,
        root: usize,
    ) -> Result<(), ringccl::RuntimeError> {
        ringccl::ddp::Communicator::broadcast(&self.0, buf, root)
    }
    fn all_gather_i64(
        &self,
        input: &[i64],
        output: &mut [i64],
    ) -> Result<(), ringccl::RuntimeError> {
        ringccl::ddp::Communicator::all_gather_i64(&self.0, input, output)
    }
}

#[test]
fn internal_errors_poison_the_instance() {
    on_ranks(1, |pg| {
        let config = DdpConfig::default().find_unused_parameters(true);
        let mut ddp =
            DistributedDataParallel::<f64>::with_params(&Garbling(pg), [("w", 2)], config).unwrap();
        ddp.mark_grad_ready(0, &[1.0, 2.0]).unwrap();
        let internal = ddp.finish().unwrap_err();
        assert!(matches!(internal, DdpError::Internal(_)), "{internal}");
        assert!(internal.to_string().contains("rank 0"), "{internal}");
        match ddp.grad(0) {
            Err(DdpError::Broken(cause)) => assert!(cause.contains("internal error"), "{cause}"),
            other => panic!("expected Broken, got {other:?}"),
        }
        match ddp.mark_grad_ready(0, &[1.0, 2.0]) {
            Err(DdpError::Broken(cause)) => assert!(cause.contains("internal error"), "{cause}"),
            other => panic!("expected Broken, got {other:?}"),
        }
    });
}

/// ParamMismatch and ConfigMismatch come from `new` on every rank: no instance, and the
/// group goes on (a matching DDP on it then trains).
#[test]
fn mismatches_leave_no_instance_and_the_group_usable() {
    let averages = on_ranks(2, |pg| {
        let rank = pg.rank();
        let numel = if rank == 1 { 4 } else { 3 };
        let params = DistributedDataParallel::<f32>::with_params(
            &pg,
            [("linear.weight", numel), ("linear.bias", 1)],
            DdpConfig::default(),
        )
        .unwrap_err();
        assert!(matches!(params, DdpError::ParamMismatch { .. }), "{params}");
        let config = DdpConfig::default().find_unused_parameters(rank == 1);
        let settings = DistributedDataParallel::<f32>::with_params(
            &pg,
            [("linear.weight", 3), ("linear.bias", 1)],
            config,
        )
        .unwrap_err();
        assert!(
            matches!(settings, DdpError::ConfigMismatch { .. }),
            "{settings}"
        );
        let mut ddp = linear(&pg);
        ddp.mark_grad_ready(1, &[rank as f32]).unwrap();
        ddp.mark_grad_ready(0, &[1.0; 3]).unwrap();
        ddp.finish().unwrap();
        ddp.grad(1).unwrap().to_vec()
    });
    assert_eq!(averages, vec![vec![0.5], vec![0.5]]);
}

#[derive(Clone)]
struct Scale {
    w: Vec<f32>,
}

impl ringccl::ddp::Replica<f32> for Scale {
    fn params(&self) -> Vec<&[f32]> {
        vec![&self.w]
    }
    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.w]
    }
}

/// A failed DataParallel step (replica 1 sets no gradient) changes nothing: the next step
/// runs and is the first one counted.
#[test]
fn replica_errors_leave_data_parallel_usable() {
    use ringccl::ddp::DataParallel;
    let mut dp = DataParallel::new(Scale { w: vec![1.0] }, 2).unwrap();
    let batch = [1.0f32, 3.0];
    let step = |dp: &mut DataParallel<Scale, f32>, fail: bool| {
        dp.step(&batch, |model, shard, grads| {
            if !(fail && grads.replica() == 1) {
                grads.set(0, &[model.w[0] * shard[0]])?;
            }
            Ok::<(), DdpError>(())
        })
    };
    let failed = step(&mut dp, true).unwrap_err();
    assert!(
        matches!(failed, DdpError::Replica { replica: 1, .. }),
        "{failed}"
    );
    assert_eq!(dp.steps(), 0);
    assert_eq!(dp.master().w, [1.0]);
    step(&mut dp, false).unwrap();
    assert_eq!(dp.steps(), 1);
    assert_eq!(dp.grads()[0], [2.0]); // (1 + 3) / 2
}

#[test]
fn checkpoint_errors_leave_the_checkpoint_usable() {
    use ringccl::ddp::{BatchPosition, Checkpoint};
    let mut checkpoint = Checkpoint::new(7, BatchPosition::default());
    checkpoint.put("w", &[1.0f32, 2.0]);
    let missing = checkpoint.get::<f32>("v").unwrap_err();
    assert!(matches!(missing, DdpError::Checkpoint(_)), "{missing}");
    let wrong_type = checkpoint.get::<f64>("w").unwrap_err();
    assert!(
        matches!(wrong_type, DdpError::Checkpoint(_)),
        "{wrong_type}"
    );
    assert_eq!(checkpoint.get::<f32>("w").unwrap(), [1.0, 2.0]);
}
