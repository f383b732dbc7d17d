//! Buffers that live in shared memory from the start, so that the host's other ranks
//! read them in place: an all-reduce of such a buffer moves each byte between processes
//! once, at the speed of a `memcpy`, with no copy through the rings.
//!
//! A [`SharedBuffer`] is an unnamed, owner-only, fully reserved file in `/dev/shm`,
//! made and checked like an inbox (`inbox.rs`), that stays open while the buffer lives.
//! Its address range is listed in this process's registry; an all-reduce whose buffer
//! lies in a listed range posts the file's ticket, and each peer maps the file (after
//! the inbox checks) the first time it sees that ticket, keeping the mapping for the
//! next calls ([`PeerBuffers`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};

use ringccl_collectives::memory_barrier::{SharedTicket, SHARED_TICKET_LEN};

use super::inbox::{bytes, open_peer, OwnInbox, Ticket};
use super::mapping::{copy_slice, Mapping};
use super::space::space;

/// The shared buffers this process owns: (start address, bytes, ticket).
static REGISTRY: Mutex<Vec<(u64, u64, Ticket)>> = Mutex::new(Vec::new());

/// The ticket to post for `len` bytes at `address`, when they lie in one of this
/// process's shared buffers: the buffer's ticket and the offset into it.
pub(super) fn ticket_for(address: u64, len: usize) -> Option<SharedTicket> {
    let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    let end = address.checked_add(len as u64)?;
    let &(start, _, ticket) = registry
        .iter()
        .find(|&&(start, bytes, _)| start <= address && end <= start + bytes)?;
    let mut out = [0u8; SHARED_TICKET_LEN];
    out[..Ticket::LEN].copy_from_slice(&ticket.to_bytes());
    out[Ticket::LEN..].copy_from_slice(&(address - start).to_le_bytes());
    Some(out)
}

/// A posted ticket read back: the buffer's file, and the offset of the call's buffer in it.
pub(super) fn read_ticket(posted: &SharedTicket) -> (Ticket, u64) {
    let mut ticket = [0u8; Ticket::LEN];
    ticket.copy_from_slice(&posted[..Ticket::LEN]);
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&posted[Ticket::LEN..]);
    (Ticket::from_bytes(&ticket), u64::from_le_bytes(offset))
}

/// `len` elements of `T`, zeroed, in memory the host's other ranks can map: an
/// all-reduce of (a slice of) it, called with shared buffers on every rank, reads the
/// peers' buffers in place instead of passing the bytes through the rings. Use it like
/// a `Vec` of fixed length (it dereferences to `[T]`). Where the group's ranks do not
/// share memory, [`SharedBuffer::on_heap`] makes the same type in ordinary memory.
///
/// ```
/// use ringccl_transports::shm::SharedBuffer;
///
/// let mut buf = SharedBuffer::<f32>::new(1024).unwrap();
/// buf[3] = 1.5;
/// assert_eq!(buf.len(), 1024);
/// assert_eq!(buf.iter().sum::<f32>(), 1.5);
/// ```
pub struct SharedBuffer<T> {
    backing: Backing,
    len: usize,
    elements: PhantomData<T>,
}

enum Backing {
    Mapped(OwnInbox),
    Heap(Vec<u64>),
}

