//! Data-parallel training of a small MLP with hand-written forward and backward passes.
//!
//! ```sh
//! cargo build --release --examples --bins
//! target/release/ringrun --nproc-per-node 4 target/release/examples/ddp_mlp --local-batch 16 --steps 50
//! target/release/ringrun --nproc-per-node 1 target/release/examples/ddp_mlp --local-batch 64 --steps 50
//! ```
//!
//! Both print the same `final_params_l2=` (up to float rounding): 4 ranks × 16 samples
//! average to the same gradient as 1 rank × 64 samples, because the sampler gives the 4
//! ranks together exactly the 64 samples the single rank sees, and DDP averages.
//!
//! Rank 0 prints the loss (over the global batch). `--overlap off` marks every gradient
//! only after the whole backward pass (no overlap), for comparison; `--hook fp16|bf16`
//! compresses the gradients on the wire. With `--hidden 2048 --layers 6 --input 1024` the
//! model has about 25M parameters; the `step_time_ms` line then measures the overlap.
//!
//! `ringrun --trace DIR ...` writes the timeline of every rank and merges it into
//! `DIR/trace.json` (Perfetto, chrome://tracing; `scripts/trace-to-png.py` draws it):
//! forward and backward on each rank's `trainer` row, the buckets on its `ddp` row.

use std::time::Instant;

use clap::Parser;
use ringccl::ddp::{
    Bf16CompressHook, DdpConfig, DistributedDataParallel, DistributedSampler, Fp16CompressHook,
    ParamSpec,
};
use ringccl::{init_process_group, DType, InitOptions, ReduceOp};

#[derive(Parser, Debug)]
struct Args {
    /// Samples per rank per step.
    #[arg(long, default_value_t = 16)]
    local_batch: usize,
    /// Optimiser steps.
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// Seed for the data, the initial parameters and the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Input features.
    #[arg(long, default_value_t = 8)]
    input: usize,
    /// Hidden units per layer.
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Dataset size.
    #[arg(long, default_value_t = 1024)]
    dataset: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
    /// Print the loss every this many steps.
    #[arg(long, default_value_t = 10)]
    print_every: usize,
    /// on: mark each gradient as backward produces it; off: all after backward.
    #[arg(long, default_value = "on")]
    overlap: String,
    /// Communication hook: allreduce, fp16 or bf16.
    #[arg(long, default_value = "allreduce")]
    hook: String,
    /// DDP's bucket size in MiB (torch's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    bucket_cap_mb: f64,
    /// Backend: gloo or nccl.
    #[arg(long, default_value = "gloo")]
    backend: String,
}

/// Deterministic pseudo-random numbers in [-1, 1).
fn uniform(seed: u64, i: u64) -> f32 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// One dense layer: `out = act(W x + b)`, W stored row-major as [out][in].
struct Layer {
    w: Vec<f32>,
    b: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

/// A dot product with eight accumulators, so the compiler can vectorise it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

struct Mlp {
    layers: Vec<Layer>,
}

impl Mlp {
    fn new(args: &Args) -> Mlp {
        let mut dims = vec![args.input];
        dims.extend(std::iter::repeat_n(args.hidden, args.layers));
        dims.push(1);
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(l, d)| {
                let scale = (1.0 / d[0] as f32).sqrt();
                let salt = args.seed ^ ((l as u64 + 1) << 32);
                Layer {
                    w: (0..d[0] * d[1])
                        .map(|i| scale * uniform(salt, i as u64))
                        .collect(),
                    b: vec![0.0; d[1]],
                    inputs: d[0],
                    outputs: d[1],
                }
            })
            .collect();
        Mlp { layers }
    }

