//! Data-parallel training of a small MLP whose forward and backward passes run on the
//! GPU, its gradients averaged in device buckets by `ringccl::DeviceDdp`. The kernels
//! (dense layer, tanh, the backward products, SGD) are compiled at run time by NVRTC, so
//! no CUDA compiler is needed to build.
//!
//! ```sh
//! cargo build --release --example ddp_gpu
//! # NCCL, one rank per GPU (one GPU: world size 1):
//! target/release/examples/ddp_gpu --backend nccl --replicas 1 --reference on
//! # gloo with device buffers, 4 ranks sharing GPU 0 (threads of this process):
//! target/release/examples/ddp_gpu --backend gloo --replicas 4 --reference on
//! # overlap: a backward slowed down to 20 ms per layer, buckets marked as produced or
//! # all at the end (--slow-backward-on gpu: the extra time is a kernel on the stream,
//! # and the host runs ahead as in real training):
//! target/release/examples/ddp_gpu --backend gloo --replicas 2 --hidden 1024 --layers 4 \
//!     --slow-backward-ms 20 --overlap on
//! ```
//!
//! The model, data and update are `ddp_mlp`'s (a tanh MLP on `sin` targets, mean squared
//! error, SGD). With `--reference on` every rank also trains the same model on the host
//! with host DDP, step for step on the same group, and the run ends with
//! `max_param_diff=` between the two (float tolerance: the GPU sums in another order),
//! then `reference: ok` or an error. `step_ms=`, `backward_ms=` and `finish_ms=` (the
//! host's time inside `finish()`) are the medians over the timed steps (the first two
//! are warm-up).

// Kernel launches through cudarc's launch builder (each with its SAFETY comment).
#![allow(unsafe_code)]

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
use ringccl::cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use ringccl::cudarc::nvrtc;
use ringccl::ddp::{DdpConfig, DistributedDataParallel};
use ringccl::{DeviceDdp, ProcessGroup};

type Failure = Box<dyn StdError + Send + Sync>;

#[derive(Parser, Debug, Clone)]
struct Args {
    #[command(flatten)]
    mlp: MlpArgs,
    /// gloo (device buffers staged through the host) or nccl.
    #[arg(long, default_value = "nccl")]
    backend: String,
    /// Optimiser steps.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// on: also train on the host with host DDP and compare the parameters at the end.
    #[arg(long, default_value = "off")]
    reference: String,
    /// Extra time per layer of backward, to show the buckets' overlap.
    #[arg(long, default_value_t = 0)]
    slow_backward_ms: u64,
    /// Where the extra time goes: host (the stream is drained, then the host sleeps) or
    /// gpu (a kernel that spins that long, queued like backward's own kernels, so the
    /// host runs ahead as it does in real training).
    #[arg(long, default_value = "host")]
    slow_backward_on: String,
}

const KERNELS: &str = r#"
extern "C" __global__ void dense(const float* w, const float* b, const float* h, float* z,
                                 int batch, int in, int out, int act) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= batch * out) return;
    int i = t / out, o = t % out;
    float s = 0.0f;
    for (int k = 0; k < in; k++) s += w[o * in + k] * h[i * in + k];
    s += b[o];
    z[t] = act ? tanhf(s) : s;
}
extern "C" __global__ void out_delta(const float* a, const float* y, float* d, float* loss, int batch) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch) return;
    float err = a[i] - y[i];
    d[i] = err / (float)batch;
    loss[i] = 0.5f * err * err;
}
extern "C" __global__ void tanh_back(float* d, const float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] *= 1.0f - a[i] * a[i];
}
extern "C" __global__ void grad_w(const float* d, const float* h, float* gw, int batch, int in, int out) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= in * out) return;
    int o = t / in, k = t % in;
    float s = 0.0f;
    for (int i = 0; i < batch; i++) s += d[i * out + o] * h[i * in + k];
    gw[t] = s;
}
extern "C" __global__ void grad_b(const float* d, float* gb, int batch, int out) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out) return;
    float s = 0.0f;
    for (int i = 0; i < batch; i++) s += d[i * out + o];
    gb[o] = s;
}
extern "C" __global__ void back_delta(const float* w, const float* d, float* p, int batch, int in, int out) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= batch * in) return;
    int i = t / in, k = t % in;
    float s = 0.0f;
    for (int o = 0; o < out; o++) s += w[o * in + k] * d[i * out + o];
    p[t] = s;
}
extern "C" __global__ void sgd(float* p, const float* g, float lr, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] - lr * g[i];
}
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"#;