impl<T: bytemuck::Pod> SharedBuffer<T> {
    /// `len` zeroed elements in a new file of `/dev/shm`, reserved in full: a full
    /// `/dev/shm` is an error naming the bytes needed and free.
    ///
    /// ```
    /// let buf = ringccl_transports::shm::SharedBuffer::<u8>::new(3).unwrap();
    /// assert!(buf.is_shared());
    /// ```
    pub fn new(len: usize) -> Result<SharedBuffer<T>, String> {
        let bytes_needed = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| format!("{len} elements overflow the address space"))?;
        if bytes_needed == 0 {
            return Ok(SharedBuffer::on_heap(len));
        }
        let inbox = OwnInbox::create_as("a shared buffer", bytes_needed, |dir, e| {
            let room = match space(dir) {
                Ok(s) => format!("{} free of {}", bytes(s.free), bytes(s.total)),
                Err(e) => format!("an unknown amount free ({e})"),
            };
            format!(
                "reserving a shared buffer of {} in {}: {e}; it has {room}",
                bytes(bytes_needed as u64),
                dir.display()
            )
        })?;
        let start = inbox.mapping().address();
        REGISTRY
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((start, bytes_needed as u64, inbox.ticket()));
        Ok(SharedBuffer {
            backing: Backing::Mapped(inbox),
            len,
            elements: PhantomData,
        })
    }

    /// `len` zeroed elements in this process's heap: the same type, for groups whose
    /// ranks share no memory.
    ///
    /// ```
    /// let buf = ringccl_transports::shm::SharedBuffer::<f64>::on_heap(2);
    /// assert!(!buf.is_shared());
    /// assert_eq!(&buf[..], &[0.0, 0.0]);
    /// ```
    pub fn on_heap(len: usize) -> SharedBuffer<T> {
        let words = len.saturating_mul(std::mem::size_of::<T>()).div_ceil(8);
        SharedBuffer {
            backing: Backing::Heap(vec![0u64; words]),
            len,
            elements: PhantomData,
        }
    }

    /// Whether the buffer lives in shared memory (not [`SharedBuffer::on_heap`]).
    ///
    /// ```
    /// let buf = ringccl_transports::shm::SharedBuffer::<i32>::new(8).unwrap();
    /// assert!(buf.is_shared());
    /// ```
    pub fn is_shared(&self) -> bool {
        matches!(self.backing, Backing::Mapped(_))
    }

    fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mapped(inbox) => inbox.mapping().bytes(),
            Backing::Heap(words) => bytemuck::cast_slice(words),
        }
    }
}

/// Copies `src` into `dst` like `dst.copy_from_slice(src)` (their lengths must be
/// equal), but never through the slow path some CPUs' `memcpy` takes when the
/// destination lies a few bytes after the source modulo 4 KiB (copies of 64–256 KiB at
/// a twentieth of the usual speed, measured on an AMD EPYC): a page-aligned shared
/// buffer and a heap buffer, which starts 16 bytes into its page, are such a pair.
///
/// ```
/// let mut shared = ringccl_transports::shm::SharedBuffer::<f32>::new(1 << 16).unwrap();
/// let heap = vec![2.0f32; 1 << 16];
/// ringccl_transports::shm::copy_elements(&mut shared[..], &heap);
/// assert_eq!(shared[12345], 2.0);
/// ```
pub fn copy_elements<T: bytemuck::Pod>(dst: &mut [T], src: &[T]) {
    copy_slice(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src));
}

impl<T: bytemuck::Pod> std::ops::Deref for SharedBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        let bytes = self.len * std::mem::size_of::<T>();
        // Page-aligned (a mapping) or 8-aligned (the heap's words), exactly long enough.
        bytemuck::cast_slice(&self.bytes()[..bytes])
    }
}

impl<T: bytemuck::Pod> std::ops::DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let bytes = self.len * std::mem::size_of::<T>();
        let all = match &mut self.backing {
            Backing::Mapped(inbox) => inbox.mapping_mut().bytes_mut(),
            Backing::Heap(words) => bytemuck::cast_slice_mut(words),
        };
        bytemuck::cast_slice_mut(&mut all[..bytes])
    }
}

impl<T> Drop for SharedBuffer<T> {
    fn drop(&mut self) {
        if let Backing::Mapped(inbox) = &self.backing {
            let start = inbox.mapping().address();
            REGISTRY
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|&(s, _, _)| s != start);
        }
    }
}

impl<T: bytemuck::Pod + fmt::Debug> fmt::Debug for SharedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("len", &self.len)
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

/// The most shared buffers of one peer kept mapped here. A peer's buffer dropped by
/// its owner stays in memory while it is mapped here, until this many newer ones
/// replace it or the group closes.
const MAPPED_PER_PEER: usize = 32;

/// The peers' shared buffers this rank has mapped, most recently used first.
#[derive(Default)]
pub(super) struct PeerBuffers {
    mapped: Vec<Vec<(Ticket, Mapping)>>,
    /// The user this rank runs as (a peer's buffer must be his), once looked up.
    uid: Option<u32>,
}