    fn specs(&self) -> Vec<ParamSpec> {
        let mut specs = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            specs.push(ParamSpec::new(
                format!("layer{l}.weight"),
                layer.w.len(),
                DType::F32,
            ));
            specs.push(ParamSpec::new(
                format!("layer{l}.bias"),
                layer.b.len(),
                DType::F32,
            ));
        }
        specs
    }

    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        let mut out: Vec<&mut [f32]> = Vec::new();
        for layer in &mut self.layers {
            out.push(&mut layer.w);
            out.push(&mut layer.b);
        }
        out
    }

    /// The forward pass over a batch: the activations of every layer (`[0]` = inputs).
    fn forward(&self, x: &[Vec<f32>]) -> Vec<Vec<Vec<f32>>> {
        let last = self.layers.len() - 1;
        let mut acts: Vec<Vec<Vec<f32>>> = vec![x.to_vec()];
        for (l, layer) in self.layers.iter().enumerate() {
            let out: Vec<Vec<f32>> = acts[l]
                .iter()
                .map(|h| {
                    (0..layer.outputs)
                        .map(|o| {
                            let row = &layer.w[o * layer.inputs..(o + 1) * layer.inputs];
                            let z = dot(row, h) + layer.b[o];
                            if l == last {
                                z
                            } else {
                                z.tanh()
                            }
                        })
                        .collect()
                })
                .collect();
            acts.push(out);
        }
        acts
    }

    /// The backward pass from `forward`'s activations; returns the mean loss.
    /// `ready(index, grad)` is called as each parameter's gradient (of the mean loss) is
    /// produced, last layer first.
    fn backward(
        &self,
        acts: &[Vec<Vec<f32>>],
        y: &[f32],
        mut ready: impl FnMut(usize, &[f32]) -> Result<(), ringccl::ddp::DdpError>,
    ) -> Result<f32, ringccl::ddp::DdpError> {
        let batch = y.len();
        let last = self.layers.len() - 1;
        let mut loss = 0.0f32;
        // d(mean loss)/d(output): (pred - y) / batch.
        let mut delta: Vec<Vec<f32>> = (0..batch)
            .map(|i| {
                let err = acts[last + 1][i][0] - y[i];
                loss += 0.5 * err * err;
                vec![err / batch as f32]
            })
            .collect();
        for l in (0..=last).rev() {
            let layer = &self.layers[l];
            if l != last {
                // Through tanh: d/dz = delta * (1 - a^2).
                for (d, a) in delta.iter_mut().zip(&acts[l + 1]) {
                    for (d, a) in d.iter_mut().zip(a) {
                        *d *= 1.0 - a * a;
                    }
                }
            }
            let mut gw = vec![0.0f32; layer.w.len()];
            let mut gb = vec![0.0f32; layer.outputs];
            for (d, h) in delta.iter().zip(&acts[l]) {
                for o in 0..layer.outputs {
                    axpy(d[o], h, &mut gw[o * layer.inputs..(o + 1) * layer.inputs]);
                    gb[o] += d[o];
                }
            }
            ready(2 * l + 1, &gb)?;
            ready(2 * l, &gw)?;
            if l > 0 {
                delta = delta
                    .iter()
                    .map(|d| {
                        let mut back = vec![0.0f32; layer.inputs];
                        for (&d, row) in d.iter().zip(layer.w.chunks_exact(layer.inputs)) {
                            axpy(d, row, &mut back);
                        }
                        back
                    })
                    .collect();
            }
        }
        Ok(loss / batch as f32)
    }
}