/// Initial parameters, `[w0, b0, w1, b1, ...]`, `ddp_mlp`'s.
fn initial_params(args: &Args) -> Vec<Vec<f32>> {
    let mut params = Vec::new();
    for (l, d) in args.mlp.widths().windows(2).enumerate() {
        params.push(initial_weights(args.mlp.seed, l, d[0], d[1]));
        params.push(vec![0.0; d[1]]);
    }
    params
}

/// This rank's samples at `step`: inputs (row-major) and labels.
fn batch(args: &Args, rank: usize, world: usize, step: usize) -> (Vec<f32>, Vec<f32>) {
    let global = args.mlp.local_batch * world;
    let mut x = Vec::with_capacity(args.mlp.local_batch * args.mlp.input);
    let mut y = Vec::with_capacity(args.mlp.local_batch);
    for j in 0..args.mlp.local_batch {
        let index = (step * global + rank * args.mlp.local_batch + j) % args.mlp.dataset;
        let row = sample(args.mlp.seed, args.mlp.input, index);
        y.push(target(&row));
        x.extend(row);
    }
    (x, y)
}

/// The kernels, compiled for `stream`'s device.
struct Gpu {
    _module: Arc<CudaModule>,
    dense: CudaFunction,
    out_delta: CudaFunction,
    tanh_back: CudaFunction,
    grad_w: CudaFunction,
    grad_b: CudaFunction,
    back_delta: CudaFunction,
    sgd: CudaFunction,
    spin: CudaFunction,
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.max(1) as u32)
}

impl Gpu {
    fn new(stream: &Arc<CudaStream>) -> Result<Gpu, Failure> {
        let ptx = nvrtc::compile_ptx(KERNELS)?;
        let module = stream.context().load_module(ptx)?;
        let f = |name: &str| module.load_function(name);
        Ok(Gpu {
            dense: f("dense")?,
            out_delta: f("out_delta")?,
            tanh_back: f("tanh_back")?,
            grad_w: f("grad_w")?,
            grad_b: f("grad_b")?,
            back_delta: f("back_delta")?,
            sgd: f("sgd")?,
            spin: f("spin")?,
            _module: module,
        })
    }
}

