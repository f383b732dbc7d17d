//! The object-safe interface every backend implements.

use std::fmt;

use crate::{BufferMut, DType, Error, ReduceOp};

/// A communication backend: one rank's view of a process group.
///
/// Object-safe, so a configuration string can pick an implementation at run time
/// (`Box<dyn Backend>`). The typed, generic API users call (`ProcessGroup::all_reduce::<T>`
/// and friends, in the `ringccl` crate) is a thin layer over these methods.
///
/// Every method is collective: every rank of the group must call it, in the same order,
/// with matching arguments. Every method returns within the group's deadline.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The backend's name, e.g. `"gloo"`.
    fn name(&self) -> &str;

    /// This process's rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Reduces `buf` element-wise across all ranks with `op`, leaving the result in every
    /// rank's `buf`. Every rank ends with bit-identical contents.
    fn all_reduce(&self, buf: BufferMut<'_>, op: ReduceOp) -> Result<(), Error>;

    /// Copies `root`'s `buf` into every other rank's `buf`.
    fn broadcast(&self, buf: BufferMut<'_>, root: usize) -> Result<(), Error>;

    /// Returns once every rank has entered the barrier.
    fn barrier(&self) -> Result<(), Error>;
}

/// Checks the arguments of an all-reduce that every backend rejects the same way.
pub fn validate_reduce(dtype: DType, op: ReduceOp) -> Result<(), Error> {
    if op == ReduceOp::Avg && !dtype.is_float() {
        return Err(Error::UnsupportedOp {
            op,
            dtype,
            reason: "an integer mean cannot be represented exactly; use Sum and divide, or convert to a float type",
        });
    }
    Ok(())
}

/// Checks that `root` names a rank of a group of `world_size`.
pub fn validate_root(root: usize, world_size: usize) -> Result<(), Error> {
    if root >= world_size {
        return Err(Error::InvalidArgument(format!(
            "root rank {root} is out of range for a group of {world_size} ranks (valid: 0..{world_size})"
        )));
    }
    Ok(())
}
