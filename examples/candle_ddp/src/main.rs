//! Data-parallel training of a small candle (CPU) MLP with ringccl, three ways:
//!
//! - DDP over processes (started by `ringrun`): candle computes the gradients
//!   (`loss.backward()` → `GradStore`), ringccl's `DistributedDataParallel` averages them
//!   across ranks, and the SGD update is applied to the candle `Var`s;
//! - DDP over threads (`--replicas R` without a launcher): the same, with the ranks on
//!   threads of one process (`ringccl::local_groups`);
//! - DataParallel (`--mode dp --replicas R`): one process, the global batch split between
//!   R replica threads, the gradients reduced to the master, which alone steps.
//!
//! `DistributedSampler::batches` gives each rank its share of every global batch.
//!
//! ```sh
//! cargo build --release -p ringccl-tools --bin ringrun                   # in the repository root
//! cargo build --release --manifest-path examples/candle_ddp/Cargo.toml
//! ex=examples/candle_ddp/target/release/candle-ddp-example
//! target/release/ringrun --nproc-per-node 4 $ex --local-batch 16
//! target/release/ringrun --nproc-per-node 1 $ex --local-batch 64
//! $ex --replicas 4 --local-batch 16
//! $ex --mode dp --replicas 4 --local-batch 16
//! ```
//!
//! All print the same `final_params_l2=` up to float rounding: at every step the 4 ranks
//! (or replicas) together see exactly the 64 samples the single rank sees, and both DDP
//! and DataParallel average the per-replica mean-loss gradients, which gives the gradient
//! of the mean over all 64.

use std::time::Instant;

#[path = "../../shared/mlp_data.rs"]
mod mlp_data;
use mlp_data::{sample, target, uniform};

use candle_core::{Device, Tensor, Var};
use clap::Parser;
use ringccl::ddp::{
    DataParallel, DdpConfig, DistributedDataParallel, DistributedSampler, Grads, Replica,
};
use ringccl::{
    init_process_group, local_groups, run_local_ranks, InitOptions, ProcessGroup, ReduceOp,
};

/// Any error of candle, ringccl or the arguments, from any thread.
type Failure = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(about = "Data-parallel training of a small candle MLP with ringccl")]
struct Args {
    /// Samples per rank per step (the global batch is this times the number of ranks).
    #[arg(long, default_value_t = 16)]
    local_batch: usize,
    /// Optimiser (SGD) steps.
    #[arg(long, default_value_t = 30)]
    steps: usize,
    /// Seed for the data, the initial parameters and the sampler's shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Learning rate.
    #[arg(long, default_value_t = 0.1)]
    lr: f64,
    /// Input features.
    #[arg(long, default_value_t = 8)]
    input: usize,
    /// Hidden units.
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    /// Dataset size (samples).
    #[arg(long, default_value_t = 1024)]
    dataset: usize,
    /// Print the loss every this many steps (rank 0).
    #[arg(long, default_value_t = 5)]
    print_every: usize,
    /// ddp (DistributedDataParallel) or dp (DataParallel, one process).
    #[arg(long, default_value = "ddp")]
    mode: String,
    /// Replicas in this process: DataParallel's (default 1), or DDP ranks on threads over
    /// ringccl::local_groups. Without it, --mode ddp is one rank of a launched group.
    #[arg(long)]
    replicas: Option<usize>,
}

/// `pred = tanh(x W1ᵀ + b1) W2ᵀ + b2`, with candle `Var`s as parameters.
struct Mlp {
    /// In registration order: w1 [hidden, input], b1 [hidden], w2 [1, hidden], b2 [1].
    params: Vec<(String, Var)>,
}

