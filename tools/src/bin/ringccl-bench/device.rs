//! `--memory device`: buffers in GPU memory (`CudaSlice`), as nccl-tests measures. Under
//! `--backend nccl` they go to NCCL directly; under gloo they are staged through the
//! host.

use ringccl::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};
use ringccl::{CollectiveKind, Error, ProcessGroup, ReduceOp};
use std::sync::Arc;

use super::bench_op::BenchOp;
use super::check::{count_wrong, inject_fault};
use super::elements::{expected, input, BenchElem};
use super::measure::{time_batches, time_op, Iterations, Timing};

/// The collectives with a device-buffer method.
pub(crate) fn supports(coll: BenchOp) -> bool {
    matches!(
        coll,
        BenchOp::Collective(
            CollectiveKind::AllReduce
                | CollectiveKind::Broadcast
                | CollectiveKind::Reduce
                | CollectiveKind::AllGather
                | CollectiveKind::ReduceScatter
        )
    )
}

/// The stream this rank's device buffers live on: the NCCL communicator's device, or
/// `LOCAL_RANK % devices` under gloo.
pub(crate) fn stream_for(pg: &ProcessGroup) -> Result<Arc<CudaStream>, Error> {
    let device = match pg.cuda_device() {
        Some(device) => device,
        None => {
            let count = ringccl::cuda_device_count()?;
            let local = std::env::var("LOCAL_RANK")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(pg.rank());
            local % count
        }
    };
    let ctx = CudaContext::new(device).map_err(driver(pg, "creating the CUDA context"))?;
    Ok(ctx.default_stream())
}

fn driver(pg: &ProcessGroup, what: &'static str) -> impl Fn(DriverError) -> Error {
    let rank = pg.rank();
    move |e| Error::Device {
        rank,
        op: "ringccl-bench device buffers".into(),
        call: what.into(),
        reason: e.to_string(),
    }
}

/// One device-buffer call of `kind`: `buf` holds `count` elements, `out` the gathered or
/// scattered side.
fn call<T: BenchElem>(
    pg: &ProcessGroup,
    kind: CollectiveKind,
    op: ReduceOp,
    buf: &mut CudaSlice<T>,
    out: &mut CudaSlice<T>,
) -> Result<(), Error> {
    match kind {
        CollectiveKind::AllReduce => pg.all_reduce_device(buf, op),
        CollectiveKind::Broadcast => pg.broadcast_device(buf, 0),
        CollectiveKind::Reduce => pg.reduce_device(buf, op, 0),
        CollectiveKind::AllGather => pg.all_gather_device(buf, out),
        CollectiveKind::ReduceScatter => pg.reduce_scatter_device(buf, out, op),
        other => Err(Error::InvalidArgument(format!(
            "--memory device does not support {}",
            other.name()
        ))),
    }
}

/// Checks `checks` device-buffer calls, then times the call; returns the wrong elements
/// summed over ranks and the timing.
// The benchmark's knobs passed through, as for the host path; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn measure<T: BenchElem>(
    pg: &ProcessGroup,
    stream: &Arc<CudaStream>,
    kind: CollectiveKind,
    count: usize,
    op: ReduceOp,
    checks: usize,
    warmup: usize,
    iterations: Iterations,
    stream_ordered: bool,
) -> Result<(i64, Timing), Error> {
    if stream_ordered && kind != CollectiveKind::AllReduce {
        return Err(Error::InvalidArgument(format!(
            "--stream-ordered measures all_reduce only, not {}",
            kind.name()
        )));
    }
    let (rank, n) = (pg.rank(), pg.world_size());
    let per = count / n;
    // all_gather sends `per` elements and receives `count`; reduce_scatter the reverse.
    let (in_len, out_len) = match kind {
        CollectiveKind::AllGather => (per, count),
        CollectiveKind::ReduceScatter => (count, per),
        _ => (count, 1),
    };
    let mine: Vec<T> = (0..in_len).map(|i| input(rank, i, op)).collect();
    let mut wrong = 0;
    for _ in 0..checks {
        let mut buf = stream
            .clone_htod(&mine)
            .map_err(driver(pg, "copying inputs to the GPU"))?;
        let mut out = stream
            .alloc_zeros::<T>(out_len)
            .map_err(driver(pg, "allocating the output"))?;
        call(pg, kind, op, &mut buf, &mut out)?;
        let result = if matches!(
            kind,
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter
        ) {
            &out
        } else {
            &buf
        };
        let mut got = stream
            .clone_dtoh(result)
            .map_err(driver(pg, "copying results to the host"))?;
        inject_fault(rank, &mut got);
        wrong += match kind {
            CollectiveKind::AllReduce => count_wrong(&got, |i| expected(n, i, op)),
            CollectiveKind::Broadcast => count_wrong(&got, |i| input(0, i, op)),
            CollectiveKind::Reduce if rank == 0 => count_wrong(&got, |i| expected(n, i, op)),
            CollectiveKind::AllGather => {
                count_wrong(&got, |j| input(j / per.max(1), j % per.max(1), op))
            }
            CollectiveKind::ReduceScatter => count_wrong(&got, |i| expected(n, rank * per + i, op)),
            _ => 0,
        };
    }
    let mut total = [wrong];
    pg.all_reduce(&mut total, ReduceOp::Sum)?;
    let mut buf = stream
        .clone_htod(&mine)
        .map_err(driver(pg, "copying inputs to the GPU"))?;
    let mut out = stream
        .alloc_zeros::<T>(out_len)
        .map_err(driver(pg, "allocating the output"))?;
    let timing = if stream_ordered {
        time_batches(pg, warmup, iterations, || {
            pg.all_reduce_device_enqueued(&mut buf, op)
        })?
    } else {
        time_op(pg, warmup, iterations, || {
            call(pg, kind, op, &mut buf, &mut out)
        })?
    };
    Ok((total[0], timing))
}
