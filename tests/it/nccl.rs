//! The `"nccl"` backend and device buffers.
//!
//! Everywhere: init on a machine without CUDA/NCCL is an error that says what is
//! missing, never a panic (tested for real, in-process here; through the benchmark in
//! the `ringccl-tools` package's tests).
//! With a GPU (see `scripts/gpu-check.sh`): NCCL at world size 1 runs every op and dtype
//! on host and device buffers; gloo runs device buffers at 2–4 ranks sharing the GPU;
//! `local_groups("nccl", n)` puts one rank per GPU in this process.
//! Tests that need a GPU print `skipped: no CUDA driver/NCCL (reason)` elsewhere.

#![cfg(feature = "nccl")]

use crate::common;

use std::time::{Duration, Instant};

use common::elements::{reference, TestElem};
use common::gpu::occupy;
use common::{heavy_lock, run_threads, GROUP_TIMEOUT};
use ringccl::core::{Deadline, MeshConfig};
use ringccl::cudarc::driver::{CudaContext, CudaStream};
use ringccl::half::{bf16, f16};
use ringccl::{
    cuda_device_count, init_process_group, DeviceElement, Error, InitOptions, NcclBackend,
    NcclConfig, ProcessGroup, ReduceOp,
};
use std::sync::Arc;

/// Every NCCL group here: a hang fails the test with NCCL's last words instead of
/// waiting out the 30-minute default.
const NCCL_TIMEOUT: Duration = Duration::from_secs(60);

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Product,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

/// NCCL's availability here; prints the skip line when it is not available.
fn nccl_or_skip(test: &str) -> Option<usize> {
    match NcclBackend::probe() {
        Ok(devices) => Some(devices),
        Err(e) => {
            println!("{test}: skipped: no CUDA driver/NCCL ({e})");
            None
        }
    }
}

fn cuda_or_skip(test: &str) -> Option<usize> {
    match cuda_device_count() {
        Ok(devices) => Some(devices),
        Err(e) => {
            println!("{test}: skipped: no CUDA driver/NCCL ({e})");
            None
        }
    }
}

#[test]
fn init_without_cuda_or_nccl_is_an_error_not_a_panic() {
    let _heavy = heavy_lock();
    let probe = NcclBackend::probe();
    let result = std::panic::catch_unwind(|| {
        init_process_group(
            "NCCL",
            InitOptions::new(0, 1, "127.0.0.1:0").timeout(NCCL_TIMEOUT),
        )
    })
    .expect("init must not panic");
    match probe {
        Err(reason) => {
            let err = result.expect_err("init must fail where the probe fails");
            assert!(
                matches!(
                    err,
                    Error::BackendUnavailable {
                        backend: "nccl",
                        ..
                    }
                ),
                "{err:?}"
            );
            let text = err.to_string();
            assert_eq!(text, reason.to_string());
            assert!(
                text.contains("LD_LIBRARY_PATH") || text.contains("sees no device"),
                "the message must say how to make the library loadable: {text}"
            );
            println!("without CUDA/NCCL, init says: {text}");
        }
        Ok(devices) => {
            let pg = result.expect("init at world size 1 on a GPU machine");
            assert_eq!(pg.backend(), "nccl");
            assert_eq!(pg.cuda_device(), Some(0));
            drop(pg);
            let err = init_process_group(
                "nccl",
                InitOptions::new(0, 1, "127.0.0.1:0").device(devices),
            )
            .expect_err("a device past the last one");
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(err.to_string().contains("device"), "{err}");
        }
    }
}

