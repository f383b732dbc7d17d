//! Type-erased buffers handed to a [`Backend`](crate::Backend).

use std::fmt;

use crate::{DType, Element, Error};

/// Checks that `len` bytes at `addr` are a whole number of aligned `dtype` elements.
fn check_elements(addr: usize, len: usize, dtype: DType) -> Result<(), Error> {
    let size = dtype.size();
    // An empty buffer has no elements to align (an empty slice's address is dangling).
    if len % size != 0 || (len > 0 && addr % size != 0) {
        return Err(Error::InvalidArgument(format!(
            "a buffer of {} must be a whole number of {size}-byte elements on a {size}-byte \
             boundary; got {len} bytes at address {addr:#x}",
            dtype.name()
        )));
    }
    Ok(())
}

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

    /// Borrows raw memory as a buffer of `dtype` elements (memory another library
    /// owns, such as a tensor's). Fails unless `bytes` is a whole number of elements,
    /// aligned to the element size.
    ///
    /// ```
    /// use ringccl_collectives::{BufferMut, DType};
    /// let mut words = [0u32; 2];
    /// let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
    /// assert_eq!(BufferMut::from_bytes(bytes, DType::F32)?.len(), 2);
    /// assert!(BufferMut::from_bytes(&mut bytes[1..], DType::F32).is_err());
    /// let mut nothing = [0u8; 9];
    /// let empty = BufferMut::from_bytes(&mut nothing[1..1], DType::F64)?; // unaligned, empty
    /// assert!(empty.is_empty());
    /// # Ok::<(), ringccl_collectives::Error>(())
    /// ```
    pub fn from_bytes(bytes: &'a mut [u8], dtype: DType) -> Result<BufferMut<'a>, Error> {
        check_elements(bytes.as_ptr() as usize, bytes.len(), dtype)?;
        if bytes.is_empty() {
            // An empty slice's address may be unaligned; the engine casts to elements.
            return Ok(BufferMut {
                dtype,
                bytes: bytemuck::cast_slice_mut(<&mut [u64]>::default()),
            });
        }
        Ok(BufferMut { dtype, bytes })
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

    /// Borrows raw memory as a read-only buffer of `dtype` elements; see
    /// [`BufferMut::from_bytes`].
    ///
    /// ```
    /// use ringccl_collectives::{BufferRef, DType};
    /// let words = [0u64; 3];
    /// let bytes: &[u8] = bytemuck::cast_slice(&words);
    /// assert_eq!(BufferRef::from_bytes(bytes, DType::I64)?.len(), 3);
    /// assert!(BufferRef::from_bytes(&bytes[..7], DType::I64).is_err());
    /// # Ok::<(), ringccl_collectives::Error>(())
    /// ```
    pub fn from_bytes(bytes: &'a [u8], dtype: DType) -> Result<BufferRef<'a>, Error> {
        check_elements(bytes.as_ptr() as usize, bytes.len(), dtype)?;
        if bytes.is_empty() {
            // An empty slice's address may be unaligned; the engine casts to elements.
            return Ok(BufferRef {
                dtype,
                bytes: bytemuck::cast_slice(<&[u64]>::default()),
            });
        }
        Ok(BufferRef { dtype, bytes })
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
