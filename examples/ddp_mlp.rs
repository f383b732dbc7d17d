//! Data-parallel training of a small MLP with hand-written forward and backward passes,
//! three ways: DDP over processes (under `ringrun`), DDP over threads of one process
//! (`--replicas R`, over `ringccl::local_groups`), and DataParallel (`--mode dp`).
//!
//! ```sh
//! cargo build --release --examples --bins
//! target/release/ringrun --nproc-per-node 4 target/release/examples/ddp_mlp --local-batch 16 --steps 50
//! target/release/ringrun --nproc-per-node 1 target/release/examples/ddp_mlp --local-batch 64 --steps 50
//! target/release/examples/ddp_mlp --mode ddp --replicas 4 --local-batch 16 --steps 50
//! target/release/examples/ddp_mlp --mode dp --replicas 4 --local-batch 16 --steps 50
//! ```
//!
//! All four print the same `final_params_l2=` (within float rounding, 1e-6 relative): 4
//! replicas × 16 samples average to the same gradient as 1 × 64, because the sampler
//! gives the 4 together exactly the 64 samples the single rank sees, and both DDP and
//! DataParallel average. `final_params_fnv=` hashes the parameters' bits, for checks
//! that must be bit for bit (a resumed run against an uninterrupted one).
//!
//! Rank 0 prints the loss (over the global batch). `--overlap off` marks every gradient
//! only after the whole backward pass (no overlap), for comparison; `--hook fp16|bf16`
//! compresses the gradients on the wire. With `--hidden 2048 --layers 6 --input 1024` the
//! model has about 25M parameters; the `step_time_ms` line then measures the overlap, and
//! `peak_rss_mb` the memory (summed over the processes under ringrun).
//!
//! `--checkpoint DIR --checkpoint-every K` snapshots the parameters, the momentum, the
//! step and the sampler position every K steps (rank 0 writes, atomically), and resumes
//! from the newest snapshot on start: under `ringrun --max-restarts 3`, a killed rank
//! costs the steps since the last snapshot, and the final parameters are bit for bit
//! those of an uninterrupted run.
//!
//! `ringrun --trace DIR ...` writes the timeline of every rank and merges it into
//! `DIR/trace.json` (Perfetto, chrome://tracing; `scripts/trace-to-png.py` draws it):
//! forward and backward on each rank's `trainer` row, the buckets on its `ddp` row.

use std::error::Error as StdError;
use std::path::PathBuf;
use std::time::Instant;

#[path = "shared/mlp_args.rs"]
mod mlp_args;
#[path = "shared/mlp_data.rs"]
mod mlp_data;
#[path = "shared/mlp_model.rs"]
mod mlp_model;
use mlp_args::MlpArgs;
use mlp_data::{sample, target};
use mlp_model::initial_weights;

use clap::Parser;
use ringccl::ddp::{
    BatchPosition, Bf16CompressHook, Checkpoint, DataParallel, DdpConfig, DdpError,
    DistributedDataParallel, DistributedSampler, Fp16CompressHook, Replica,
};
use ringccl::{
    init_process_group, local_groups, run_local_ranks, InitOptions, ProcessGroup, ReduceOp,
};

type Failure = Box<dyn StdError + Send + Sync>;

#[derive(Parser, Debug, Clone)]
struct Args {
    #[command(flatten)]
    mlp: MlpArgs,
    /// dp: DataParallel in this process; ddp: DistributedDataParallel.
    #[arg(long, default_value = "ddp")]
    mode: String,
    /// Optimiser steps.
    #[arg(long, default_value_t = 50)]
    steps: u64,
    /// SGD momentum (0: plain SGD).
    #[arg(long, default_value_t = 0.0)]
    momentum: f32,
    /// Print the loss every this many steps.
    #[arg(long, default_value_t = 10)]
    print_every: u64,
    /// Communication hook: allreduce, fp16 or bf16.
    #[arg(long, default_value = "allreduce")]
    hook: String,
    /// Backend: gloo or nccl.
    #[arg(long, default_value = "gloo")]
    backend: String,
    /// Snapshot directory: resume from its newest snapshot, and write new ones.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Steps between snapshots.
    #[arg(long, default_value_t = 10)]
    checkpoint_every: u64,
}

