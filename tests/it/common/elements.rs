//! Per-type input generators and reference reductions for the collective matrix.
//!
//! Float inputs are small integers (or ±1, 2, 0.5 for products) so that every reduction
//! is exact in every float type and the reference does not depend on reduction order.
//! Integer inputs are arbitrary bit patterns: wrapping arithmetic is exact in any order.

use ringccl::half::{bf16, f16};
use ringccl::{Element, ReduceOp};

pub trait TestElem: Element + Copy {
    fn input(rank: usize, i: usize, op: ReduceOp) -> Self;
    /// `a (op) b`, with `Avg` accumulating as a sum.
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
    fn mean(sum: Self, n: usize) -> Self;
}

pub fn mix(rank: usize, i: usize) -> u64 {
    let mut z = (i as u64) ^ ((rank as u64) << 40) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn small_float(rank: usize, i: usize, op: ReduceOp) -> f64 {
    if op == ReduceOp::Product {
        [1.0, -1.0, 2.0, 0.5][(i * 7 + rank * 3) % 4]
    } else {
        ((i * 7 + rank * 13) % 11) as f64 - 5.0
    }
}

fn float_combine(a: f64, b: f64, op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Product => a * b,
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
        _ => unreachable!(),
    }
}

macro_rules! float_elem {
    ($ty:ty, $to:expr, $from:expr, $mean:expr) => {
        impl TestElem for $ty {
            fn input(rank: usize, i: usize, op: ReduceOp) -> Self {
                $from(small_float(rank, i, op))
            }
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                $from(float_combine($to(a), $to(b), op))
            }
            fn mean(sum: Self, n: usize) -> Self {
                $mean(sum, n)
            }
        }
    };
}

float_elem!(
    f32,
    |x: f32| x as f64,
    |x: f64| x as f32,
    |s: f32, n: usize| s / n as f32
);
float_elem!(f64, |x: f64| x, |x: f64| x, |s: f64, n: usize| s / n as f64);
float_elem!(
    f16,
    |x: f16| x.to_f64(),
    f16::from_f64,
    |s: f16, n: usize| f16::from_f32(s.to_f32() / n as f32)
);
float_elem!(
    bf16,
    |x: bf16| x.to_f64(),
    bf16::from_f64,
    |s: bf16, n: usize| { bf16::from_f32(s.to_f32() / n as f32) }
);

macro_rules! int_elem {
    ($($ty:ty),*) => {$(
        impl TestElem for $ty {
            fn input(rank: usize, i: usize, _op: ReduceOp) -> Self {
                mix(rank, i) as $ty
            }
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Product => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    _ => unreachable!(),
                }
            }
            fn mean(sum: Self, _n: usize) -> Self {
                sum
            }
        }
    )*};
}
int_elem!(i8, u8, i32, i64);

/// The reduction of every rank's `input(r, i, op)`, as ringccl defines it.
pub fn reference<T: TestElem>(n: usize, i: usize, op: ReduceOp) -> T {
    let mut acc = T::input(0, i, op);
    for r in 1..n {
        acc = T::combine(acc, T::input(r, i, op), op);
    }
    if op == ReduceOp::Avg {
        acc = T::mean(acc, n);
    }
    acc
}
