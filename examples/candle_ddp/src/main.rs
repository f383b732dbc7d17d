//! Data-parallel training of a small candle (CPU) MLP with ringccl.
//!
//! candle computes the gradients (`loss.backward()` → `GradStore`); ringccl's
//! `DistributedDataParallel` averages them across ranks; the SGD update is applied to the
//! candle `Var`s. `DistributedSampler` gives each rank its share of every global batch.
//!
//! ```sh
//! cargo build --release --bin ringrun                                   # in the repository root
//! cargo build --release --manifest-path examples/candle_ddp/Cargo.toml
//! target/release/ringrun --nproc-per-node 4 examples/candle_ddp/target/release/candle-ddp-example --local-batch 16
//! target/release/ringrun --nproc-per-node 1 examples/candle_ddp/target/release/candle-ddp-example --local-batch 64
//! ```
//!
//! Both print the same `final_params_l2=` up to float rounding: at every step the 4 ranks
//! together see exactly the 64 samples the single rank sees, and DDP averages the
//! per-rank mean-loss gradients, which gives the gradient of the mean over all 64.

use candle_core::{Device, Tensor, Var};
use clap::Parser;
use ringccl::ddp::{DdpConfig, DistributedDataParallel, DistributedSampler, ParamSpec};
use ringccl::{init_process_group, DType, InitOptions, ReduceOp};

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
}

/// Deterministic pseudo-random numbers in [-1, 1) (a SplitMix64-style hash of `(seed, i)`).
fn uniform(seed: u64, i: u64) -> f32 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// The function the model learns.
fn target(x: &[f32]) -> f32 {
    x.iter()
        .enumerate()
        .map(|(j, v)| (v * (j as f32 + 1.0)).sin() / (j as f32 + 1.0))
        .sum()
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
    fn set_from_vecs(&self, values: Vec<Vec<f32>>) -> candle_core::Result<()> {
        for ((_, var), v) in self.params.iter().zip(values) {
            var.set(&Tensor::from_vec(v, var.shape(), var.device())?)?;
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let pg = init_process_group("gloo", InitOptions::from_env()?)?;
    let (rank, world) = (pg.rank(), pg.world_size());
    let dev = Device::Cpu;

    // Synthetic regression data: the same on every rank (generated from the seed).
    let xs: Vec<f32> = (0..args.dataset * args.input)
        .map(|i| uniform(args.seed ^ 0xDA7A, i as u64))
        .collect();
    let ys: Vec<f32> = xs.chunks_exact(args.input).map(target).collect();
    let x_all = Tensor::from_vec(xs, (args.dataset, args.input), &dev)?;
    let y_all = Tensor::from_vec(ys, (args.dataset, 1), &dev)?;

    // Each rank initialises differently on purpose; broadcast_parameters makes every
    // replica start from rank 0's values (seeded with `seed` alone, as in a 1-rank run).
    let model = Mlp::new(args.input, args.hidden, args.seed + rank as u64, &dev)?;
    let specs: Vec<ParamSpec> = model
        .params
        .iter()
        .map(|(name, var)| ParamSpec::new(name.clone(), var.elem_count(), DType::F32))
        .collect();
    let mut ddp = DistributedDataParallel::<f32>::new(&pg, &specs, DdpConfig::default())?;
    let mut values = model.to_vecs()?;
    {
        let mut slices: Vec<&mut [f32]> = values.iter_mut().map(|v| &mut v[..]).collect();
        ddp.broadcast_parameters(&mut slices)?;
    }
    model.set_from_vecs(values)?;

    let mut sampler = DistributedSampler::new(args.dataset, world, rank)?.seed(args.seed);
    let per_epoch = sampler.num_samples() / args.local_batch;
    if per_epoch == 0 {
        return Err(format!(
            "the dataset ({} samples, {} per rank) is too small for --local-batch {}",
            args.dataset,
            sampler.num_samples(),
            args.local_batch
        )
        .into());
    }
    if rank == 0 {
        println!(
            "candle DDP: {world} rank(s) x {} samples = global batch {}, {} parameters, {} steps",
            args.local_batch,
            world * args.local_batch,
            specs.iter().map(|s| s.numel).sum::<usize>(),
            args.steps
        );
    }

    let mut epoch_indices: Vec<usize> = Vec::new();
    for step in 0..args.steps {
        let (epoch, within) = (step / per_epoch, step % per_epoch);
        if within == 0 {
            sampler.set_epoch(epoch as u64);
            epoch_indices = sampler.indices();
        }
        // Consecutive local batches from this rank's indices.
        let batch: Vec<u32> = epoch_indices
            [within * args.local_batch..(within + 1) * args.local_batch]
            .iter()
            .map(|&i| u32::try_from(i))
            .collect::<Result<_, _>>()?;
        let ids = Tensor::from_vec(batch, args.local_batch, &dev)?;
        let x = x_all.index_select(&ids, 0)?;
        let y = y_all.index_select(&ids, 0)?;

        // Forward, mean squared error over the local batch, candle's backward.
        let loss = model.forward(&x)?.sub(&y)?.sqr()?.mean_all()?;
        let grads = loss.backward()?;

        // Hand the gradients to DDP in reverse registration order (the order backward
        // produces them in a real network), then wait for the averaged gradients.
        for (index, (name, var)) in model.params.iter().enumerate().rev() {
            let grad = grads
                .get(var.as_tensor())
                .ok_or_else(|| format!("no gradient for {name}"))?;
            ddp.mark_grad_ready(index, &grad.flatten_all()?.to_vec1::<f32>()?)?;
        }
        ddp.finish()?;

        // SGD with the averaged gradients.
        for (index, (_, var)) in model.params.iter().enumerate() {
            let grad = Tensor::from_slice(ddp.grad(index)?, var.shape(), &dev)?;
            var.set(&var.as_tensor().sub(&grad.affine(args.lr, 0.0)?)?)?;
        }

        // The loss over the global batch: the mean of the ranks' local means.
        let mut global = [loss.to_scalar::<f32>()? / world as f32];
        pg.all_reduce(&mut global, ReduceOp::Sum)?;
        if rank == 0 && (step % args.print_every == 0 || step + 1 == args.steps) {
            println!("step {step:4} loss {:.6}", global[0]);
        }
    }

    let l2 = model
        .to_vecs()?
        .iter()
        .flatten()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    if rank == 0 {
        println!("final_params_l2={l2:.8e}");
    }
    pg.barrier()?;
    Ok(())
}
