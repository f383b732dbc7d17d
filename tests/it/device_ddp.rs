//! DDP on device gradients (`DeviceDdp`) against host DDP (`DistributedDataParallel`),
//! step for step, on the same group: the averaged gradients must be the same bits.
//!
//! With a GPU (see `scripts/gpu-check.sh`): NCCL at world size 1, and gloo with device
//! buffers at 2, 3 and 4 ranks sharing GPU 0; several buckets, the one-time rebuild, a
//! `no_sync` micro-batch, an unused parameter, gradient-as-bucket-view, and both
//! compression hooks. Elsewhere each test prints why it skipped. The bookkeeping both
//! share (`ringccl_ddp::Reducer`) is tested without a GPU through host DDP.

#![cfg(feature = "nccl")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use common::gpu::occupy;
use common::{heavy_lock, run_threads};
use ringccl::cudarc::driver::{CudaContext, CudaStream};
use ringccl::ddp::{
    Bf16CompressHook, DdpConfig, DistributedDataParallel, Fp16CompressHook, ParamSpec,
};
use ringccl::half::{bf16, f16};
use ringccl::{
    DType, DeviceCommHook, DeviceDdp, DeviceGrad, InitOptions, NcclBackend, ProcessGroup,
};

/// Parameter sizes: several buckets at the caps below, and one parameter (#3) that is
/// unused on odd steps (on every rank but rank 0 at step 3).
const NUMELS: [usize; 6] = [700, 33, 1500, 17, 260, 1];
const UNUSED: usize = 3;
const STEPS: u64 = 4;

fn cuda_or_skip(test: &str) -> bool {
    match ringccl::cuda_device_count() {
        Ok(n) if n > 0 => true,
        Ok(_) => {
            println!("{test}: skipped: no CUDA device visible");
            false
        }
        Err(e) => {
            println!("{test}: skipped: no CUDA driver ({e})");
            false
        }
    }
}

/// Rank `rank`'s gradient of parameter `p` at `step` (micro-batch `micro`).
fn grad(rank: usize, p: usize, step: u64, micro: u64) -> Vec<f32> {
    (0..NUMELS[p])
        .map(|i| {
            let x = (rank * 7919 + p * 104_729 + i * 31 + step as usize * 13 + micro as usize * 5)
                as f32;
            (x * 0.618_034).sin() * (1.0 + (i % 7) as f32)
        })
        .collect()
}

fn config(view: bool) -> DdpConfig {
    DdpConfig::default()
        .first_bucket_bytes(1200)
        .bucket_cap_bytes(4000)
        .find_unused_parameters(true)
        .gradient_as_bucket_view(view)
}

/// Runs the same steps through host DDP and device DDP on `pg`, gradients of type `T`,
/// and checks after every step that their averaged gradients are the same bits.
fn compare<T: DeviceGrad + Pod>(
    pg: &ProcessGroup,
    stream: &Arc<CudaStream>,
    hook: DeviceCommHook,
    view: bool,
) {
    let rank = pg.rank();
    let specs: Vec<ParamSpec> = NUMELS
        .iter()
        .enumerate()
        .map(|(i, &n)| ParamSpec::new(format!("p{i}"), n, T::DTYPE))
        .collect();
    let mut host = DistributedDataParallel::<T>::new(pg, &specs, config(view)).unwrap();
    let mut device = DeviceDdp::<T>::new(pg, stream, &specs, config(view)).unwrap();
    match hook {
        DeviceCommHook::AllReduce => {}
        DeviceCommHook::Fp16Compress => host.register_comm_hook(Fp16CompressHook),
        DeviceCommHook::Bf16Compress => host.register_comm_hook(Bf16CompressHook),
    }
    device.register_comm_hook(hook);
    // Backward's order: not the registration order reversed, so the rebuild matters.
    let order = [4, 5, 2, 3, 0, 1];
    for step in 0..STEPS {
        // Step 3: rank 0 alone uses it, so it is used somewhere.
        let used = |p: usize| p != UNUSED || step % 2 == 0 || (step == 3 && rank == 0);
        // Step 2 accumulates a no_sync micro-batch first.
        let micro_batches = if step == 2 { 2 } else { 1 };
        for micro in 0..micro_batches {
            let sync = micro + 1 == micro_batches;
            host.set_no_sync(!sync);
            device.set_no_sync(!sync);
            for &p in order.iter().filter(|&&p| used(p)) {
                let g: Vec<T> = grad(rank, p, step, micro)
                    .into_iter()
                    .map(T::from_f32)
                    .collect();
                let on_device = stream.clone_htod(&g).unwrap();
                if view {
                    let accumulate = micro > 0;
                    let into = host.grad_view_mut(p).unwrap();
                    for (d, &x) in into.iter_mut().zip(&g) {
                        *d = if accumulate { d.add(x) } else { x };
                    }
                    host.mark_grad_ready_in_view(p).unwrap();
                    let mut view = device.grad_view_mut(p).unwrap();
                    if accumulate {
                        let mut sum = stream.clone_dtoh(&view).unwrap();
                        sum.iter_mut().zip(&g).for_each(|(d, &x)| *d = d.add(x));
                        stream.memcpy_htod(&sum, &mut view).unwrap();
                    } else {
                        stream.memcpy_dtod(&on_device, &mut view).unwrap();
                    }
                    device.mark_grad_ready_in_view(p).unwrap();
                } else {
                    host.mark_grad_ready(p, &g).unwrap();
                    device.mark_grad_ready(p, &on_device.slice(..)).unwrap();
                }
            }
            // A no_sync pass needs no finish (torch's rule): the next mark closes it.
            if sync {
                host.finish().unwrap();
                device.finish().unwrap();
            }
        }
        assert_eq!(
            host.bucket_layout(),
            device.bucket_layout(),
            "rank {rank} step {step}"
        );
        // #UNUSED sits out step 1 on every rank: unused everywhere, on both DDPs.
        let unused_everywhere: &[usize] = if step == 1 { &[UNUSED] } else { &[] };
        assert_eq!(host.unused_everywhere(), unused_everywhere, "step {step}");
        assert_eq!(device.unused_everywhere(), unused_everywhere, "step {step}");
        for p in 0..NUMELS.len() {
            let want = host.grad(p).unwrap().to_vec();
            let got = stream.clone_dtoh(&device.grad(p).unwrap()).unwrap();
            let bits = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
            assert_eq!(
                bits(&got),
                bits(&want),
                "rank {rank} step {step} parameter {p} ({} {hook:?}, view {view}): device DDP \
                 differs from host DDP",
                T::DTYPE
            );
        }
    }
    assert_eq!(device.steps(), host.steps());
}

