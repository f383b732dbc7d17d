//! The `#wrong` column: each collective's result compared, element by element, with the
//! exact expected values.

use ringccl::{CollectiveKind, Error, ProcessGroup, ReduceOp};

use super::bench_op::{not_measured, BenchOp};
use super::elements::{expected, input, BenchElem};

/// How many elements of `got` differ, bit for bit, from `want(index)`.
pub(crate) fn count_wrong<T: BenchElem>(got: &[T], want: impl Fn(usize) -> T) -> i64 {
    got.iter()
        .enumerate()
        .filter(|&(i, x)| bytemuck::bytes_of(x) != bytemuck::bytes_of(&want(i)))
        .count() as i64
}

/// Test hook: `RINGCCL_BENCH_INJECT_FAULT=1` makes rank 0 corrupt one element of each
/// check result, to prove that `#wrong` notices.
pub(crate) fn inject_fault<T: BenchElem>(rank: usize, buf: &mut [T]) {
    if rank == 0 && std::env::var_os("RINGCCL_BENCH_INJECT_FAULT").is_some() {
        if let Some(first) = buf.first_mut() {
            *first = T::combine(*first, T::from_small(1), ReduceOp::Sum);
        }
    }
}

/// One check iteration of `coll` on `count` elements; wrong elements summed over ranks.
pub(crate) fn check<T: BenchElem>(
    pg: &ProcessGroup,
    coll: BenchOp,
    count: usize,
    op: ReduceOp,
    tensors: usize,
) -> Result<i64, Error> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let mine: Vec<T> = (0..count).map(|i| input(rank, i, op)).collect();
    let per = count / n;
    let wrong = match (coll, coll.kind()) {
        (BenchOp::Bucketed | BenchOp::Separate, _) => {
            let len = (count / tensors.max(1)).max(1);
            let mut parts: Vec<Vec<T>> = mine.chunks(len).map(<[T]>::to_vec).collect();
            let mut views: Vec<&mut [T]> = parts.iter_mut().map(|p| &mut p[..]).collect();
            pg.all_reduce_bucketed(&mut views, op, 25 << 20)?;
            let mut flat = parts.concat();
            inject_fault(rank, &mut flat);
            count_wrong(&flat, |i| expected(n, i, op))
        }
        (_, CollectiveKind::AllReduce) => {
            let mut buf = mine;
            pg.all_reduce(&mut buf, op)?;
            inject_fault(rank, &mut buf);
            count_wrong(&buf, |i| expected(n, i, op))
        }
        (_, CollectiveKind::Broadcast) => {
            let mut buf = mine;
            pg.broadcast(&mut buf, 0)?;
            inject_fault(rank, &mut buf);
            count_wrong(&buf, |i| input(0, i, op))
        }
        (_, CollectiveKind::Reduce) => {
            let mut buf = mine;
            pg.reduce(&mut buf, op, 0)?;
            inject_fault(rank, &mut buf);
            if rank == 0 {
                count_wrong(&buf, |i| expected(n, i, op))
            } else {
                0
            }
        }
        (_, CollectiveKind::AllGather) => {
            let mut out = vec![T::from_small(0); per * n];
            pg.all_gather(&mine[..per], &mut out)?;
            inject_fault(rank, &mut out);
            count_wrong(&out, |j| input(j / per.max(1), j % per.max(1), op))
        }
        (_, CollectiveKind::ReduceScatter) => {
            let mut out = vec![T::from_small(0); per];
            pg.reduce_scatter(&mine[..per * n], &mut out, op)?;
            inject_fault(rank, &mut out);
            count_wrong(&out, |i| expected(n, rank * per + i, op))
        }
        (_, CollectiveKind::AllToAll) => {
            let mut out = vec![T::from_small(0); per * n];
            pg.all_to_all(&mine[..per * n], &mut out)?;
            inject_fault(rank, &mut out);
            count_wrong(&out, |j| {
                input(j / per.max(1), rank * per + j % per.max(1), op)
            })
        }
        (_, CollectiveKind::Barrier) => 0,
        (_, other) => return Err(not_measured(other)),
    };
    let mut total = [wrong];
    pg.all_reduce(&mut total, ReduceOp::Sum)?;
    Ok(total[0])
}