/// One rank's training on the GPU with device DDP (and, with `--reference on`, on the
/// host with host DDP); returns (device params, host params, step ms, backward ms).
fn train(pg: &ProcessGroup, args: &Args) -> Result<Report, Failure> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let device = pg.cuda_device().unwrap_or(0);
    let stream = CudaContext::new(device)?.new_stream()?;
    let gpu = Gpu::new(&stream)?;
    let dims = args.mlp.widths();
    let layers = dims.len() - 1;
    let names: Vec<(String, usize)> = dims
        .windows(2)
        .enumerate()
        .flat_map(|(l, d)| {
            [
                (format!("layer{l}.weight"), d[0] * d[1]),
                (format!("layer{l}.bias"), d[1]),
            ]
        })
        .collect();
    let config = DdpConfig::default().bucket_cap_bytes(args.mlp.bucket_cap_bytes());
    let mut ddp = DeviceDdp::<f32>::with_params(
        pg,
        &stream,
        names.iter().map(|(n, k)| (n.as_str(), *k)),
        config.clone(),
    )?;
    let init = initial_params(args);
    let mut params: Vec<CudaSlice<f32>> = init
        .iter()
        .map(|p| stream.clone_htod(p))
        .collect::<Result<_, _>>()?;
    {
        let mut refs: Vec<&mut CudaSlice<f32>> = params.iter_mut().collect();
        ddp.broadcast_parameters(&mut refs)?;
    }
    let reference = args.reference == "on";
    let mut host = if reference {
        Some((
            DistributedDataParallel::<f32>::with_params(
                pg,
                names.iter().map(|(n, k)| (n.as_str(), *k)),
                config,
            )?,
            init.clone(),
        ))
    } else {
        None
    };
    let b = args.mlp.local_batch as i32;
    let mut step_ms = Vec::new();
    let mut backward_ms = Vec::new();
    // The host's time inside finish(): under nccl it only orders the stream.
    let mut finish_ms = Vec::new();
    let mut last_loss = 0.0f32;
    for step in 0..args.steps {
        let (x, y) = batch(args, rank, world, step);
        if let Some((hddp, hparams)) = host.as_mut() {
            host_step(args, &dims, hddp, hparams, &x, &y)?;
        }
        let started = Instant::now();
        // Forward: activations per layer, [0] = inputs.
        let mut acts: Vec<CudaSlice<f32>> = vec![stream.clone_htod(&x)?];
        for l in 0..layers {
            let (i, o) = (dims[l] as i32, dims[l + 1] as i32);
            let mut z = stream.alloc_zeros::<f32>(args.mlp.local_batch * dims[l + 1])?;
            let act = i32::from(l + 1 < layers);
            let mut launch = stream.launch_builder(&gpu.dense);
            launch
                .arg(&params[2 * l])
                .arg(&params[2 * l + 1])
                .arg(&acts[l])
                .arg(&mut z)
                .arg(&b)
                .arg(&i)
                .arg(&o)
                .arg(&act);
            // SAFETY: dense(w, b, h, z, batch, in, out, act): w holds out*in, b out, h
            // batch*in and z batch*out elements; one thread per element of z.
            unsafe { launch.launch(grid(args.mlp.local_batch * dims[l + 1]))? };
            acts.push(z);
        }
        // Backward, last layer first; each layer's gradients go to DDP as produced.
        let backward = Instant::now();
        let y_dev = stream.clone_htod(&y)?;
        let mut delta = stream.alloc_zeros::<f32>(args.mlp.local_batch)?;
        let mut loss = stream.alloc_zeros::<f32>(args.mlp.local_batch)?;
        let mut launch = stream.launch_builder(&gpu.out_delta);
        launch
            .arg(&acts[layers])
            .arg(&y_dev)
            .arg(&mut delta)
            .arg(&mut loss)
            .arg(&b);
        // SAFETY: out_delta(a, y, d, loss, batch): all hold batch elements.
        unsafe { launch.launch(grid(args.mlp.local_batch))? };
        let mut grads: Vec<Option<CudaSlice<f32>>> = vec![None; 2 * layers];
        for l in (0..layers).rev() {
            let (i, o) = (dims[l] as i32, dims[l + 1] as i32);
            if l + 1 < layers {
                let n = b * o;
                let mut launch = stream.launch_builder(&gpu.tanh_back);
                launch.arg(&mut delta).arg(&acts[l + 1]).arg(&n);
                // SAFETY: tanh_back(d, a, n): d and a hold n = batch*out elements.
                unsafe { launch.launch(grid(n as usize))? };
            }
            let mut gw = stream.alloc_zeros::<f32>(dims[l] * dims[l + 1])?;
            let mut gb = stream.alloc_zeros::<f32>(dims[l + 1])?;
            let mut launch = stream.launch_builder(&gpu.grad_w);
            launch
                .arg(&delta)
                .arg(&acts[l])
                .arg(&mut gw)
                .arg(&b)
                .arg(&i)
                .arg(&o);
            // SAFETY: grad_w(d, h, gw, batch, in, out): d batch*out, h batch*in, gw
            // out*in elements; one thread per element of gw.
            unsafe { launch.launch(grid(dims[l] * dims[l + 1]))? };
            let mut launch = stream.launch_builder(&gpu.grad_b);
            launch.arg(&delta).arg(&mut gb).arg(&b).arg(&o);
            // SAFETY: grad_b(d, gb, batch, out): d batch*out, gb out elements.
            unsafe { launch.launch(grid(dims[l + 1]))? };
            if l > 0 {
                let mut prev = stream.alloc_zeros::<f32>(args.mlp.local_batch * dims[l])?;
                let mut launch = stream.launch_builder(&gpu.back_delta);
                launch
                    .arg(&params[2 * l])
                    .arg(&delta)
                    .arg(&mut prev)
                    .arg(&b)
                    .arg(&i)
                    .arg(&o);
                // SAFETY: back_delta(w, d, p, batch, in, out): w out*in, d batch*out, p
                // batch*in elements; one thread per element of p.
                unsafe { launch.launch(grid(args.mlp.local_batch * dims[l]))? };
                delta = prev;
            }
            if args.slow_backward_ms > 0 && args.slow_backward_on == "gpu" {
                let ns = args.slow_backward_ms * 1_000_000;
                let mut launch = stream.launch_builder(&gpu.spin);
                launch.arg(&ns);
                // SAFETY: spin(unsigned long long) takes the one argument pushed and
                // touches no memory.
                unsafe { launch.launch(grid(1))? };
            } else if args.slow_backward_ms > 0 {
                stream.synchronize()?;
                std::thread::sleep(Duration::from_millis(args.slow_backward_ms));
            }
            if args.mlp.overlap == "on" {
                ddp.mark_grad_ready(2 * l + 1, &gb.slice(..))?;
                ddp.mark_grad_ready(2 * l, &gw.slice(..))?;
            }
            grads[2 * l] = Some(gw);
            grads[2 * l + 1] = Some(gb);
        }
        if args.mlp.overlap != "on" {
            for l in (0..layers).rev() {
                for p in [2 * l + 1, 2 * l] {
                    if let Some(g) = &grads[p] {
                        ddp.mark_grad_ready(p, &g.slice(..))?;
                    }
                }
            }
        }
        stream.synchronize()?;
        let backward_time = backward.elapsed();
        let finishing = Instant::now();
        ddp.finish()?;
        let finish_time = finishing.elapsed();
        for (p, param) in params.iter_mut().enumerate() {
            let g = ddp.grad(p)?;
            let n = param.len() as i32;
            let mut launch = stream.launch_builder(&gpu.sgd);
            launch.arg(param).arg(&g).arg(&args.mlp.lr).arg(&n);
            // SAFETY: sgd(p, g, lr, n): p and g hold n elements.
            unsafe { launch.launch(grid(n as usize))? };
        }
        stream.synchronize()?;
        if step >= 2 {
            step_ms.push(started.elapsed().as_secs_f64() * 1e3);
            backward_ms.push(backward_time.as_secs_f64() * 1e3);
            finish_ms.push(finish_time.as_secs_f64() * 1e3);
        }
        let mut total = [stream.clone_dtoh(&loss)?.iter().sum::<f32>()];
        pg.all_reduce(&mut total, ringccl::ReduceOp::Sum)?;
        last_loss = total[0] / (args.mlp.local_batch * world) as f32;
        if rank == 0 && (step % 5 == 0 || step + 1 == args.steps) {
            println!("step {step} loss {last_loss:.6}");
        }
    }
    let device_params: Vec<Vec<f32>> = params
        .iter()
        .map(|p| stream.clone_dtoh(p))
        .collect::<Result<_, _>>()?;
    Ok(Report {
        device_params,
        host_params: host.map(|(_, p)| p),
        step_ms: median(step_ms),
        backward_ms: median(backward_ms),
        finish_ms: median(finish_ms),
        loss: last_loss,
    })
}