/// Every operation on host buffers for one type; `n` ranks' worth of checks.
fn host_ops<T: TestElem>(pg: &ProcessGroup) {
    let (rank, n) = (pg.rank(), pg.world_size());
    let len = 1000 * n + 3;
    for op in OPS {
        if op == ReduceOp::Avg && !T::DTYPE.is_float() {
            assert!(matches!(
                pg.all_reduce(&mut [T::input(rank, 0, op)], op),
                Err(Error::UnsupportedOp { .. })
            ));
            continue;
        }
        let mut buf: Vec<T> = (0..len).map(|i| T::input(rank, i, op)).collect();
        pg.all_reduce(&mut buf, op).unwrap();
        let want: Vec<T> = (0..len).map(|i| reference(n, i, op)).collect();
        assert_eq!(bytes(&buf), bytes(&want), "{} all_reduce {op}", T::DTYPE);

        let mut buf: Vec<T> = (0..len).map(|i| T::input(rank, i, op)).collect();
        pg.reduce(&mut buf, op, 0).unwrap();
        if rank == 0 {
            assert_eq!(bytes(&buf), bytes(&want), "{} reduce {op}", T::DTYPE);
        }

        let input: Vec<T> = (0..len - 3).map(|i| T::input(rank, i, op)).collect();
        let mut out = vec![T::input(0, 0, ReduceOp::Sum); (len - 3) / n];
        pg.reduce_scatter(&input, &mut out, op).unwrap();
        let per = (len - 3) / n;
        let want: Vec<T> = (0..per).map(|i| reference(n, rank * per + i, op)).collect();
        assert_eq!(
            bytes(&out),
            bytes(&want),
            "{} reduce_scatter {op}",
            T::DTYPE
        );

        let work = pg
            .all_reduce_async(vec![T::input(rank, 5, op); 17], op)
            .unwrap();
        let got = work.wait().unwrap();
        assert_eq!(bytes(&got), bytes(&[reference::<T>(n, 5, op); 17]));
    }
    let op = ReduceOp::Sum;
    let mut buf: Vec<T> = (0..len).map(|i| T::input(rank, i, op)).collect();
    pg.broadcast(&mut buf, n - 1).unwrap();
    let want: Vec<T> = (0..len).map(|i| T::input(n - 1, i, op)).collect();
    assert_eq!(bytes(&buf), bytes(&want), "{} broadcast", T::DTYPE);

    let per = 333;
    let mine: Vec<T> = (0..per).map(|i| T::input(rank, i, op)).collect();
    let mut out = vec![T::input(0, 0, op); per * n];
    pg.all_gather(&mine, &mut out).unwrap();
    let want: Vec<T> = (0..per * n)
        .map(|j| T::input(j / per, j % per, op))
        .collect();
    assert_eq!(bytes(&out), bytes(&want), "{} all_gather", T::DTYPE);

    let mine: Vec<T> = (0..per * n).map(|i| T::input(rank, i, op)).collect();
    pg.all_to_all(&mine, &mut out).unwrap();
    let want: Vec<T> = (0..per * n)
        .map(|j| T::input(j / per, rank * per + j % per, op))
        .collect();
    assert_eq!(bytes(&out), bytes(&want), "{} all_to_all", T::DTYPE);

    let mut a: Vec<T> = (0..10).map(|i| T::input(rank, i, op)).collect();
    let mut b: Vec<T> = (0..5000).map(|i| T::input(rank, i + 10, op)).collect();
    pg.all_reduce_bucketed(&mut [&mut a[..], &mut b[..]], op, 4096)
        .unwrap();
    let want: Vec<T> = (0..5010).map(|i| reference(n, i, op)).collect();
    assert_eq!(
        bytes(&[a, b].concat()),
        bytes(&want),
        "{} bucketed",
        T::DTYPE
    );
    pg.barrier().unwrap();
}

