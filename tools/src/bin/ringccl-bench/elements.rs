//! Element types as the benchmark sees them: nccl-tests' names, exactly representable
//! rank-dependent inputs, and the reference result.

use ringccl::half::{bf16, f16};
use ringccl::{Element, ReduceOp};

/// Element types that can also live in GPU memory (all of them, when the `nccl` feature
/// is on).
#[cfg(feature = "nccl")]
pub(crate) trait DeviceCapable: ringccl::DeviceElement {}
#[cfg(feature = "nccl")]
impl<T: ringccl::DeviceElement> DeviceCapable for T {}
#[cfg(not(feature = "nccl"))]
pub(crate) trait DeviceCapable {}
#[cfg(not(feature = "nccl"))]
impl<T> DeviceCapable for T {}

/// An element type the benchmark can check exactly.
pub(crate) trait BenchElem: Element + Copy + DeviceCapable {
    /// nccl-tests' name for the type.
    const NAME: &'static str;
    fn from_small(v: i64) -> Self;
    /// `a (op) b`, with `Avg` accumulating as a sum.
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
    /// The mean of a sum over `n` ranks, rounded the way the backend rounds.
    fn mean(sum: Self, n: usize) -> Self;
}

/// Rank `rank`'s input at element `i`: small integers (±1 and 2 for products) so that
/// every reduction is exact in every type for up to 8 ranks.
pub(crate) fn input<T: BenchElem>(rank: usize, i: usize, op: ReduceOp) -> T {
    if op == ReduceOp::Product {
        T::from_small([1, 2, 1, -1][(rank + i * 3) % 4])
    } else {
        T::from_small(((rank * 3 + i * 7) % 17) as i64 - 8)
    }
}

/// The exact result every rank should hold at element `i`.
pub(crate) fn expected<T: BenchElem>(n: usize, i: usize, op: ReduceOp) -> T {
    let mut acc = input::<T>(0, i, op);
    for r in 1..n {
        acc = T::combine(acc, input(r, i, op), op);
    }
    if op == ReduceOp::Avg {
        acc = T::mean(acc, n);
    }
    acc
}

fn float_op(a: f64, b: f64, op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Product => a * b,
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
        _ => a + b,
    }
}

macro_rules! float_elem {
    ($ty:ty, $name:literal, $to:expr, $from:expr, $mean:expr) => {
        impl BenchElem for $ty {
            const NAME: &'static str = $name;
            fn from_small(v: i64) -> Self {
                $from(v as f64)
            }
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                $from(float_op($to(a), $to(b), op))
            }
            fn mean(sum: Self, n: usize) -> Self {
                $mean(sum, n)
            }
        }
    };
}

float_elem!(
    f32,
    "float",
    |x: f32| f64::from(x),
    |x: f64| x as f32,
    |s: f32, n: usize| s / n as f32
);
float_elem!(f64, "double", |x: f64| x, |x: f64| x, |s: f64, n: usize| s
    / n as f64);
float_elem!(
    f16,
    "half",
    |x: f16| x.to_f64(),
    f16::from_f64,
    |s: f16, n: usize| { f16::from_f32(s.to_f32() / n as f32) }
);
float_elem!(
    bf16,
    "bfloat16",
    |x: bf16| x.to_f64(),
    bf16::from_f64,
    |s: bf16, n: usize| { bf16::from_f32(s.to_f32() / n as f32) }
);

macro_rules! int_elem {
    ($($ty:ty => $name:literal),*) => {$(
        impl BenchElem for $ty {
            const NAME: &'static str = $name;
            fn from_small(v: i64) -> Self {
                v as $ty
            }
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Product => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    _ => a.wrapping_add(b),
                }
            }
            fn mean(sum: Self, _n: usize) -> Self {
                sum
            }
        }
    )*};
}
int_elem!(i8 => "int8", u8 => "uint8", i32 => "int32", i64 => "int64");

/// The `-d` names, in the order `-d all` runs them.
pub(crate) const DTYPE_NAMES: [&str; 8] = [
    "float", "double", "half", "bfloat16", "int8", "uint8", "int32", "int64",
];