/// One dense layer: `out = act(W x + b)`, W stored row-major as [out][in].
#[derive(Clone)]
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

#[derive(Clone)]
struct Mlp {
    layers: Vec<Layer>,
}

impl Mlp {
    fn new(args: &Args) -> Mlp {
        let layers = args
            .mlp
            .widths()
            .windows(2)
            .enumerate()
            .map(|(l, d)| Layer {
                w: initial_weights(args.mlp.seed, l, d[0], d[1]),
                b: vec![0.0; d[1]],
                inputs: d[0],
                outputs: d[1],
            })
            .collect();
        Mlp { layers }
    }

    /// `(name, number of elements)` of every parameter, in parameter order.
    fn shapes(&self) -> Vec<(String, usize)> {
        let mut shapes = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            shapes.push((format!("layer{l}.weight"), layer.w.len()));
            shapes.push((format!("layer{l}.bias"), layer.b.len()));
        }
        shapes
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
        mut ready: impl FnMut(usize, &[f32]) -> Result<(), DdpError>,
    ) -> Result<f32, DdpError> {
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

impl Replica<f32> for Mlp {
    fn params(&self) -> Vec<&[f32]> {
        self.layers
            .iter()
            .flat_map(|l| [l.w.as_slice(), l.b.as_slice()])
            .collect()
    }

    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        let mut out: Vec<&mut [f32]> = Vec::new();
        for layer in &mut self.layers {
            out.push(&mut layer.w);
            out.push(&mut layer.b);
        }
        out
    }
}

/// The dataset: inputs and labels, the same in every replica.
struct Data {
    x: Vec<Vec<f32>>,
    y: Vec<f32>,
}

impl Data {
    fn new(args: &Args) -> Data {
        let x: Vec<Vec<f32>> = (0..args.mlp.dataset)
            .map(|i| sample(args.mlp.seed, args.mlp.input, i))
            .collect();
        let y = x.iter().map(|x| target(x)).collect();
        Data { x, y }
    }

    fn batch(&self, indices: &[usize]) -> (Vec<Vec<f32>>, Vec<f32>) {
        (
            indices.iter().map(|&i| self.x[i].clone()).collect(),
            indices.iter().map(|&i| self.y[i]).collect(),
        )
    }
}

/// Everything a snapshot holds: the model, the momentum, the steps taken and the next
/// batch's position.
struct State {
    model: Mlp,
    velocity: Vec<Vec<f32>>,
    step: u64,
    position: BatchPosition,
    /// DDP's bucket order when the snapshot was taken (empty: none saved, or DP).
    bucket_order: Vec<usize>,
}

/// The snapshot's name for DDP's bucket order.
const BUCKET_ORDER: &str = "ddp.bucket_order";

impl State {
    fn new(args: &Args) -> State {
        let model = Mlp::new(args);
        let velocity = model.params().iter().map(|p| vec![0.0; p.len()]).collect();
        State {
            model,
            velocity,
            step: 0,
            position: BatchPosition::default(),
            bucket_order: Vec::new(),
        }
    }

