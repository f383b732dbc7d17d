//! Reduction kernels: element-wise `dst = dst (op) src` over typed slices.
//!
//! The loops are written so that LLVM auto-vectorises them (plain zipped iteration, no
//! early exits, branch-free min/max). `f16`/`bf16` are widened to `f32` in small blocks,
//! reduced, and narrowed again, so every rank rounds exactly the same way.
//!
//! The kernels are deterministic: the same inputs in the same order give the same bits.
//! Bit-identical results across ranks come from the schedules, which reduce every
//! element in one fixed order on exactly one rank and then copy the result.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::{DType, ReduceOp};

/// Element-wise arithmetic for one primitive type.
trait Arith: Copy {
    fn sum(a: Self, b: Self) -> Self;
    fn prod(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
}

macro_rules! int_arith {
    ($($ty:ty),*) => {$(
        impl Arith for $ty {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
        }
    )*};
}
int_arith!(i8, u8, i32, i64);

macro_rules! float_arith {
    ($($ty:ty),*) => {$(
        impl Arith for $ty {
            #[inline(always)]
            fn sum(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn prod(a: Self, b: Self) -> Self { a * b }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { a.min(b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { a.max(b) }
        }
    )*};
}
float_arith!(f32, f64);

#[inline(always)]
fn zip_apply<T: Arith>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

/// Which operand comes first: `dst = dst (op) src` or `dst = src (op) dst`. The two agree
/// for every operator except in corner cases (NaN payloads, the sign of a zero minimum),
/// and schedules pick one so that all ranks compute the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    LocalFirst,
    IncomingFirst,
}

#[inline(always)]
fn apply<T: Arith>(dst: &mut [T], src: &[T], order: Order, f: impl Fn(T, T) -> T) {
    match order {
        Order::LocalFirst => zip_apply(dst, src, &f),
        Order::IncomingFirst => zip_apply(dst, src, |d, s| f(s, d)),
    }
}

fn combine<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T], order: Order) {
    // Each arm passes a distinct function item (not a function pointer), so every
    // (type, op, order) loop is monomorphised, inlined and vectorised.
    match op {
        // Avg reduces as a sum; `finalize_avg` divides once at the end.
        ReduceOp::Sum | ReduceOp::Avg => apply(dst, src, order, T::sum),
        ReduceOp::Product => apply(dst, src, order, T::prod),
        ReduceOp::Min => apply(dst, src, order, T::min),
        ReduceOp::Max => apply(dst, src, order, T::max),
    }
}

/// Widening block for the 16-bit float types (fits comfortably in L1).
const HALF_BLOCK: usize = 512;

fn combine_half<H>(op: ReduceOp, dst: &mut [H], src: &[H], order: Order)
where
    [H]: HalfFloatSliceExt,
{
    let mut wide_dst = [0f32; HALF_BLOCK];
    let mut wide_src = [0f32; HALF_BLOCK];
    for (d, s) in dst.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = d.len();
        d.convert_to_f32_slice(&mut wide_dst[..n]);
        s.convert_to_f32_slice(&mut wide_src[..n]);
        combine::<f32>(op, &mut wide_dst[..n], &wide_src[..n], order);
        d.convert_from_f32_slice(&wide_dst[..n]);
    }
}

fn divide_half<H>(buf: &mut [H], divisor: f32)
where
    [H]: HalfFloatSliceExt,
{
    let mut wide = [0f32; HALF_BLOCK];
    for block in buf.chunks_mut(HALF_BLOCK) {
        let n = block.len();
        block.convert_to_f32_slice(&mut wide[..n]);
        for x in &mut wide[..n] {
            *x /= divisor;
        }
        block.convert_from_f32_slice(&wide[..n]);
    }
}

/// Why a kernel refused its input. Only reachable through misuse of the raw byte API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelError(pub(crate) String);

fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T], KernelError> {
    bytemuck::try_cast_slice_mut(bytes)
        .map_err(|e| KernelError(format!("buffer is not a whole, aligned slice: {e:?}")))
}

fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T], KernelError> {
    bytemuck::try_cast_slice(bytes)
        .map_err(|e| KernelError(format!("buffer is not a whole, aligned slice: {e:?}")))
}

