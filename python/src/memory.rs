//! Tensor memory handed over from Python as `(address, bytes)`: the one place it becomes
//! Rust slices.
//!
//! The Python half of the package promises, for every region it passes: the address is
//! the start of a contiguous CPU tensor's data and `bytes` its size; the tensor stays
//! alive, and no Python code touches it, until the call using it has finished (a
//! synchronous call returns, an asynchronous one calls its completion callback). Under
//! that promise, a region is valid memory owned by this call alone, which is what the
//! slices below need. What can be checked here is: a null address, an overflowing
//! range, and two regions of one call that overlap.

#![allow(unsafe_code)] // turning the Python half's addresses into slices is this module's job

use ringccl::{BufferMut, BufferRef, DType, RuntimeError};

/// A tensor's bytes, borrowed from Python for one call.
#[derive(Debug)]
pub(crate) struct Region {
    addr: usize,
    bytes: usize,
}

impl Region {
    /// The region of `bytes` bytes at `addr`; see the module's contract.
    pub(crate) fn new(addr: usize, bytes: usize) -> Result<Region, ringccl::Error> {
        if bytes > 0 && addr == 0 {
            return Err(ringccl::Error::InvalidArgument(format!(
                "a tensor of {bytes} bytes has a null data pointer"
            )));
        }
        if addr.checked_add(bytes).is_none() || bytes > isize::MAX as usize {
            return Err(ringccl::Error::InvalidArgument(format!(
                "a tensor of {bytes} bytes at {addr:#x} runs past the end of memory"
            )));
        }
        Ok(Region { addr, bytes })
    }

    /// Whether the two regions share no byte.
    pub(crate) fn disjoint(&self, other: &Region) -> bool {
        self.bytes == 0
            || other.bytes == 0
            || self.addr + self.bytes <= other.addr
            || other.addr + other.bytes <= self.addr
    }

    /// The region as a buffer of `dtype` elements to write into.
    pub(crate) fn buffer_mut(&mut self, dtype: DType) -> Result<BufferMut<'_>, RuntimeError> {
        let bytes: &mut [u8] = if self.bytes == 0 {
            &mut []
        } else {
            // SAFETY: by the module's contract the Python half keeps `bytes` bytes at
            // `addr` alive and untouched until this call finishes, and `new` checked
            // that the range is non-null and within the address space. The slice
            // borrows `self` mutably, and regions of one call are checked disjoint
            // before two are used at once, so it is the only reference to that memory.
            unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.bytes) }
        };
        BufferMut::from_bytes(bytes, dtype)
    }

    /// The region as a read-only buffer of `dtype` elements.
    pub(crate) fn buffer_ref(&self, dtype: DType) -> Result<BufferRef<'_>, RuntimeError> {
        let bytes: &[u8] = if self.bytes == 0 {
            &[]
        } else {
            // SAFETY: as in `buffer_mut`; the slice borrows `self` shared, and no
            // mutable buffer of an overlapping region exists at the same time (checked
            // by the caller with `disjoint`).
            unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.bytes) }
        };
        BufferRef::from_bytes(bytes, dtype)
    }
}