fn every_variant(pg: &ProcessGroup, stream: &Arc<CudaStream>) {
    for hook in [
        DeviceCommHook::AllReduce,
        DeviceCommHook::Fp16Compress,
        DeviceCommHook::Bf16Compress,
    ] {
        compare::<f32>(pg, stream, hook, false);
    }
    compare::<f32>(pg, stream, DeviceCommHook::AllReduce, true);
    // The other gradient types: their own kernels (f16/bf16 computed in f32 and rounded
    // back after every operation, as host DDP does).
    compare::<f64>(pg, stream, DeviceCommHook::Bf16Compress, false);
    for view in [false, true] {
        compare::<f16>(pg, stream, DeviceCommHook::AllReduce, view);
        compare::<bf16>(pg, stream, DeviceCommHook::AllReduce, view);
    }
    compare::<bf16>(pg, stream, DeviceCommHook::Fp16Compress, false);
}

#[test]
fn device_ddp_matches_host_ddp_under_gloo_with_ranks_sharing_the_gpu() {
    let test = "device_ddp_matches_host_ddp_under_gloo_with_ranks_sharing_the_gpu";
    if !cuda_or_skip(test) {
        return;
    }
    let _heavy = heavy_lock();
    for n in [2, 3, 4] {
        run_threads(n, Duration::from_secs(120), |pg| {
            let stream = CudaContext::new(0).unwrap().new_stream().unwrap();
            every_variant(&pg, &stream);
        });
    }
    println!("{test}: ok at 2, 3 and 4 ranks");
}

#[test]
fn device_ddp_matches_host_ddp_under_nccl_at_world_size_one() {
    let test = "device_ddp_matches_host_ddp_under_nccl_at_world_size_one";
    if let Err(e) = NcclBackend::probe() {
        println!("{test}: skipped: no CUDA driver/NCCL ({e})");
        return;
    }
    let _heavy = heavy_lock();
    let opts = InitOptions::new(0, 1, "127.0.0.1:0").timeout(Duration::from_secs(60));
    let pg = ringccl::init_process_group("nccl", opts).unwrap();
    let device = pg.cuda_device().unwrap();
    let stream = CudaContext::new(device).unwrap().new_stream().unwrap();
    every_variant(&pg, &stream);
    // A stream on another device than the communicator's is refused up front.
    if ringccl::cuda_device_count().unwrap_or(0) > 1 {
        let other = CudaContext::new(1 - device.min(1))
            .unwrap()
            .new_stream()
            .unwrap();
        let err = DeviceDdp::<f32>::with_params(&pg, &other, [("w", 4)], DdpConfig::default())
            .unwrap_err();
        assert!(err.to_string().contains("cuda:"), "{err}");
    }
    println!("{test}: ok on cuda:{device}");
}

