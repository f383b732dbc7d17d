//! Element types that can travel through a collective.

use std::fmt;

/// The element type of a buffer, as seen by the type-erased [`Backend`](crate::Backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE-754 binary32.
    F32,
    /// IEEE-754 binary64.
    F64,
    /// IEEE-754 binary16 ([`half::f16`]).
    F16,
    /// bfloat16 ([`half::bf16`]).
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Every supported element type, in wire-code order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// Whether this is a floating-point type (the only kind that supports `Avg`).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// The short name used in messages and benchmark tables (`"float"` style names are
    /// nccl-tests'; these follow Rust's).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// Stable one-byte code used on the wire.
    pub const fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F64 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
            DType::I8 => 4,
            DType::U8 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
        }
    }

    /// Inverse of [`DType::code`].
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data element type supported by every collective.
///
/// Implemented for `f32`, `f64`, [`half::f16`], [`half::bf16`], `i8`, `u8`, `i32` and `i64`.
/// The trait is sealed: the reduction kernels and the wire format know exactly these types.
pub trait Element:
    bytemuck::Pod + fmt::Debug + PartialEq + Send + Sync + sealed::Sealed + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
        }
    )*};
}

element! {
    f32 => F32,
    f64 => F64,
    half::f16 => F16,
    half::bf16 => BF16,
    i8 => I8,
    u8 => U8,
    i32 => I32,
    i64 => I64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sizes_match_rust_types() {
        for dtype in DType::ALL {
            assert_eq!(DType::from_code(dtype.code()), Some(dtype));
        }
        assert_eq!(DType::from_code(8), None);
        assert_eq!(<f32 as Element>::DTYPE.size(), std::mem::size_of::<f32>());
        assert_eq!(<half::bf16 as Element>::DTYPE.size(), 2);
        assert_eq!(<i64 as Element>::DTYPE.size(), 8);
        assert!(DType::BF16.is_float());
        assert!(!DType::U8.is_float());
    }
}