/// Every device-buffer operation for one type.
fn device_ops<T: TestElem + DeviceElement>(pg: &ProcessGroup, stream: &Arc<CudaStream>) {
    let (rank, n) = (pg.rank(), pg.world_size());
    let len = 1000 * n;
    let per = len / n;
    for op in OPS {
        if op == ReduceOp::Avg && !T::DTYPE.is_float() {
            continue;
        }
        let mine: Vec<T> = (0..len).map(|i| T::input(rank, i, op)).collect();
        let want: Vec<T> = (0..len).map(|i| reference(n, i, op)).collect();
        let mut buf = stream.clone_htod(&mine).unwrap();
        pg.all_reduce_device(&mut buf, op).unwrap();
        let got = stream.clone_dtoh(&buf).unwrap();
        assert_eq!(
            bytes(&got),
            bytes(&want),
            "{} all_reduce_device {op}",
            T::DTYPE
        );

        let mut buf = stream.clone_htod(&mine).unwrap();
        pg.reduce_device(&mut buf, op, 0).unwrap();
        if rank == 0 {
            let got = stream.clone_dtoh(&buf).unwrap();
            assert_eq!(bytes(&got), bytes(&want), "{} reduce_device {op}", T::DTYPE);
        }

        let input = stream.clone_htod(&mine).unwrap();
        let mut out = stream.alloc_zeros::<T>(per).unwrap();
        pg.reduce_scatter_device(&input, &mut out, op).unwrap();
        let got = stream.clone_dtoh(&out).unwrap();
        assert_eq!(bytes(&got), bytes(&want[rank * per..(rank + 1) * per]));

        let buf = stream.clone_htod(&mine).unwrap();
        let buf = pg.all_reduce_device_async(buf, op).unwrap().wait().unwrap();
        let got = stream.clone_dtoh(&buf).unwrap();
        assert_eq!(
            bytes(&got),
            bytes(&want),
            "{} all_reduce_device_async",
            T::DTYPE
        );

        // Stream-ordered: no host wait; cudarc orders the read after NCCL's write.
        let mut buf = stream.clone_htod(&mine).unwrap();
        pg.all_reduce_device_enqueued(&mut buf, op).unwrap();
        let got = stream.clone_dtoh(&buf).unwrap();
        assert_eq!(
            bytes(&got),
            bytes(&want),
            "{} all_reduce_device_enqueued",
            T::DTYPE
        );
    }
    pg.synchronize_device().unwrap();
    let op = ReduceOp::Sum;
    let mine: Vec<T> = (0..len).map(|i| T::input(rank, i, op)).collect();
    let mut buf = stream.clone_htod(&mine).unwrap();
    pg.broadcast_device(&mut buf, n - 1).unwrap();
    let want: Vec<T> = (0..len).map(|i| T::input(n - 1, i, op)).collect();
    assert_eq!(bytes(&stream.clone_dtoh(&buf).unwrap()), bytes(&want));

    let input = stream.clone_htod(&mine[..per]).unwrap();
    let mut out = stream.alloc_zeros::<T>(len).unwrap();
    pg.all_gather_device(&input, &mut out).unwrap();
    let want: Vec<T> = (0..len).map(|j| T::input(j / per, j % per, op)).collect();
    assert_eq!(bytes(&stream.clone_dtoh(&out).unwrap()), bytes(&want));
}

fn bytes<T: TestElem>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn every_type(pg: &ProcessGroup, stream: &Arc<CudaStream>) {
    host_ops::<f32>(pg);
    host_ops::<f64>(pg);
    host_ops::<f16>(pg);
    host_ops::<bf16>(pg);
    host_ops::<i32>(pg);
    host_ops::<i64>(pg);
    host_ops::<u8>(pg);
    host_ops::<i8>(pg);
    device_ops::<f32>(pg, stream);
    device_ops::<f64>(pg, stream);
    device_ops::<f16>(pg, stream);
    device_ops::<bf16>(pg, stream);
    device_ops::<i32>(pg, stream);
    device_ops::<i64>(pg, stream);
    device_ops::<u8>(pg, stream);
    device_ops::<i8>(pg, stream);
}