/// `dst[i] = dst[i] (op) src[i]` (or `src[i] (op) dst[i]`, by `order`) for every element,
/// on raw bytes of type `dtype`.
pub(crate) fn reduce_bytes(
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    src: &[u8],
    order: Order,
) -> Result<(), KernelError> {
    if dst.len() != src.len() {
        return Err(KernelError(format!(
            "length mismatch: {} destination bytes, {} source bytes",
            dst.len(),
            src.len()
        )));
    }
    match dtype {
        DType::F32 => combine::<f32>(op, cast_mut(dst)?, cast(src)?, order),
        DType::F64 => combine::<f64>(op, cast_mut(dst)?, cast(src)?, order),
        DType::I8 => combine::<i8>(op, cast_mut(dst)?, cast(src)?, order),
        DType::U8 => combine::<u8>(op, dst, src, order),
        DType::I32 => combine::<i32>(op, cast_mut(dst)?, cast(src)?, order),
        DType::I64 => combine::<i64>(op, cast_mut(dst)?, cast(src)?, order),
        DType::F16 => combine_half::<f16>(op, cast_mut(dst)?, cast(src)?, order),
        DType::BF16 => combine_half::<bf16>(op, cast_mut(dst)?, cast(src)?, order),
    }
    Ok(())
}