impl PeerBuffers {
    /// `len` bytes at the offset `posted` names plus `offset`, in the buffer `peer`
    /// posted, mapped on first use. A buffer that cannot be mapped (its owner dropped it,
    /// or it fails the checks) is an error saying why.
    pub(super) fn bytes(
        &mut self,
        peer: usize,
        posted: &SharedTicket,
        range: (u64, usize),
    ) -> std::io::Result<&[u8]> {
        let (mapping, start, len) = self.locate(peer, posted, range)?;
        Ok(&mapping.bytes()[start..start + len])
    }

    /// [`PeerBuffers::bytes`], to write.
    pub(super) fn bytes_mut(
        &mut self,
        peer: usize,
        posted: &SharedTicket,
        range: (u64, usize),
    ) -> std::io::Result<&mut [u8]> {
        let (mapping, start, len) = self.locate(peer, posted, range)?;
        Ok(&mut mapping.bytes_mut()[start..start + len])
    }

    /// The mapping of the buffer `peer` posted (mapped now if it was not), and where
    /// `len` bytes at `offset` past the posted offset start in it.
    fn locate(
        &mut self,
        peer: usize,
        posted: &SharedTicket,
        (offset, len): (u64, usize),
    ) -> std::io::Result<(&mut Mapping, usize, usize)> {
        use std::io::{Error, ErrorKind};
        let (ticket, base) = read_ticket(posted);
        if self.mapped.len() <= peer {
            self.mapped.resize_with(peer + 1, Vec::new);
        }
        let uid = match self.uid {
            Some(uid) => uid,
            None => {
                use std::os::unix::fs::MetadataExt;
                let uid = std::fs::metadata("/proc/self")?.uid();
                *self.uid.insert(uid)
            }
        };
        let mapped = &mut self.mapped[peer];
        let at = match mapped.iter().position(|(t, _)| *t == ticket) {
            Some(at) => at,
            None => {
                let len = usize::try_from(ticket.len()).map_err(|_| {
                    Error::new(ErrorKind::InvalidData, "a shared buffer too large to map")
                })?;
                let mapping = open_peer(&ticket, len, uid).map_err(|reason| {
                    Error::other(format!("mapping its shared buffer: {reason}"))
                })?;
                mapped.truncate(MAPPED_PER_PEER - 1);
                mapped.insert(0, (ticket, mapping));
                0
            }
        };
        if at > 0 {
            let hit = mapped.remove(at);
            mapped.insert(0, hit);
        }
        let mapping = &mut mapped[0].1;
        let size = mapping.len();
        let start = base
            .checked_add(offset)
            .and_then(|s| usize::try_from(s).ok())
            .filter(|&s| s.checked_add(len).is_some_and(|end| end <= size))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "{len} bytes at {base}+{offset} lie outside its shared buffer of {size} bytes"
                    ),
                )
            })?;
        Ok((mapping, start, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_buffer_is_found_by_address_and_mapped_by_a_peer() {
        if !std::path::Path::new(super::super::inbox::SHM_DIR).is_dir() {
            eprintln!("skipped: no /dev/shm on this machine");
            return;
        }
        let mut own = SharedBuffer::<u32>::new(4096).unwrap();
        for (i, x) in own.iter_mut().enumerate() {
            *x = i as u32;
        }
        let at = own[100..].as_ptr() as u64;
        let posted = ticket_for(at, 400).expect("inside the buffer");
        assert!(ticket_for(at, 4096 * 4).is_none(), "runs past its end");
        let heap = Box::new([0u32; 10]);
        assert!(ticket_for(heap.as_ptr() as u64, 40).is_none());

        let mut peers = PeerBuffers::default();
        let seen = peers.bytes(1, &posted, (8, 8)).unwrap();
        assert_eq!(seen, bytemuck::cast_slice::<u32, u8>(&[102, 103]));
        assert!(peers.bytes(1, &posted, (16 * 1024 - 400, 8)).is_err());

        let gone = posted;
        drop(own);
        assert!(ticket_for(at, 4).is_none(), "unlisted once dropped");
        // Still mapped here from before: the memory lives on while a peer maps it.
        assert_eq!(
            peers.bytes(1, &gone, (0, 4)).unwrap(),
            &100u32.to_le_bytes()
        );
        // A fresh peer can no longer open it.
        assert!(PeerBuffers::default().bytes(0, &gone, (0, 4)).is_err());
    }
}