#[test]
fn nccl_runs_every_op_and_type_on_host_and_device_buffers() {
    let test = "nccl_runs_every_op_and_type_on_host_and_device_buffers";
    if nccl_or_skip(test).is_none() {
        return;
    }
    let _heavy = heavy_lock();
    // NCCL refuses two ranks on one GPU, so one rank: the data paths (staging, device
    // pointers, every dtype and op mapping) are what this checks.
    let opts = InitOptions::new(0, 1, "127.0.0.1:0").timeout(NCCL_TIMEOUT);
    let pg = init_process_group("nccl", opts).unwrap();
    let stream = CudaContext::new(pg.cuda_device().unwrap())
        .unwrap()
        .new_stream()
        .unwrap();
    every_type(&pg, &stream);
    println!("{test}: ok on cuda:{}", pg.cuda_device().unwrap());
}

#[test]
fn gloo_stages_device_buffers_through_the_host() {
    let test = "gloo_stages_device_buffers_through_the_host";
    if cuda_or_skip(test).is_none() {
        return;
    }
    let _heavy = heavy_lock();
    for n in [2, 3, 4] {
        run_threads(n, GROUP_TIMEOUT, |pg| {
            let stream = CudaContext::new(0).unwrap().new_stream().unwrap();
            device_ops::<f32>(&pg, &stream);
            device_ops::<bf16>(&pg, &stream);
            device_ops::<i64>(&pg, &stream);
            device_ops::<u8>(&pg, &stream);
        });
    }
    println!("{test}: ok at 2, 3 and 4 ranks");
}

/// A buffer of known values on `device`'s default stream, through a `CudaContext` handle
/// of its own that never made a stream, so cudarc's per-buffer tracking is off for it
/// (the README's pattern); the values are on the GPU when this returns.
fn untracked_buffer(
    device: usize,
) -> (
    Arc<CudaStream>,
    Vec<f32>,
    ringccl::cudarc::driver::CudaSlice<f32>,
) {
    let stream = CudaContext::new(device).unwrap().default_stream();
    let values: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let buf = stream.clone_htod(&values).unwrap();
    stream.synchronize().unwrap();
    (stream, values, buf)
}

/// A device all-reduce runs after the work queued on its buffer's stream, even for a
/// buffer whose `CudaContext` handle never made a stream (cudarc tracks nothing for it,
/// and NCCL's stream, made non-blocking, does not wait for the legacy default stream by
/// itself): the call waits for a 1 s kernel queued ahead of it on the buffer's stream,
/// and the buffer's stream waits for the call.
#[test]
fn a_device_all_reduce_waits_for_its_buffers_stream() {
    let test = "a_device_all_reduce_waits_for_its_buffers_stream";
    if nccl_or_skip(test).is_none() {
        return;
    }
    let _heavy = heavy_lock();
    let opts = InitOptions::new(0, 1, "127.0.0.1:0").timeout(NCCL_TIMEOUT);
    let pg = init_process_group("nccl", opts).unwrap();
    let (stream, values, mut buf) = untracked_buffer(pg.cuda_device().unwrap());
    for stream_ordered in [false, true] {
        let busy = occupy(&stream, 1.0);
        let started = Instant::now();
        if stream_ordered {
            pg.all_reduce_device_enqueued(&mut buf, ReduceOp::Sum)
                .unwrap();
            pg.synchronize_device().unwrap();
        } else {
            pg.all_reduce_device(&mut buf, ReduceOp::Sum).unwrap();
        }
        let waited = started.elapsed();
        println!("{test}: stream_ordered={stream_ordered}: the call ended after {waited:?}");
        assert!(
            waited >= Duration::from_millis(900),
            "NCCL ran before the kernel queued ahead on the buffer's stream: {waited:?}"
        );
        assert_eq!(stream.clone_dtoh(&buf).unwrap(), values, "world size 1");
        stream.synchronize().unwrap();
        drop(busy);
    }
    println!("{test}: ok");
}