    /// SGD with momentum: `v = momentum v + g; p -= lr v` (plain `p -= lr g` at 0).
    fn sgd<'g>(
        model: &mut Mlp,
        velocity: &mut [Vec<f32>],
        args: &Args,
        grad: &dyn Fn(usize) -> Result<&'g [f32], DdpError>,
    ) -> Result<(), DdpError> {
        for (i, (p, v)) in model.params_mut().into_iter().zip(velocity).enumerate() {
            let g = grad(i)?;
            if args.momentum == 0.0 {
                p.iter_mut().zip(g).for_each(|(p, g)| *p -= args.mlp.lr * g);
            } else {
                for ((p, v), g) in p.iter_mut().zip(v.iter_mut()).zip(g) {
                    *v = args.momentum * *v + g;
                    *p -= args.mlp.lr * *v;
                }
            }
        }
        Ok(())
    }

    /// Rank 0's snapshot every `--checkpoint-every` steps, after `step` steps with the
    /// next batch at `position`, and DDP's `bucket_order` (empty under DP) so that a
    /// resumed run reduces in the same buckets (a no-op without `--checkpoint`).
    fn snapshot(
        args: &Args,
        model: &Mlp,
        velocity: &[Vec<f32>],
        (step, position): (u64, BatchPosition),
        bucket_order: &[usize],
    ) -> Result<(), DdpError> {
        let Some(dir) = &args.checkpoint else {
            return Ok(());
        };
        if step % args.checkpoint_every.max(1) != 0 {
            return Ok(());
        }
        let mut snapshot = Checkpoint::new(step, position);
        for ((name, _), (p, v)) in model
            .shapes()
            .into_iter()
            .zip(model.params().into_iter().zip(velocity))
        {
            snapshot.put(&name, p);
            snapshot.put(&format!("momentum.{name}"), v);
        }
        if !bucket_order.is_empty() {
            let order: Vec<i64> = bucket_order
                .iter()
                .map(|&i| i64::try_from(i).unwrap_or(-1))
                .collect();
            snapshot.put(BUCKET_ORDER, &order);
        }
        snapshot.save(dir, 2)?;
        Ok(())
    }

    /// Restores the newest snapshot in `--checkpoint`'s directory, if there is one.
    fn resume_from_disk(&mut self, args: &Args) -> Result<(), DdpError> {
        let Some(dir) = &args.checkpoint else {
            return Ok(());
        };
        if let Some(snapshot) = Checkpoint::load_latest(dir)? {
            self.restore(&snapshot)?;
            println!(
                "resumed from the snapshot of step {} in {}",
                self.step,
                dir.display()
            );
        }
        Ok(())
    }

    fn restore(&mut self, snapshot: &Checkpoint) -> Result<(), DdpError> {
        let shapes = self.model.shapes();
        for (((name, numel), p), v) in shapes
            .iter()
            .zip(self.model.params_mut())
            .zip(&mut self.velocity)
        {
            let (saved, momentum) = (
                snapshot.get::<f32>(name)?,
                snapshot.get::<f32>(&format!("momentum.{name}"))?,
            );
            if saved.len() != *numel || momentum.len() != *numel {
                return Err(DdpError::Checkpoint(format!("{name}: the snapshot's shape differs from the model's; was it written with other --hidden/--layers/--input?")));
            }
            p.copy_from_slice(&saved);
            v.copy_from_slice(&momentum);
        }
        self.step = snapshot.step();
        self.position = snapshot.position();
        if snapshot.names().any(|name| name == BUCKET_ORDER) {
            let order = snapshot.get::<i64>(BUCKET_ORDER)?;
            self.bucket_order = order
                .iter()
                .map(|&i| usize::try_from(i))
                .collect::<Result<_, _>>()
                .map_err(|_| {
                    DdpError::Checkpoint(format!(
                        "{BUCKET_ORDER} holds a negative index: {order:?}"
                    ))
                })?;
        }
        Ok(())
    }
}

/// The final parameters' figures.
struct Summary {
    l2: f64,
    fnv: u64,
}

impl Summary {
    fn of(model: &Mlp) -> Summary {
        let params = model.params();
        let values = params.iter().flat_map(|p| p.iter());
        let l2 = values
            .clone()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt();
        let fnv = values.fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            v.to_bits().to_le_bytes().iter().fold(h, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        });
        Summary { l2, fnv }
    }
}

/// The median of `times` after the first (which rebuilds DDP's buckets).
fn median_after_first(times: impl Iterator<Item = f64>) -> f64 {
    let mut times: Vec<f64> = times.skip(1).collect();
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(0.0)
}

/// This process's peak resident memory in MiB (VmHWM), 0 where /proc has none.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn print_loss(args: &Args, step: u64, loss: f32) {
    if step.checked_rem(args.print_every) == Some(0) || step + 1 == args.steps {
        println!("step {step:4} loss {loss:.6}");
    }
}

