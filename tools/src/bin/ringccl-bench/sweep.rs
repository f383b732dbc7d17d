//! The measurements: every size of one element type and operator, checked and timed,
//! one table row each.

use ringccl::half::{bf16, f16};
use ringccl::{CollectiveKind, Error, ProcessGroup, ReduceOp, SharedBuffer};

use super::args::{sizes, Args};
use super::bench_op::{not_measured, BenchOp};
use super::check::check;
#[cfg(feature = "nccl")]
use super::device;
use super::elements::{input, BenchElem, DTYPE_NAMES};
use super::measure::{time_op, Iterations, Timing};
use super::memory::DeviceStream;
use super::report::{Report, Row};

/// Every size for one element type and operator.
fn sweep<T: BenchElem>(
    pg: &ProcessGroup,
    args: &Args,
    coll: BenchOp,
    op: ReduceOp,
    on_device: Option<&DeviceStream>,
    report: &mut Report,
) -> Result<(), Error> {
    let n = pg.world_size();
    let es = T::DTYPE.size();
    if args.stream_ordered && (on_device.is_none() || pg.backend() != "nccl") {
        return Err(Error::InvalidArgument(
            "--stream-ordered needs device buffers under nccl (--backend nccl; --memory \
             device or auto): other calls wait on the host anyway"
                .into(),
        ));
    }
    let iterations = match args.iters {
        Some(n) => Iterations::Fixed(n),
        None => Iterations::Budget(args.budget),
    };
    let all_sizes = if coll.kind() == CollectiveKind::Barrier {
        vec![0]
    } else {
        sizes(args)
    };
    let total = all_sizes.len();
    for (k, bytes) in all_sizes.into_iter().enumerate() {
        if total > 1 {
            report.progress(&format!(
                "ringccl-bench: {} {} {} {bytes} B ({}/{total})",
                coll.name(),
                T::NAME,
                op,
                k + 1
            ));
        }
        let mut count = (bytes / es).max(usize::from(coll.kind() != CollectiveKind::Barrier));
        if coll.in_blocks() {
            count = (count / n).max(1) * n;
        }
        let (wrong, timing) = match on_device {
            #[cfg(feature = "nccl")]
            Some(device) => device::measure::<T>(
                pg,
                device,
                coll.kind(),
                count,
                op,
                args.check,
                args.warmup,
                iterations,
                args.stream_ordered,
            )?,
            #[cfg(not(feature = "nccl"))]
            Some(device) => match *device {},
            None => measure_host::<T>(pg, args, coll, count, op, iterations)?,
        };
        let root = if coll.has_root() { 0 } else { -1 };
        let size = count * es;
        let algbw_gbps = size as f64 / timing.median_us / 1e3;
        report
            .row(&Row {
                coll: coll.name(),
                backend: pg.backend(),
                nranks: n,
                size,
                count,
                dtype: T::NAME,
                redop: if coll.reduces() { op.name() } else { "none" },
                root,
                time_us: timing.median_us,
                algbw_gbps,
                busbw_gbps: algbw_gbps * coll.bus_factor(n),
                wrong,
                loop_us: timing.loop_us,
                iters: timing.iters,
            })
            .map_err(Error::InvalidArgument)?;
    }
    Ok(())
}

/// Checks and times `coll` on host buffers of `count` elements: the wrong elements
/// summed over ranks, and the timing.
fn measure_host<T: BenchElem>(
    pg: &ProcessGroup,
    args: &Args,
    coll: BenchOp,
    count: usize,
    op: ReduceOp,
    iterations: Iterations,
) -> Result<(i64, Timing), Error> {
    let mut wrong = 0;
    for _ in 0..args.check {
        wrong += check::<T>(pg, coll, count, op, args.tensors)?;
    }
    let per = count / pg.world_size();
    let mut buf = if args.memory == "shared" {
        pg.shared_buffer::<T>(count)?
    } else {
        SharedBuffer::on_heap(count)
    };
    for (i, x) in buf.iter_mut().enumerate() {
        *x = input(pg.rank(), i, op);
    }
    let mut out = vec![T::from_small(0); count];
    let tensor_len = (count / args.tensors.max(1)).max(1);
    let timing = time_op(pg, args.warmup, iterations, || match (coll, coll.kind()) {
        (BenchOp::Bucketed, _) => {
            let mut views: Vec<&mut [T]> = buf.chunks_mut(tensor_len).collect();
            pg.all_reduce_bucketed(&mut views, op, args.bucket)
        }
        (BenchOp::Separate, _) => buf
            .chunks_mut(tensor_len)
            .try_for_each(|t| pg.all_reduce(t, op)),
        (_, CollectiveKind::AllReduce) => pg.all_reduce(&mut buf, op),
        (_, CollectiveKind::Broadcast) => pg.broadcast(&mut buf, 0),
        (_, CollectiveKind::Barrier) => pg.barrier(),
        (_, CollectiveKind::Reduce) => pg.reduce(&mut buf, op, 0),
        (_, CollectiveKind::AllGather) => pg.all_gather(&buf[..per], &mut out),
        (_, CollectiveKind::ReduceScatter) => pg.reduce_scatter(&buf, &mut out[..per], op),
        (_, CollectiveKind::AllToAll) => pg.all_to_all(&buf, &mut out),
        (_, other) => Err(not_measured(other)),
    })?;
    Ok((wrong, timing))
}

/// [`sweep`] for the element type named `dtype` (nccl-tests' names).
pub(crate) fn sweep_dtype(
    pg: &ProcessGroup,
    args: &Args,
    coll: BenchOp,
    dtype: &str,
    op: ReduceOp,
    on_device: Option<&DeviceStream>,
    report: &mut Report,
) -> Result<(), Error> {
    let d = on_device;
    match dtype {
        "float" => sweep::<f32>(pg, args, coll, op, d, report),
        "double" => sweep::<f64>(pg, args, coll, op, d, report),
        "half" => sweep::<f16>(pg, args, coll, op, d, report),
        "bfloat16" => sweep::<bf16>(pg, args, coll, op, d, report),
        "int8" => sweep::<i8>(pg, args, coll, op, d, report),
        "uint8" => sweep::<u8>(pg, args, coll, op, d, report),
        "int32" => sweep::<i32>(pg, args, coll, op, d, report),
        "int64" => sweep::<i64>(pg, args, coll, op, d, report),
        other => Err(Error::InvalidArgument(format!(
            "unknown -d {other:?}: use one of {} or all",
            DTYPE_NAMES.join(", ")
        ))),
    }
}