/// After a stream-ordered device all-reduce, work queued on the buffer's stream waits
/// for it, even where cudarc tracks nothing for the buffer (its context handle made no
/// stream): with NCCL's stream busy for 1 s, a copy of the buffer queued on the buffer's
/// stream right after the call ends only once NCCL is done.
#[test]
fn the_buffers_stream_waits_for_a_stream_ordered_all_reduce() {
    let test = "the_buffers_stream_waits_for_a_stream_ordered_all_reduce";
    if nccl_or_skip(test).is_none() {
        return;
    }
    let _heavy = heavy_lock();
    let mesh = MeshConfig::new(0, 1, "127.0.0.1:0", NCCL_TIMEOUT);
    let nccl = NcclBackend::connect(NcclConfig::new(mesh)).unwrap();
    let (stream, values, mut buf) = untracked_buffer(nccl.device());
    let busy = occupy(nccl.stream(), 1.0);
    let started = Instant::now();
    let deadline = Deadline::after(NCCL_TIMEOUT);
    nccl.all_reduce_device_enqueued(&mut buf, ReduceOp::Sum, deadline)
        .unwrap();
    let got = stream.clone_dtoh(&buf).unwrap();
    let waited = started.elapsed();
    println!("{test}: the copy on the buffer's stream ended after {waited:?}");
    assert!(
        waited >= Duration::from_millis(900),
        "the buffer's stream did not wait for NCCL's: {waited:?}"
    );
    assert_eq!(got, values, "world size 1");
    nccl.wait_in_flight().unwrap();
    drop(busy);
    println!("{test}: ok");
}

/// Under gloo, a device buffer is staged through the host; a copy to pageable host
/// memory waits for everything queued ahead on the buffer's stream. With a 5 s kernel
/// ahead and a 2 s group timeout, the call fails at its deadline with an error that says
/// what it waited for, instead of waiting for the kernel.
#[test]
fn a_staged_device_buffer_behind_a_stuck_stream_fails_at_the_deadline() {
    let test = "a_staged_device_buffer_behind_a_stuck_stream_fails_at_the_deadline";
    if cuda_or_skip(test).is_none() {
        return;
    }
    let _heavy = heavy_lock();
    let opts = InitOptions::new(0, 1, "127.0.0.1:0").timeout(Duration::from_secs(2));
    let pg = init_process_group("gloo", opts).unwrap();
    let stream = CudaContext::new(0).unwrap().new_stream().unwrap();
    let mut buf = stream.clone_htod(&[1.0f32; 256]).unwrap();
    stream.synchronize().unwrap();
    let busy = occupy(&stream, 5.0);
    let started = Instant::now();
    let err = pg.all_reduce_device(&mut buf, ReduceOp::Sum).unwrap_err();
    let waited = started.elapsed();
    let text = err.to_string();
    println!("{test}: after {waited:?}: {text}");
    assert!(
        waited < Duration::from_secs(4),
        "bounded by the 2 s deadline, not the 5 s kernel: {waited:?}"
    );
    assert!(
        text.contains("all_reduce") && text.contains("the buffer's producer"),
        "names the op and what it waited for: {text}"
    );
    // This rank skipped the collective its peers would run: the group is broken.
    let later = pg.all_reduce(&mut [1.0f32], ReduceOp::Sum);
    assert!(later.is_err(), "the group refuses later calls: {later:?}");
    stream.synchronize().unwrap();
    drop(busy);
    println!("{test}: ok");
}