/// Turns a finished sum into a mean: divides every element by `world_size`.
/// Integer types are left alone (callers reject `Avg` on them up front).
pub(crate) fn finalize_avg(
    dtype: DType,
    buf: &mut [u8],
    world_size: usize,
) -> Result<(), KernelError> {
    match dtype {
        DType::F32 => {
            let divisor = world_size as f32;
            for x in cast_mut::<f32>(buf)? {
                *x /= divisor;
            }
        }
        DType::F64 => {
            let divisor = world_size as f64;
            for x in cast_mut::<f64>(buf)? {
                *x /= divisor;
            }
        }
        DType::F16 => divide_half::<f16>(cast_mut(buf)?, world_size as f32),
        DType::BF16 => divide_half::<bf16>(cast_mut(buf)?, world_size as f32),
        DType::I8 | DType::U8 | DType::I32 | DType::I64 => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduce<T: bytemuck::Pod>(dtype: DType, op: ReduceOp, dst: &mut [T], src: &[T]) {
        reduce_bytes(
            dtype,
            op,
            bytemuck::cast_slice_mut(dst),
            bytemuck::cast_slice(src),
            Order::LocalFirst,
        )
        .unwrap();
    }

    #[test]
    fn float_ops() {
        let mut d = vec![1.0f32, -2.0, 3.5, f32::NAN];
        reduce(DType::F32, ReduceOp::Sum, &mut d, &[1.0, 1.0, 0.5, 1.0]);
        assert_eq!(&d[..3], &[2.0, -1.0, 4.0]);
        assert!(d[3].is_nan());
        let mut d = vec![2.0f64, 3.0];
        reduce(DType::F64, ReduceOp::Product, &mut d, &[4.0, -1.0]);
        assert_eq!(d, vec![8.0, -3.0]);
        let mut d = vec![2.0f32, 3.0, f32::NAN];
        reduce(DType::F32, ReduceOp::Min, &mut d, &[4.0, -1.0, 7.0]);
        assert_eq!(d, vec![2.0, -1.0, 7.0]);
        let mut d = vec![2.0f32, 3.0];
        reduce(DType::F32, ReduceOp::Max, &mut d, &[4.0, -1.0]);
        assert_eq!(d, vec![4.0, 3.0]);
    }

    #[test]
    fn integer_ops_wrap() {
        let mut d = vec![120i8, -128, 5];
        reduce(DType::I8, ReduceOp::Sum, &mut d, &[10, -1, 5]);
        assert_eq!(d, vec![-126, 127, 10]);
        let mut d = vec![200u8, 3];
        reduce(DType::U8, ReduceOp::Product, &mut d, &[2, 3]);
        assert_eq!(d, vec![144, 9]);
        let mut d = vec![i64::MAX, 3];
        reduce(DType::I64, ReduceOp::Min, &mut d, &[0, 9]);
        assert_eq!(d, vec![0, 3]);
        let mut d = vec![-5i32, 3];
        reduce(DType::I32, ReduceOp::Max, &mut d, &[0, 9]);
        assert_eq!(d, vec![0, 9]);
    }

    #[test]
    fn half_types_match_f32_reference_rounding() {
        let a: Vec<f32> = (0..1500).map(|i| (i % 97) as f32 * 0.37 - 11.0).collect();
        let b: Vec<f32> = (0..1500).map(|i| (i % 13) as f32 * 1.91 - 3.0).collect();
        for op in [
            ReduceOp::Sum,
            ReduceOp::Product,
            ReduceOp::Min,
            ReduceOp::Max,
        ] {
            let mut d: Vec<f16> = a.iter().map(|&x| f16::from_f32(x)).collect();
            let s: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
            let expect: Vec<f16> = d
                .iter()
                .zip(&s)
                .map(|(x, y)| {
                    let (x, y) = (x.to_f32(), y.to_f32());
                    f16::from_f32(match op {
                        ReduceOp::Sum => x + y,
                        ReduceOp::Product => x * y,
                        ReduceOp::Min => x.min(y),
                        _ => x.max(y),
                    })
                })
                .collect();
            reduce(DType::F16, op, &mut d, &s);
            assert_eq!(d, expect, "{op}");

            let mut d: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
            let s: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
            let before = d.clone();
            reduce(DType::BF16, op, &mut d, &s);
            for i in 0..d.len() {
                let (x, y) = (before[i].to_f32(), s[i].to_f32());
                let want = bf16::from_f32(match op {
                    ReduceOp::Sum => x + y,
                    ReduceOp::Product => x * y,
                    ReduceOp::Min => x.min(y),
                    _ => x.max(y),
                });
                assert_eq!(d[i].to_bits(), want.to_bits());
            }
        }
    }

    #[test]
    fn operand_order_is_respected() {
        // Signed zeros tell the orders apart for min: min(-0, +0) keeps the first.
        let mut d = vec![0.0f32];
        reduce_bytes(
            DType::F32,
            ReduceOp::Min,
            bytemuck::cast_slice_mut(&mut d),
            bytemuck::cast_slice(&[-0.0f32]),
            Order::IncomingFirst,
        )
        .unwrap();
        let mut e = vec![-0.0f32];
        reduce_bytes(
            DType::F32,
            ReduceOp::Min,
            bytemuck::cast_slice_mut(&mut e),
            bytemuck::cast_slice(&[0.0f32]),
            Order::LocalFirst,
        )
        .unwrap();
        assert_eq!(d[0].to_bits(), e[0].to_bits());
    }

    #[test]
    fn avg_divides_floats_only() {
        let mut d = vec![3.0f32, 9.0];
        finalize_avg(DType::F32, bytemuck::cast_slice_mut(&mut d), 3).unwrap();
        assert_eq!(d, vec![1.0, 3.0]);
        let mut h = vec![f16::from_f32(6.0)];
        finalize_avg(DType::F16, bytemuck::cast_slice_mut(&mut h), 4).unwrap();
        assert_eq!(h[0].to_f32(), 1.5);
        let mut i = vec![9i32];
        finalize_avg(DType::I32, bytemuck::cast_slice_mut(&mut i), 3).unwrap();
        assert_eq!(i, vec![9]);
    }

    #[test]
    fn misaligned_or_mismatched_input_is_an_error_not_a_panic() {
        let mut backing = [0u64; 4];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut backing);
        let src = [0u8; 8];
        assert!(reduce_bytes(
            DType::F32,
            ReduceOp::Sum,
            &mut bytes[1..9],
            &src,
            Order::LocalFirst
        )
        .is_err());
        assert!(reduce_bytes(
            DType::F32,
            ReduceOp::Sum,
            &mut bytes[..8],
            &src[..4],
            Order::LocalFirst
        )
        .is_err());
        assert!(reduce_bytes(
            DType::F64,
            ReduceOp::Sum,
            &mut bytes[..6],
            &src[..6],
            Order::LocalFirst
        )
        .is_err());
    }
}
