//! Reduction operators.

use std::fmt;

/// How all-reduce combines the ranks' values, element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum. Integer sums wrap on overflow.
    Sum,
    /// Product. Integer products wrap on overflow.
    Product,
    /// Minimum. For floats, a NaN loses against a number (IEEE `minNum`).
    Min,
    /// Maximum. For floats, a NaN loses against a number (IEEE `maxNum`).
    Max,
    /// Arithmetic mean: the sum divided by the world size. Floating-point types only.
    Avg,
}

impl ReduceOp {
    /// Every operator, in wire-code order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The lowercase name used in messages and benchmark tables (nccl-tests' names).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Product => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Stable one-byte code used on the wire.
    pub const fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Product => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
        }
    }

    /// Inverse of [`ReduceOp::code`].
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
