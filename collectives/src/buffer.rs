//! Type-erased buffers handed to a [`Backend`](crate::Backend).

use std::fmt;

use crate::{DType, Element};

/// A mutable host buffer of known element type, borrowed for one collective.
///
/// It can only be made from a `&mut [T]` with `T: Element`, so its bytes are always a
/// whole number of correctly aligned elements.
pub struct BufferMut<'a> {
    dtype: DType,
    bytes: &'a mut [u8],
}

impl<'a> BufferMut<'a> {
    /// Borrows a typed slice as a buffer.
    pub fn from_slice<T: Element>(slice: &'a mut [T]) -> BufferMut<'a> {
        BufferMut {
            dtype: T::DTYPE,
            bytes: bytemuck::cast_slice_mut(slice),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

impl<'a, T: Element> From<&'a mut [T]> for BufferMut<'a> {
    fn from(slice: &'a mut [T]) -> BufferMut<'a> {
        BufferMut::from_slice(slice)
    }
}

impl fmt::Debug for BufferMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferMut")
            .field("dtype", &self.dtype)
            .field("len", &self.len())
            .finish()
    }
}

/// A read-only host buffer of known element type, borrowed for one collective.
#[derive(Clone, Copy)]
pub struct BufferRef<'a> {
    dtype: DType,
    bytes: &'a [u8],
}

impl<'a> BufferRef<'a> {
    /// Borrows a typed slice as a buffer.
    pub fn from_slice<T: Element>(slice: &'a [T]) -> BufferRef<'a> {
        BufferRef {
            dtype: T::DTYPE,
            bytes: bytemuck::cast_slice(slice),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

impl<'a, T: Element> From<&'a [T]> for BufferRef<'a> {
    fn from(slice: &'a [T]) -> BufferRef<'a> {
        BufferRef::from_slice(slice)
    }
}

impl fmt::Debug for BufferRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferRef")
            .field("dtype", &self.dtype)
            .field("len", &self.len())
            .finish()
    }
}