struct Report {
    device_params: Vec<Vec<f32>>,
    host_params: Option<Vec<Vec<f32>>>,
    step_ms: f64,
    backward_ms: f64,
    finish_ms: f64,
    loss: f32,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One step of the same model on the host with host DDP (the reference).
fn host_step(
    args: &Args,
    dims: &[usize],
    ddp: &mut DistributedDataParallel<f32>,
    params: &mut [Vec<f32>],
    x: &[f32],
    y: &[f32],
) -> Result<(), Failure> {
    let layers = dims.len() - 1;
    let batch = y.len();
    let mut acts: Vec<Vec<f32>> = vec![x.to_vec()];
    for l in 0..layers {
        let (i, o) = (dims[l], dims[l + 1]);
        let (w, b) = (&params[2 * l], &params[2 * l + 1]);
        let h = &acts[l];
        let z: Vec<f32> = (0..batch * o)
            .map(|t| {
                let (s, out) = (t / o, t % o);
                let mut acc = 0.0f32;
                for k in 0..i {
                    acc += w[out * i + k] * h[s * i + k];
                }
                let z = acc + b[out];
                if l + 1 < layers {
                    z.tanh()
                } else {
                    z
                }
            })
            .collect();
        acts.push(z);
    }
    let mut delta: Vec<f32> = (0..batch)
        .map(|s| (acts[layers][s] - y[s]) / batch as f32)
        .collect();
    for l in (0..layers).rev() {
        let (i, o) = (dims[l], dims[l + 1]);
        if l + 1 < layers {
            for (d, a) in delta.iter_mut().zip(&acts[l + 1]) {
                *d *= 1.0 - a * a;
            }
        }
        let h = &acts[l];
        let gw: Vec<f32> = (0..o * i)
            .map(|t| {
                let (out, k) = (t / i, t % i);
                (0..batch).fold(0.0f32, |s, n| s + delta[n * o + out] * h[n * i + k])
            })
            .collect();
        let gb: Vec<f32> = (0..o)
            .map(|out| (0..batch).fold(0.0f32, |s, n| s + delta[n * o + out]))
            .collect();
        if l > 0 {
            let w = &params[2 * l];
            delta = (0..batch * i)
                .map(|t| {
                    let (n, k) = (t / i, t % i);
                    (0..o).fold(0.0f32, |s, out| s + w[out * i + k] * delta[n * o + out])
                })
                .collect();
        }
        ddp.mark_grad_ready(2 * l + 1, &gb)?;
        ddp.mark_grad_ready(2 * l, &gw)?;
    }
    ddp.finish()?;
    for (p, param) in params.iter_mut().enumerate() {
        let g = ddp.grad(p)?;
        param
            .iter_mut()
            .zip(g)
            .for_each(|(p, g)| *p -= args.mlp.lr * g);
    }
    Ok(())
}

fn report(args: &Args, world: usize, report: &Report) -> Result<(), Failure> {
    let l2: f64 = report
        .device_params
        .iter()
        .flatten()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    println!(
        "backend={} world_size={world} steps={} final_loss={:.6} final_params_l2={l2:.6}",
        args.backend, args.steps, report.loss
    );
    println!(
        "step_ms={:.3} backward_ms={:.3} finish_ms={:.3} overlap={} slow_backward_ms={} \
         slow_backward_on={}",
        report.step_ms,
        report.backward_ms,
        report.finish_ms,
        args.mlp.overlap,
        args.slow_backward_ms,
        args.slow_backward_on
    );
    if let Some(host) = &report.host_params {
        let mut worst = 0.0f32;
        for (d, h) in report
            .device_params
            .iter()
            .flatten()
            .zip(host.iter().flatten())
        {
            worst = worst.max((d - h).abs() / h.abs().max(1e-3));
        }
        println!("max_param_diff={worst:.3e} (relative, device DDP against host DDP)");
        if worst.is_nan() || worst > 1e-3 {
            return Err(format!(
                "reference: device and host parameters differ by {worst:e} (relative), more \
                 than float tolerance"
            )
            .into());
        }
        println!("reference: ok");
    }
    Ok(())
}

fn main() -> Result<(), Failure> {
    let args = Args::parse();
    ringccl::logging::init_from_env();
    if !matches!(args.slow_backward_on.as_str(), "host" | "gpu") {
        return Err(format!(
            "--slow-backward-on {:?}: use host or gpu",
            args.slow_backward_on
        )
        .into());
    }
    match args.mlp.replicas {
        Some(n) => {
            let groups = ringccl::local_groups(&args.backend, n)?;
            let reports = std::thread::scope(|s| {
                let handles: Vec<_> = groups
                    .iter()
                    .map(|pg| s.spawn(|| train(pg, &args)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
                    .collect::<Vec<_>>()
            });
            let mut reports = reports.into_iter().collect::<Result<Vec<_>, _>>()?;
            let first = reports.remove(0);
            for other in &reports {
                if other.device_params != first.device_params {
                    return Err("ranks ended with different parameters".into());
                }
            }
            report(&args, n, &first)
        }
        None => {
            let pg = ringccl::init_process_group(&args.backend, ringccl::InitOptions::from_env()?)?;
            let result = train(&pg, &args)?;
            if pg.rank() == 0 {
                report(&args, pg.world_size(), &result)?;
            }
            Ok(())
        }
    }
}