#[test]
fn two_nccl_ranks_on_one_gpu_fail_cleanly_or_work() {
    let test = "two_nccl_ranks_on_one_gpu_fail_cleanly_or_work";
    let Some(devices) = nccl_or_skip(test) else {
        return;
    };
    if devices != 1 {
        println!("{test}: skipped: {devices} GPUs, each rank gets its own");
        return;
    }
    let _heavy = heavy_lock();
    let listener = ringccl::StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut listener = Some(listener);
    let results: Vec<Result<Vec<f32>, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let mut opts = InitOptions::new(rank, 2, &addr).timeout(NCCL_TIMEOUT);
                if rank == 0 {
                    opts = opts.store_listener(listener.take().unwrap());
                }
                s.spawn(move || {
                    let pg = init_process_group("nccl", opts)?;
                    let mut x = vec![rank as f32 + 1.0; 1000];
                    pg.all_reduce(&mut x, ReduceOp::Sum)?;
                    Ok(x)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, result) in results.iter().enumerate() {
        match result {
            Ok(x) => assert!(x.iter().all(|&v| v == 3.0), "rank {rank}"),
            Err(e) => println!("{test}: rank {rank} failed cleanly: {e}"),
        }
    }
}

/// `local_groups("nccl", n)`: one rank per visible GPU (at most 2), joined together in
/// this process, all-reduce bit-identically; asking for more ranks than GPUs is an error
/// that says so.
#[test]
fn local_nccl_ranks_one_per_gpu_reduce_together() {
    let Some(devices) = nccl_or_skip("local_nccl_ranks_one_per_gpu_reduce_together") else {
        match ringccl::local_groups("nccl", 1) {
            Err(e) => assert!(e.to_string().contains("nccl"), "names the backend: {e}"),
            Ok(_) => panic!("NCCL is unavailable, yet local NCCL ranks started"),
        }
        return;
    };
    let _guard = heavy_lock();
    match ringccl::local_groups("nccl", devices + 1) {
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains("GPUs"), "says why: {reason}")
        }
        other => panic!("{} ranks on {devices} GPU(s): {other:?}", devices + 1),
    }
    let n = devices.min(2);
    let opts = InitOptions::new(0, n, "127.0.0.1:0").timeout(NCCL_TIMEOUT);
    let ranks = ringccl::local_groups_with("nccl", n, opts).expect("local NCCL ranks");
    assert_eq!(ranks.len(), n);
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|pg| {
                s.spawn(move || {
                    let mut x: Vec<f32> = (0..1000)
                        .map(|i| (pg.rank() * 1000 + i) as f32 * 0.1)
                        .collect();
                    pg.all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked").expect("all-reduce"))
            .collect()
    });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for other in &sums[1..] {
        assert_eq!(bits(other), bits(&sums[0]), "bit-identical on every GPU");
    }
    for (i, got) in sums[0].iter().enumerate() {
        let want: f32 = (0..n).map(|r| (r * 1000 + i) as f32 * 0.1).sum();
        assert!(
            (got - want).abs() <= 1e-3 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
    println!("local_nccl_ranks_one_per_gpu_reduce_together: {n} rank(s) on {devices} GPU(s): ok");
}

/// With two GPUs: ranks that disagree on the reduction (same count and type, where NCCL
/// alone returns different results and no error) get `CollectiveMismatch`, from the
/// fingerprint each rank sends the next over the control connections. One GPU cannot run
/// two NCCL ranks: the test then says so.
#[test]
fn a_mismatch_between_nccl_ranks_is_named() {
    let test = "a_mismatch_between_nccl_ranks_is_named";
    let Some(devices) = nccl_or_skip(test) else {
        return;
    };
    if devices < 2 {
        println!("{test}: skipped: {devices} GPU(s) visible; two NCCL ranks need two GPUs");
        return;
    }
    let _heavy = heavy_lock();
    let opts = InitOptions::new(0, 2, "127.0.0.1:0").timeout(NCCL_TIMEOUT);
    let ranks = ringccl::local_groups_with("nccl", 2, opts).expect("two local NCCL ranks");
    let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|pg| {
                s.spawn(move || {
                    let mut x = vec![1.0f32; 1024];
                    let op = if pg.rank() == 0 {
                        ReduceOp::Sum
                    } else {
                        ReduceOp::Max
                    };
                    pg.all_reduce(&mut x, op)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(Error::CollectiveMismatch { .. }))),
        "{results:?}"
    );
    println!("{test}: ok: {results:?}");
}