#[test]
fn device_ddp_refuses_bad_input_without_breaking() {
    let test = "device_ddp_refuses_bad_input_without_breaking";
    if !cuda_or_skip(test) {
        return;
    }
    let _heavy = heavy_lock();
    let pg = ringccl::init_process_group("gloo", InitOptions::new(0, 1, "127.0.0.1:0")).unwrap();
    let stream = CudaContext::new(0).unwrap().new_stream().unwrap();
    let wrong_type = [ParamSpec::new("w", 4, DType::F64)];
    assert!(DeviceDdp::<f32>::new(&pg, &stream, &wrong_type, DdpConfig::default()).is_err());
    let mut ddp =
        DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 4), ("b", 2)], DdpConfig::default())
            .unwrap();
    let g = stream.clone_htod(&[1.0f32; 3]).unwrap();
    let err = ddp.mark_grad_ready(0, &g.slice(..)).unwrap_err();
    assert!(
        err.to_string().contains("4"),
        "names the registered length: {err}"
    );
    assert!(ddp.mark_grad_ready(7, &g.slice(..2)).is_err());
    assert!(
        ddp.grad_view_mut(0).is_err(),
        "needs gradient_as_bucket_view"
    );
    ddp.mark_grad_ready(1, &g.slice(..2)).unwrap();
    let err = ddp.finish().unwrap_err();
    assert!(
        err.to_string().contains("\"w\""),
        "names the missing gradient: {err}"
    );
    // The no_sync guard: accumulated while it lives, reduced with the next pass.
    let mut ddp =
        DeviceDdp::<f32>::with_params(&pg, &stream, [("w", 3)], DdpConfig::default()).unwrap();
    let g = stream.clone_htod(&[1.0f32, 2.0, 3.0]).unwrap();
    ddp.no_sync().mark_grad_ready(0, &g.slice(..)).unwrap();
    ddp.mark_grad_ready(0, &g.slice(..)).unwrap();
    ddp.finish().unwrap();
    let got = stream.clone_dtoh(&ddp.grad(0).unwrap()).unwrap();
    assert_eq!(got, [2.0, 4.0, 6.0]);
    println!("{test}: ok");
}

/// One bucket's all-reduce stuck behind the trainer's stream: a group of one under NCCL
/// (calls due within `timeout`), a `DeviceDdp` of one parameter, and its gradient `grad`
/// marked and the step finished while the stream is busy for `busy_s` seconds ahead.
struct BehindBusyStream {
    pg: ProcessGroup,
    stream: Arc<CudaStream>,
    ddp: DeviceDdp<f32>,
    grad: ringccl::cudarc::driver::CudaSlice<f32>,
    /// Just after the busy kernel's launch; how long marking and `finish` took after.
    started: Instant,
    finish_took: Duration,
    /// The busy kernel's module: it must outlive the kernel.
    busy: Arc<ringccl::cudarc::driver::CudaModule>,
    _heavy: std::sync::MutexGuard<'static, ()>,
}

/// [`BehindBusyStream`], or `None` (with the reason printed) without NCCL.
fn finish_behind_busy_stream(
    test: &str,
    timeout: Duration,
    grad: &[f32],
    busy_s: f64,
) -> Option<BehindBusyStream> {
    if let Err(e) = NcclBackend::probe() {
        println!("{test}: skipped: no CUDA driver/NCCL ({e})");
        return None;
    }
    let heavy = heavy_lock();
    let opts = InitOptions::new(0, 1, "127.0.0.1:0").timeout(timeout);
    let pg = ringccl::init_process_group("nccl", opts).unwrap();
    let context = CudaContext::new(pg.cuda_device().unwrap()).unwrap();
    let stream = context.new_stream().unwrap();
    let params = [("w", grad.len())];
    let mut ddp =
        DeviceDdp::<f32>::with_params(&pg, &stream, params, DdpConfig::default()).unwrap();
    let grad = stream.clone_htod(grad).unwrap();
    // A first step with nothing ahead: it ends with the one-time rebuild, whose
    // broadcast of the bucket order is a host collective and so waits for the GPU (as
    // torch's does). The test is about every later step.
    ddp.mark_grad_ready(0, &grad.slice(..)).unwrap();
    ddp.finish().unwrap();
    ddp.synchronize().unwrap();
    let busy = occupy(&stream, busy_s);
    let started = Instant::now();
    ddp.mark_grad_ready(0, &grad.slice(..)).unwrap();
    ddp.finish().unwrap();
    let finish_took = started.elapsed();
    println!("{test}: finish returned after {finish_took:?} with {busy_s} s of GPU work ahead");
    assert!(
        finish_took < Duration::from_secs(2),
        "finish waited for the GPU: {finish_took:?}"
    );
    Some(BehindBusyStream {
        pg,
        stream,
        ddp,
        grad,
        started,
        finish_took,
        busy,
        _heavy: heavy,
    })
}

