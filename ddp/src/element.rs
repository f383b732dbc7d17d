//! The gradient element types DDP averages.

use ringccl_collectives::half::{bf16, f16};
use ringccl_collectives::Element;

use crate::communicator::GradBuf;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for super::f16 {}
    impl Sealed for super::bf16 {}
}

/// A floating-point gradient type: `f32`, `f64`, `f16` or `bf16`.
pub trait GradElement: Element + Default + PartialEq + sealed::Sealed {
    /// `self / n`, rounded once in this type.
    fn div_count(self, n: usize) -> Self;
    /// `self * n`, rounded once in this type.
    fn mul_count(self, n: usize) -> Self;
    /// `self + other`.
    fn add(self, other: Self) -> Self;
    /// Widens to `f32` (for the compression hooks).
    fn to_f32(self) -> f32;
    /// Narrows from `f32`, rounding to nearest.
    fn from_f32(value: f32) -> Self;
    /// Wraps a typed buffer for the type-erased [`Communicator`](crate::Communicator).
    fn wrap(values: Vec<Self>) -> GradBuf;
    /// Unwraps it again; `Err` hands back a buffer of another type.
    fn unwrap(buf: GradBuf) -> Result<Vec<Self>, GradBuf>;
}

macro_rules! native_float {
    ($ty:ty, $variant:ident) => {
        impl GradElement for $ty {
            fn div_count(self, n: usize) -> Self {
                self / n as $ty
            }
            fn mul_count(self, n: usize) -> Self {
                self * n as $ty
            }
            fn add(self, other: Self) -> Self {
                self + other
            }
            fn to_f32(self) -> f32 {
                self as f32
            }
            fn from_f32(value: f32) -> Self {
                value as $ty
            }
            fn wrap(values: Vec<Self>) -> GradBuf {
                GradBuf::$variant(values)
            }
            fn unwrap(buf: GradBuf) -> Result<Vec<Self>, GradBuf> {
                match buf {
                    GradBuf::$variant(values) => Ok(values),
                    other => Err(other),
                }
            }
        }
    };
}

macro_rules! half_float {
    ($ty:ty, $variant:ident) => {
        impl GradElement for $ty {
            fn div_count(self, n: usize) -> Self {
                <$ty>::from_f32(self.to_f32() / n as f32)
            }
            fn mul_count(self, n: usize) -> Self {
                <$ty>::from_f32(self.to_f32() * n as f32)
            }
            fn add(self, other: Self) -> Self {
                <$ty>::from_f32(self.to_f32() + other.to_f32())
            }
            fn to_f32(self) -> f32 {
                <$ty>::to_f32(self)
            }
            fn from_f32(value: f32) -> Self {
                <$ty>::from_f32(value)
            }
            fn wrap(values: Vec<Self>) -> GradBuf {
                GradBuf::$variant(values)
            }
            fn unwrap(buf: GradBuf) -> Result<Vec<Self>, GradBuf> {
                match buf {
                    GradBuf::$variant(values) => Ok(values),
                    other => Err(other),
                }
            }
        }
    };
}

native_float!(f32, F32);
native_float!(f64, F64);
half_float!(f16, F16);
half_float!(bf16, BF16);