impl Mlp {
    /// Random initial parameters from `seed`.
    fn new(input: usize, hidden: usize, seed: u64, dev: &Device) -> candle_core::Result<Mlp> {
        let init = |salt: u64, rows: usize, cols: usize, scale: f32| -> Vec<f32> {
            (0..rows * cols)
                .map(|i| scale * uniform(seed ^ (salt << 32), i as u64))
                .collect()
        };
        let s1 = (1.0 / input as f32).sqrt();
        let s2 = (1.0 / hidden as f32).sqrt();
        let params = vec![
            (
                "fc1.weight".to_string(),
                Var::from_vec(init(1, hidden, input, s1), (hidden, input), dev)?,
            ),
            (
                "fc1.bias".to_string(),
                Var::from_vec(init(2, hidden, 1, s1), hidden, dev)?,
            ),
            (
                "fc2.weight".to_string(),
                Var::from_vec(init(3, 1, hidden, s2), (1, hidden), dev)?,
            ),
            (
                "fc2.bias".to_string(),
                Var::from_vec(init(4, 1, 1, s2), 1, dev)?,
            ),
        ];
        Ok(Mlp { params })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let [w1, b1, w2, b2] = [0, 1, 2, 3].map(|i| self.params[i].1.as_tensor());
        x.matmul(&w1.t()?)?
            .broadcast_add(b1)?
            .tanh()?
            .matmul(&w2.t()?)?
            .broadcast_add(b2)
    }

    /// The parameters, flattened, in registration order.
    fn to_vecs(&self) -> candle_core::Result<Vec<Vec<f32>>> {
        self.params
            .iter()
            .map(|(_, v)| v.as_tensor().flatten_all()?.to_vec1::<f32>())
            .collect()
    }

    /// Overwrites the parameters with `values` (flattened, in registration order).
    fn set_from_vecs(&self, values: &[Vec<f32>]) -> candle_core::Result<()> {
        for ((_, var), v) in self.params.iter().zip(values) {
            var.set(&Tensor::from_slice(v, var.shape(), var.device())?)?;
        }
        Ok(())
    }

    /// The parameters as plain vectors, for DataParallel's replicas.
    fn to_host(&self) -> candle_core::Result<HostParams> {
        Ok(HostParams {
            names: self.params.iter().map(|(name, _)| name.clone()).collect(),
            shapes: self.params.iter().map(|(_, v)| v.dims().to_vec()).collect(),
            values: self.to_vecs()?,
        })
    }

    /// A candle model holding `host`'s values.
    fn from_host(host: &HostParams, dev: &Device) -> candle_core::Result<Mlp> {
        let params = host
            .names
            .iter()
            .zip(&host.shapes)
            .zip(&host.values)
            .map(|((name, shape), v)| Ok((name.clone(), Var::from_slice(v, &shape[..], dev)?)))
            .collect::<candle_core::Result<_>>()?;
        Ok(Mlp { params })
    }

    /// Forward and candle's backward over the samples `indices`: the mean squared error,
    /// and each parameter's gradient of it, flattened, in registration order.
    fn pass(&self, data: &Data, indices: &[usize]) -> Result<(f32, Vec<Vec<f32>>), Failure> {
        let (x, y) = data.batch(indices)?;
        let loss = self.forward(&x)?.sub(&y)?.sqr()?.mean_all()?;
        let store = loss.backward()?;
        let grads = self
            .params
            .iter()
            .map(|(name, var)| {
                let grad = store
                    .get(var.as_tensor())
                    .ok_or_else(|| format!("no gradient for {name}"))?;
                Ok(grad.flatten_all()?.to_vec1::<f32>()?)
            })
            .collect::<Result<_, Failure>>()?;
        Ok((loss.to_scalar::<f32>()?, grads))
    }

    /// L2 norm of all parameters.
    fn l2(&self) -> candle_core::Result<f64> {
        Ok(self
            .to_vecs()?
            .iter()
            .flatten()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt())
    }
}

/// The model's parameters as host vectors: DataParallel's replica. Each replica's pass
/// builds candle `Var`s from them (candle tensors share storage when cloned, so a plain
/// `Clone` of `Mlp` would not make an independent replica).
#[derive(Clone)]
struct HostParams {
    names: Vec<String>,
    shapes: Vec<Vec<usize>>,
    values: Vec<Vec<f32>>,
}