/// Under NCCL, `finish` orders the trainer's stream after the buckets and returns
/// without waiting for the GPU (PyTorch's behaviour): with the trainer's stream busy for
/// 3 s ahead of the bucket, `finish` returns well before, and the gradient read on the
/// stream afterwards is the reduced one.
#[test]
fn finish_orders_the_trainers_stream_without_waiting_on_the_host() {
    let test = "finish_orders_the_trainers_stream_without_waiting_on_the_host";
    let values: Vec<f32> = (0..1024).map(|i| i as f32 * 0.25).collect();
    let Some(mut run) = finish_behind_busy_stream(test, Duration::from_secs(60), &values, 3.0)
    else {
        return;
    };
    let got = run.stream.clone_dtoh(&run.ddp.grad(0).unwrap()).unwrap();
    let waited = run.started.elapsed();
    // `started` is taken just after the busy kernel's launch (which may already run).
    assert!(
        waited >= Duration::from_millis(2900),
        "the read on the trainer's stream comes after the busy kernel: {waited:?}"
    );
    assert_eq!(got, values, "world size 1: the average is the gradient");
    run.ddp.synchronize().unwrap();
    // The next step runs as usual, and the host can wait for it when it must.
    run.ddp.mark_grad_ready(0, &run.grad.slice(..)).unwrap();
    run.ddp.finish().unwrap();
    run.ddp.synchronize().unwrap();
    println!("{test}: ok");
}

/// NCCL has no deadline of its own: a bucket whose all-reduce cannot finish (NCCL's
/// stream waits behind a trainer's kernel that runs for 6 s) fails at the group's 2 s
/// deadline although `finish` returned at once: the group's worker watches it, the
/// communicator is aborted, `synchronize` returns the error naming the operation, and
/// the group refuses later calls instead of hanging.
#[test]
fn a_deadline_that_passes_while_nccl_waits_aborts_and_names_the_op() {
    let test = "a_deadline_that_passes_while_nccl_waits_aborts_and_names_the_op";
    let Some(mut run) = finish_behind_busy_stream(test, Duration::from_secs(2), &[1.0; 1024], 6.0)
    else {
        return;
    };
    let err = run.ddp.synchronize().unwrap_err();
    let waited = run.started.elapsed();
    let text = err.to_string();
    println!(
        "{test}: finish after {:?}; error after {waited:?}: {text}",
        run.finish_took
    );
    // The 2 s deadline, plus at most ABORT_LIMIT (10 s) for ncclCommAbort, plus slack.
    assert!(
        waited < Duration::from_secs(15),
        "bounded by the deadline: {waited:?}"
    );
    assert!(text.contains("all_reduce"), "names the op: {text}");
    assert!(
        text.contains("aborted"),
        "says the communicator was aborted: {text}"
    );
    let later = run.pg.all_reduce(&mut [1.0f32], ringccl::ReduceOp::Sum);
    assert!(later.is_err(), "the aborted group refuses later calls");
    assert!(run.ddp.finish().is_err(), "the DDP is broken too");
    run.stream.synchronize().unwrap();
    drop(run.busy);
    println!("{test}: ok");
}

/// With nobody waiting — the trainer has moved on after `finish` — the group's worker
/// still catches the overdue bucket, aborts the communicator, and the trainer's next
/// call returns the timeout itself, naming the bucket's operation.
#[test]
fn an_overdue_bucket_nobody_waits_for_fails_the_next_call() {
    let test = "an_overdue_bucket_nobody_waits_for_fails_the_next_call";
    let Some(mut run) = finish_behind_busy_stream(test, Duration::from_secs(2), &[1.0; 256], 5.0)
    else {
        return;
    };
    // Past the deadline, and past the abort (which waits for the busy kernel).
    std::thread::sleep(Duration::from_millis(5500));
    let err = run
        .pg
        .all_reduce(&mut [1.0f32], ringccl::ReduceOp::Sum)
        .unwrap_err();
    let text = err.to_string();
    println!("{test}: the next call: {text}");
    assert!(
        text.contains("did not finish on the GPU") && text.contains("all_reduce"),
        "the bucket's own timeout, naming it: {text}"
    );
    assert!(run.ddp.synchronize().is_err(), "the DDP's group is broken");
    run.stream.synchronize().unwrap();
    println!("{test}: ok");
}