/// Rank 0's last lines; `step_time` is the slowest replica's median, in seconds.
fn print_summary(
    args: &Args,
    model: &Mlp,
    step_time: f64,
    replicas: usize,
    how: &str,
    rss_mb: f64,
) {
    let summary = Summary::of(model);
    println!(
        "step_time_ms={:.3} (median over steps 2..{}, slowest replica; {replicas} replicas, {how}, overlap {}, hook {})",
        step_time * 1e3,
        args.steps,
        args.mlp.overlap,
        args.hook
    );
    println!("peak_rss_mb={rss_mb:.1} ({how})");
    println!("final_params_l2={:.6e}", summary.l2);
    println!("final_params_fnv={:016x}", summary.fnv);
}

/// DDP on one rank of `pg`; rank 0 reports. `in_process`: the ranks are threads of this
/// process (so the memory is this process's, not a sum).
fn train_ddp(args: &Args, pg: &ProcessGroup, in_process: bool) -> Result<(), Failure> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let data = Data::new(args);
    let mut state = State::new(args);
    let config = DdpConfig::default().bucket_cap_bytes(args.mlp.bucket_cap_bytes());
    let mut ddp = DistributedDataParallel::<f32>::with_params(pg, state.model.shapes(), config)?;
    match args.hook.as_str() {
        "allreduce" => {}
        "fp16" => ddp.register_comm_hook(Fp16CompressHook),
        "bf16" => ddp.register_comm_hook(Bf16CompressHook),
        other => return Err(format!("unknown --hook {other}").into()),
    }
    if resume(args, pg, &mut state)? {
        // Rank 0's saved order; the buckets then match the interrupted run's.
        ddp.restore_bucket_order(&state.bucket_order)?;
    }
    ddp.broadcast_parameters(&mut state.model.params_mut())?;
    for v in &mut state.velocity {
        pg.broadcast(v, 0)?;
    }

    let sampler = DistributedSampler::new(args.mlp.dataset, n, rank)?.seed(args.mlp.seed);
    let mut batches = sampler.batches_from(args.mlp.local_batch, state.position)?;
    let mut step_times = Vec::new();
    while state.step < args.steps {
        let batch = batches.next().ok_or("the sampler ran out of batches")?;
        let (x, y) = data.batch(&batch.indices);
        let started = Instant::now();
        // Under RINGCCL_TRACE (ringrun --trace), the trainer row of the timeline shows
        // forward and backward, and the ddp row the buckets' all-reduces overlapping them.
        let forward = ddp.trainer_span("forward");
        let acts = state.model.forward(&x);
        drop(forward);
        let backward = ddp.backward_span();
        let loss = if args.mlp.overlap == "off" {
            let mut grads: Vec<(usize, Vec<f32>)> = Vec::new();
            let loss = state.model.backward(&acts, &y, |i, g| {
                grads.push((i, g.to_vec()));
                Ok(())
            })?;
            drop(backward);
            for (i, g) in grads {
                ddp.mark_grad_ready(i, &g)?;
            }
            loss
        } else {
            let loss = state
                .model
                .backward(&acts, &y, |i, g| ddp.mark_grad_ready(i, g))?;
            drop(backward);
            loss
        };
        ddp.finish()?;
        State::sgd(&mut state.model, &mut state.velocity, args, &|i| {
            ddp.grad(i)
        })?;
        step_times.push(started.elapsed().as_secs_f64());

        let mut global = [loss / n as f32];
        pg.all_reduce(&mut global, ReduceOp::Sum)?;
        if rank == 0 {
            print_loss(args, state.step, global[0]);
        }
        state.step += 1;
        state.position = batches.position();
        if rank == 0 && args.checkpoint.is_some() {
            State::snapshot(
                args,
                &state.model,
                &state.velocity,
                (state.step, state.position),
                &ddp.bucket_order(),
            )?;
        }
    }
    let mut median = [median_after_first(step_times.into_iter())];
    pg.all_reduce(&mut median, ReduceOp::Max)?;
    let mut rss = [peak_rss_mb()];
    if !in_process {
        pg.all_reduce(&mut rss, ReduceOp::Sum)?;
    }
    if rank == 0 {
        let how = if in_process {
            "DDP over threads"
        } else {
            "DDP over processes, RSS summed"
        };
        print_summary(args, &state.model, median[0], n, how, rss[0]);
    }
    pg.barrier()?;
    Ok(())
}