impl Replica<f32> for HostParams {
    fn params(&self) -> Vec<&[f32]> {
        self.values.iter().map(|v| &v[..]).collect()
    }

    fn params_mut(&mut self) -> Vec<&mut [f32]> {
        self.values.iter_mut().map(|v| &mut v[..]).collect()
    }
}

/// Synthetic regression data, the same on every rank (generated from the seed).
struct Data {
    x: Tensor,
    y: Tensor,
}

impl Data {
    fn new(args: &Args, dev: &Device) -> candle_core::Result<Data> {
        let xs: Vec<f32> = (0..args.dataset)
            .flat_map(|i| sample(args.seed, args.input, i))
            .collect();
        let ys: Vec<f32> = xs.chunks_exact(args.input).map(target).collect();
        Ok(Data {
            x: Tensor::from_vec(xs, (args.dataset, args.input), dev)?,
            y: Tensor::from_vec(ys, (args.dataset, 1), dev)?,
        })
    }

    /// The inputs and targets of the samples `indices`.
    fn batch(&self, indices: &[usize]) -> Result<(Tensor, Tensor), Failure> {
        let ids: Vec<u32> = indices
            .iter()
            .map(|&i| u32::try_from(i))
            .collect::<Result<_, _>>()?;
        let ids = Tensor::from_vec(ids, indices.len(), self.x.device())?;
        Ok((self.x.index_select(&ids, 0)?, self.y.index_select(&ids, 0)?))
    }
}

/// One plain SGD step: `param -= lr × grad`.
fn sgd(param: &mut [f32], grad: &[f32], lr: f64) {
    let lr = lr as f32;
    for (p, g) in param.iter_mut().zip(grad) {
        *p -= lr * g;
    }
}

/// The median of `times` (seconds) after the first, which pays for warming up.
fn median_after_first(times: Vec<f64>) -> f64 {
    let mut times: Vec<f64> = times.into_iter().skip(1).collect();
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

fn print_loss(args: &Args, step: usize, loss: f32) {
    if step.is_multiple_of(args.print_every) || step + 1 == args.steps {
        println!("step {step:4} loss {loss:.6}");
    }
}

/// The last lines: the slowest replica's median step (seconds), the peak memory, the
/// parameters' norm.
fn print_summary(step_time: f64, rss_mb: f64, how: &str, l2: f64) {
    println!("step_time_ms={:.3} ({how})", step_time * 1e3);
    println!("peak_rss_mb={rss_mb:.1} ({how})");
    println!("final_params_l2={l2:.8e}");
}

/// DDP on one rank of `pg`; rank 0 reports. `in_process`: the ranks are threads of this
/// process (so the memory is this process's, not a sum).
fn train_ddp(args: &Args, pg: &ProcessGroup, in_process: bool) -> Result<(), Failure> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let dev = Device::Cpu;
    let data = Data::new(args, &dev)?;

    // Each rank initialises differently on purpose; broadcast_parameters makes every
    // replica start from rank 0's values (seeded with `seed` alone, as in a 1-rank run).
    let model = Mlp::new(args.input, args.hidden, args.seed + rank as u64, &dev)?;
    let shapes = model
        .params
        .iter()
        .map(|(name, var)| (name.clone(), var.elem_count()));
    let mut ddp = DistributedDataParallel::<f32>::with_params(pg, shapes, DdpConfig::default())?;
    let mut values = model.to_vecs()?;
    {
        let mut slices: Vec<&mut [f32]> = values.iter_mut().map(|v| &mut v[..]).collect();
        ddp.broadcast_parameters(&mut slices)?;
    }
    model.set_from_vecs(&values)?;

    let sampler = DistributedSampler::new(args.dataset, world, rank)?.seed(args.seed);
    let batches = sampler.batches(args.local_batch)?;
    if rank == 0 {
        println!(
            "candle DDP: {world} rank(s) x {} samples = global batch {}, {} parameters, {} steps",
            args.local_batch,
            world * args.local_batch,
            values.iter().map(Vec::len).sum::<usize>(),
            args.steps
        );
    }

    let mut step_times = Vec::with_capacity(args.steps);
    for (step, batch) in batches.take(args.steps).enumerate() {
        let started = Instant::now();
        let (loss, grads) = model.pass(&data, &batch.indices)?;
        // Hand the gradients to DDP in reverse registration order (the order backward
        // produces them in a real network), then wait for the averaged gradients.
        for (index, grad) in grads.iter().enumerate().rev() {
            ddp.mark_grad_ready(index, grad)?;
        }
        ddp.finish()?;
        // SGD with the averaged gradients, on the host copy (as DataParallel's master
        // does), then into the `Var`s.
        for (index, param) in values.iter_mut().enumerate() {
            sgd(param, ddp.grad(index)?, args.lr);
        }
        model.set_from_vecs(&values)?;
        step_times.push(started.elapsed().as_secs_f64());

        // The loss over the global batch: the mean of the ranks' local means.
        let mut global = [loss / world as f32];
        pg.all_reduce(&mut global, ReduceOp::Sum)?;
        if rank == 0 {
            print_loss(args, step, global[0]);
        }
    }

    let mut median = [median_after_first(step_times)];
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
        print_summary(median[0], rss[0], how, model.l2()?);
    }
    pg.barrier()?;
    Ok(())
}