fn target(x: &[f32]) -> f32 {
    x.iter()
        .enumerate()
        .map(|(j, v)| (v * (j as f32 + 1.0)).sin() / (j as f32 + 1.0))
        .sum()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let opts = InitOptions::from_env()?;
    let pg = init_process_group(&args.backend, opts)?;
    let (rank, n) = (pg.rank(), pg.world_size());

    let data: Vec<Vec<f32>> = (0..args.dataset)
        .map(|i| {
            (0..args.input)
                .map(|j| uniform(args.seed ^ 0xDA7A, (i * args.input + j) as u64))
                .collect()
        })
        .collect();
    let labels: Vec<f32> = data.iter().map(|x| target(x)).collect();

    let mut model = Mlp::new(&args);
    let config =
        DdpConfig::default().bucket_cap_bytes((args.bucket_cap_mb * (1 << 20) as f64) as usize);
    let mut ddp = DistributedDataParallel::<f32>::new(&pg, &model.specs(), config)?;
    match args.hook.as_str() {
        "allreduce" => {}
        "fp16" => ddp.register_comm_hook(Fp16CompressHook),
        "bf16" => ddp.register_comm_hook(Bf16CompressHook),
        other => return Err(format!("unknown --hook {other}").into()),
    }
    ddp.broadcast_parameters(&mut model.params_mut())?;

    let mut sampler = DistributedSampler::new(args.dataset, n, rank)?.seed(args.seed);
    let per_epoch = sampler.num_samples() / args.local_batch;
    if per_epoch == 0 {
        return Err("the dataset is too small for this batch size".into());
    }
    let mut epoch_indices = Vec::new();
    let mut step_times = Vec::new();
    for step in 0..args.steps {
        let (epoch, within) = (step / per_epoch, step % per_epoch);
        if within == 0 {
            sampler.set_epoch(epoch as u64);
            epoch_indices = sampler.indices();
        }
        let batch = &epoch_indices[within * args.local_batch..(within + 1) * args.local_batch];
        let x: Vec<Vec<f32>> = batch.iter().map(|&i| data[i].clone()).collect();
        let y: Vec<f32> = batch.iter().map(|&i| labels[i]).collect();

        let started = Instant::now();
        // Under RINGCCL_TRACE (ringrun --trace), the trainer row of the timeline shows
        // forward and backward, and the ddp row the buckets' all-reduces overlapping them.
        let forward = ddp.trainer_span("forward");
        let acts = model.forward(&x);
        drop(forward);
        let backward = ddp.backward_span();
        let loss = if args.overlap == "off" {
            let mut grads: Vec<(usize, Vec<f32>)> = Vec::new();
            let loss = model.backward(&acts, &y, |i, g| {
                grads.push((i, g.to_vec()));
                Ok(())
            })?;
            drop(backward);
            for (i, g) in grads {
                ddp.mark_grad_ready(i, &g)?;
            }
            loss
        } else {
            let loss = model.backward(&acts, &y, |i, g| ddp.mark_grad_ready(i, g))?;
            drop(backward);
            loss
        };
        ddp.finish()?;
        for (i, p) in model.params_mut().into_iter().enumerate() {
            for (p, g) in p.iter_mut().zip(ddp.grad(i)?) {
                *p -= args.lr * g;
            }
        }
        step_times.push(started.elapsed().as_secs_f64());

        let mut global = [loss / n as f32];
        pg.all_reduce(&mut global, ReduceOp::Sum)?;
        if rank == 0 && (step % args.print_every == 0 || step + 1 == args.steps) {
            println!("step {step:4} loss {:.6}", global[0]);
        }
    }
    let l2: f64 = model
        .params_mut()
        .iter()
        .flat_map(|p| p.iter())
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    // The slowest rank's median step time (after the first step, which rebuilds buckets).
    let mut times = step_times.split_off(1.min(step_times.len()));
    times.sort_by(f64::total_cmp);
    let mut median = [times.get(times.len() / 2).copied().unwrap_or(0.0)];
    pg.all_reduce(&mut median, ReduceOp::Max)?;
    if rank == 0 {
        println!(
            "step_time_ms={:.3} (median over steps 2..{}, slowest rank; {} ranks, overlap {}, hook {})",
            median[0] * 1e3,
            args.steps,
            n,
            args.overlap,
            args.hook
        );
        println!("final_params_l2={l2:.8e}");
    }
    pg.barrier()?;
    Ok(())
}