/// Rank 0 reads the newest snapshot, if any, and every rank takes its step and position;
/// the parameters and momentum follow in the broadcasts after. Returns whether the snapshot
/// holds DDP's bucket order (every rank then restores rank 0's).
fn resume(args: &Args, pg: &ProcessGroup, state: &mut State) -> Result<bool, Failure> {
    if args.checkpoint.is_none() {
        return Ok(false);
    }
    let mut header = [0i64; 4];
    if pg.rank() == 0 {
        state.resume_from_disk(args)?;
        let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let has_order = u64::from(!state.bucket_order.is_empty());
        header = [
            state.step,
            state.position.epoch,
            state.position.step,
            has_order,
        ]
        .map(signed);
    }
    pg.broadcast(&mut header, 0)?;
    let [step, epoch, within, has_order] = header.map(|v| u64::try_from(v).unwrap_or(0));
    state.step = step;
    state.position = BatchPosition {
        epoch,
        step: within,
    };
    Ok(has_order == 1)
}

/// DataParallel: `replicas` threads of this process, one global batch of
/// `replicas × local_batch` split between them each step.
fn train_dp(args: &Args, replicas: usize) -> Result<(), Failure> {
    let data = Data::new(args);
    let mut state = State::new(args);
    state.resume_from_disk(args)?;
    let sampler = DistributedSampler::new(args.mlp.dataset, 1, 0)?.seed(args.mlp.seed);
    let mut batches = sampler.batches_from(replicas * args.mlp.local_batch, state.position)?;
    let State {
        model,
        mut velocity,
        mut step,
        ..
    } = state;
    let mut dp = DataParallel::new(model, replicas)?;
    let mut step_times = Vec::new();
    let mut phases = Vec::new();
    while step < args.steps {
        let batch = batches.next().ok_or("the sampler ran out of batches")?;
        let started = Instant::now();
        let losses = dp.step(&batch.indices, |model, shard, grads| {
            let (x, y) = data.batch(shard);
            let acts = model.forward(&x);
            model.backward(&acts, &y, |i, g| grads.set(i, g))
        })?;
        dp.update(|master, grads| State::sgd(master, &mut velocity, args, &|i| Ok(&grads[i])))?;
        step_times.push(started.elapsed().as_secs_f64());
        phases.push(dp.timings());
        print_loss(args, step, losses.iter().sum::<f32>() / losses.len() as f32);
        step += 1;
        State::snapshot(
            args,
            dp.master(),
            &velocity,
            (step, batches.position()),
            &[],
        )?;
    }
    let median =
        |f: fn(&ringccl::ddp::DpTimings) -> f64| median_after_first(phases.iter().map(f)) * 1e3;
    println!(
        "dp_phases_ms replicate={:.3} compute={:.3} reduce={:.3} (medians)",
        median(|t| t.replicate.as_secs_f64()),
        median(|t| t.compute.as_secs_f64()),
        median(|t| t.reduce.as_secs_f64())
    );
    let step_time = median_after_first(step_times.into_iter());
    print_summary(
        args,
        dp.master(),
        step_time,
        replicas,
        "DataParallel",
        peak_rss_mb(),
    );
    Ok(())
}

/// DDP with `replicas` ranks on threads of this process, over `local_groups`.
fn train_ddp_threads(args: &Args, replicas: usize) -> Result<(), Failure> {
    let ranks = local_groups(&args.backend, replicas)?;
    run_local_ranks(ranks, |pg| {
        train_ddp(args, &pg, true).map_err(|e| e.to_string())
    })?;
    Ok(())
}

fn main() -> Result<(), Failure> {
    let args = Args::parse();
    match (args.mode.as_str(), args.mlp.replicas) {
        ("dp", replicas) => train_dp(&args, replicas.unwrap_or(1)),
        ("ddp", Some(replicas)) => train_ddp_threads(&args, replicas),
        ("ddp", None) => {
            let pg = init_process_group(&args.backend, InitOptions::from_env()?)?;
            train_ddp(&args, &pg, false)
        }
        (other, _) => Err(format!("unknown --mode {other}: dp or ddp").into()),
    }
}