/// DDP with `replicas` ranks on threads of this process, over `local_groups`.
fn train_ddp_threads(args: &Args, replicas: usize) -> Result<(), Failure> {
    let ranks = local_groups("gloo", replicas)?;
    run_local_ranks(ranks, |pg| {
        train_ddp(args, &pg, true).map_err(|e| e.to_string())
    })?;
    Ok(())
}

/// DataParallel: `replicas` threads of this process, one global batch of
/// `replicas × local_batch` split between them each step; the master alone steps.
fn train_dp(args: &Args, replicas: usize) -> Result<(), Failure> {
    let dev = Device::Cpu;
    let data = Data::new(args, &dev)?;
    let master = Mlp::new(args.input, args.hidden, args.seed, &dev)?.to_host()?;
    let sampler = DistributedSampler::new(args.dataset, 1, 0)?.seed(args.seed);
    let batches = sampler.batches(replicas * args.local_batch)?;
    println!(
        "candle DataParallel: {replicas} replica(s) x {} samples = global batch {}, {} steps",
        args.local_batch,
        replicas * args.local_batch,
        args.steps
    );
    let mut dp = DataParallel::new(master, replicas)?;
    let mut step_times = Vec::with_capacity(args.steps);
    for (step, batch) in batches.take(args.steps).enumerate() {
        let started = Instant::now();
        let losses = dp.step(
            &batch.indices,
            |replica: &HostParams, shard: &[usize], grads: &mut Grads<'_, f32>| {
                let (loss, values) = Mlp::from_host(replica, &dev)?.pass(&data, shard)?;
                for (index, grad) in values.iter().enumerate() {
                    grads.set(index, grad)?;
                }
                Ok::<f32, Failure>(loss)
            },
        )?;
        dp.update(|master, grads| {
            for (param, grad) in master.values.iter_mut().zip(grads) {
                sgd(param, grad, args.lr);
            }
        });
        step_times.push(started.elapsed().as_secs_f64());
        print_loss(args, step, losses.iter().sum::<f32>() / losses.len() as f32);
    }
    let model = Mlp::from_host(dp.master(), &dev)?;
    print_summary(
        median_after_first(step_times),
        peak_rss_mb(),
        "DataParallel",
        model.l2()?,
    );
    Ok(())
}

fn main() -> Result<(), Failure> {
    let args = Args::parse();
    match (args.mode.as_str(), args.replicas) {
        ("dp", replicas) => train_dp(&args, replicas.unwrap_or(1)),
        ("ddp", Some(replicas)) => train_ddp_threads(&args, replicas),
        ("ddp", None) => {
            let pg = init_process_group("gloo", InitOptions::from_env()?)?;
            train_ddp(&args, &pg, false)
        }
        (other, _) => Err(format!("unknown --mode {other} (ddp or dp)").into()),
    }
}
