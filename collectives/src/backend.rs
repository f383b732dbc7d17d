//! The object-safe interface every backend implements.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::control::GroupControl;

use crate::{BufferMut, BufferRef, DType, Deadline, Error, ReduceOp};

/// A communication backend: one rank's view of a process group.
///
/// Object-safe, so a configuration string can pick an implementation at run time
/// (`Box<dyn Backend>`). The typed, generic API users call (`ProcessGroup::all_reduce::<T>`
/// and friends, in the `ringccl` crate) is a thin layer over these methods.
///
/// Every collective method must be called by every rank of the group, in the same order,
/// with matching arguments; point-to-point `send`/`recv` involve two ranks, which must
/// issue their messages to each other in matching order. Every method returns by the
/// `deadline` it is given, which the caller fixed when the call was issued.
///
/// Backends are usually a [`GroupRunner`](crate::GroupRunner) around an
/// [`Engine`](crate::Engine), which supplies these methods.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The backend's name, e.g. `"gloo"`.
    fn name(&self) -> &str;

    /// This process's rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the group.
    fn world_size(&self) -> usize;

    /// The group's default deadline for one call (`InitOptions::timeout`).
    fn timeout(&self) -> Duration;

    /// Reduces `buf` element-wise across all ranks with `op`, leaving the result in every
    /// rank's `buf`. Every rank ends with bit-identical contents.
    fn all_reduce(&self, buf: BufferMut<'_>, op: ReduceOp, deadline: Deadline)
        -> Result<(), Error>;

    /// Copies `root`'s `buf` into every other rank's `buf`.
    fn broadcast(&self, buf: BufferMut<'_>, root: usize, deadline: Deadline) -> Result<(), Error>;

    /// Returns once every rank has entered the barrier.
    fn barrier(&self, deadline: Deadline) -> Result<(), Error>;

    /// Reduces `buf` across all ranks into `root`'s `buf`. Other ranks' `buf` contents are
    /// unspecified afterwards (they hold partial results).
    fn reduce(
        &self,
        buf: BufferMut<'_>,
        op: ReduceOp,
        root: usize,
        deadline: Deadline,
    ) -> Result<(), Error>;

    /// Concatenates every rank's `input`, in rank order, into every rank's `output`
    /// (`output.len() == world_size * input.len()`).
    fn all_gather(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        deadline: Deadline,
    ) -> Result<(), Error>;

    /// Reduces `input` (`world_size` equal blocks) across ranks; rank `r`'s `output`
    /// receives the reduction of block `r` (`input.len() == world_size * output.len()`).
    fn reduce_scatter(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error>;

    /// Block `q` of rank `r`'s `input` becomes block `r` of rank `q`'s `output` (both have
    /// `world_size` equal blocks).
    fn all_to_all(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        deadline: Deadline,
    ) -> Result<(), Error>;

    /// Breaks the group from outside any call (for example, a call that timed out while
    /// queued behind a stuck one): the call now running, if any, is woken and fails, every
    /// later call fails at once with [`Error::GroupBroken`] quoting `cause`, and backends
    /// that can reach their peers tell them why. Idempotent; the first cause wins.
    ///
    /// Backends with nothing to release may keep this default, which does nothing.
    fn abort(&self, cause: &str) {
        let _ = cause;
    }

    /// The group's control state, when the backend runs through a
    /// [`GroupRunner`](crate::GroupRunner): the one record of whether, by whom and why the
    /// group was aborted. A backend of the caller's own says `None` (the default); the
    /// facade then runs it through a runner of its own, so that every group has one.
    fn control(&self) -> Option<&Arc<GroupControl>> {
        None
    }

    /// Sends `buf` to rank `dst`, which must call `recv` with this rank, the same tag and
    /// the same length and type.
    fn send(
        &self,
        buf: BufferRef<'_>,
        dst: usize,
        tag: u32,
        deadline: Deadline,
    ) -> Result<(), Error>;

    /// Receives into `buf` the next message from rank `src`, which must carry `tag`.
    fn recv(
        &self,
        buf: BufferMut<'_>,
        src: usize,
        tag: u32,
        deadline: Deadline,
    ) -> Result<(), Error>;
}

/// Checks the arguments of a reduction that every backend rejects the same way.
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
            "rank {root} is out of range for a group of {world_size} ranks (valid: 0..{world_size})"
        )));
    }
    Ok(())
}

/// Checks that `input` and `output` have the same element type and that
/// `big.len() == world_size * small.len()` for a gather/scatter-shaped collective.
pub fn validate_blocks(
    what: &str,
    input: DType,
    output: DType,
    small: usize,
    big: usize,
    world_size: usize,
) -> Result<(), Error> {
    if input != output {
        return Err(Error::InvalidArgument(format!(
            "{what}: input is {input} but output is {output}; both must have the same element type"
        )));
    }
    if small.checked_mul(world_size) != Some(big) {
        return Err(Error::InvalidArgument(format!(
            "{what}: the larger buffer must hold world_size ({world_size}) x {small} = {} elements, it holds {big}",
            small.saturating_mul(world_size)
        )));
    }
    Ok(())
}
