//! The only `unsafe` of the shared-memory transport: a shared file mapping, atomics
//! placed in it, byte copies in and out of it, the futex calls that sleep on a word
//! of it, and reads of a peer process's memory through the kernel.

// mmap, atomics and byte copies in shared memory, futex and process_vm_readv syscalls.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// A `MAP_SHARED` mapping of a whole file (or anonymous memory), unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all access to it goes through atomics or
// through byte copies whose ranges the single-producer/single-consumer protocol of the
// rings keeps disjoint between writer and reader.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps all `len` bytes of `file` read-write and shared.
    pub(crate) fn new(file: &File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping of a file we hold open; the kernel picks the address, and
        // the length is the file's length (the caller sized it).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(Mapping { base, len })
    }

    /// `len` bytes of fresh zeroed anonymous memory, for the threads of this process
    /// (no file: the ranks of one process need no name to find it). Shared, not
    /// private, so that the futex words in it behave as in a file mapping.
    pub(crate) fn anonymous(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(Mapping { base, len })
    }

    /// Where the mapping starts in this process's address space (a peer process that
    /// reads this process's memory needs it).
    pub(crate) fn address(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The whole mapping as bytes, for reading a shared buffer in place: its owner's
    /// own, or a peer's while the one-copy protocol keeps the peer from writing it.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped at `base` for as long as `self` lives; any bit
        // pattern is a valid `u8`. Other processes that map the same file write it only
        // where the protocols give them the range (the rings' producer, a shared
        // buffer's owner outside the one-copy steps that read it); a peer breaking that
        // could only change the values read, which the protocols then discard.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// The whole mapping as bytes, to write: a shared buffer, by its owner, or by a
    /// peer writing the segment it reduced.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`; `&mut self` makes this the only reference made through
        // this mapping. Other processes touch the same bytes only where the one-copy
        // protocol gives them a segment: each segment is written by the one rank that
        // reduces it, while no other rank reads or writes it.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }

    fn check(&self, offset: usize, len: usize, align: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len) && offset % align == 0,
            "shared-memory access out of bounds: {offset}+{len} of {}",
            self.len
        );
    }

    /// The `AtomicU64` at `offset` (8-byte aligned, inside the mapping).
    pub(crate) fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8, 8);
        // SAFETY: in bounds and aligned (checked); the mapping is page-aligned and lives
        // as long as `self`; AtomicU64 has the layout of u64 and every process accesses
        // this word only atomically.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The `AtomicU32` at `offset` (4-byte aligned, inside the mapping).
    pub(crate) fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        self.check(offset, 4, 4);
        // SAFETY: as for `atomic_u64`.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// Copies `src` into the mapping at `offset`.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len(), 1);
        // SAFETY: in bounds (checked); the ring protocol gives the writer exclusive use of
        // this range until it publishes it; `src` is caller memory, so no overlap.
        unsafe {
            copy_bytes(src.as_ptr(), self.base.as_ptr().add(offset), src.len());
        }
    }

    /// Copies from the mapping at `offset` into `dst`.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len(), 1);
        // SAFETY: in bounds (checked); the ring protocol gives the reader exclusive use of
        // this published range until it releases it; `dst` is caller memory.
        unsafe {
            copy_bytes(self.base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len());
        }
    }
}

/// Copies `src` into `dst`, as `copy_from_slice` does (their lengths must be equal),
/// avoiding the slow path of `memcpy` described at [`copy_bytes`].
pub(crate) fn copy_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    // SAFETY: both slices are valid for their whole (equal) length, and a `&mut` slice
    // never overlaps a shared one.
    unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// Copies of at least this many bytes avoid the slow path of `memcpy` (see [`copy_bytes`]).
const SLOW_COPY_MIN: usize = 1024;

/// Copies `len` bytes from `src` to `dst`, which do not overlap.
///
/// On some CPUs (an AMD EPYC measured), glibc's `memcpy` of 64 to 256 KiB (not 1 MiB and
/// more) runs 15 to 20 times slower, about 2 GB/s where it otherwise reaches 35–45, when the
/// destination lies a few bytes after the source modulo 4 KiB (1, 8 and 16 measured; 48
/// half as slow, 32 and 64 not): its `rep movsb` then waits on false dependencies between
/// stores and later loads (`cargo bench -p ringccl-transports --bench copy_paths`, the
/// `memcpy+16` column). A ring's position and a user's buffer can fall into that window
/// (a large heap buffer starts 16 bytes into its page). Such copies go through 16-byte
/// vector moves instead, which run at 28–37 GB/s whatever the distance.
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the two ranges
/// must not overlap.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let distance = (dst as usize).wrapping_sub(src as usize) % 4096;
        if len >= SLOW_COPY_MIN && (1..64).contains(&distance) {
            // SAFETY: the caller's guarantees, passed on.
            unsafe { copy_by_vectors(src, dst, len) };
            return;
        }
    }
    // SAFETY: the caller's guarantees.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// [`copy_bytes`] through 16-byte SSE2 loads and stores (every x86-64 CPU has SSE2), four
/// at a time, then the tail.
///
/// # Safety
///
/// As for [`copy_bytes`].
#[cfg(target_arch = "x86_64")]
unsafe fn copy_by_vectors(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
    let mut at = 0;
    while at + 64 <= len {
        // SAFETY: `at + 64 <= len`, so every 16-byte access lies inside both ranges;
        // unaligned loads and stores need no alignment.
        unsafe {
            let from = src.add(at).cast::<__m128i>();
            let to = dst.add(at).cast::<__m128i>();
            let (a, b) = (_mm_loadu_si128(from), _mm_loadu_si128(from.add(1)));
            let (c, d) = (_mm_loadu_si128(from.add(2)), _mm_loadu_si128(from.add(3)));
            _mm_storeu_si128(to, a);
            _mm_storeu_si128(to.add(1), b);
            _mm_storeu_si128(to.add(2), c);
            _mm_storeu_si128(to.add(3), d);
        }
        at += 64;
    }
    // SAFETY: the last `len - at` bytes of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
}

/// Copies `out.len()` bytes from `address` in process `pid`'s memory into `out`, through
/// the kernel (cross-memory attach, `process_vm_readv`): it needs the right to trace
/// `pid` (the same user, and Yama's `ptrace_scope` allowing it). A process that is gone
/// is [`io::ErrorKind::BrokenPipe`]; an address outside its memory is `EFAULT`.
pub(crate) fn read_process(pid: u32, address: u64, out: &mut [u8]) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "process id out of range"))?;
    let mut done = 0;
    while done < out.len() {
        let left = out.len() - done;
        let from = address
            .checked_add(done as u64)
            .and_then(|a| usize::try_from(a).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "address overflows"))?;
        let local = libc::iovec {
            iov_base: out[done..].as_mut_ptr().cast(),
            iov_len: left,
        };
        let remote = libc::iovec {
            iov_base: from as *mut libc::c_void,
            iov_len: left,
        };
        // SAFETY: `local` is the last `left` bytes of `out`, which this function borrows
        // mutably; `remote` is only read by the kernel, which checks it against `pid`'s
        // mappings and fails with EFAULT outside them, never touching this process's.
        let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if got < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ESRCH) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        format!("no process {pid}"),
                    ))
                }
                _ => return Err(e),
            }
        }
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("process {pid}'s memory ended at {from:#x}"),
            ));
        }
        done += got as usize;
    }
    Ok(())
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region `new` mapped; no reference into it outlives
        // `self` (they all borrow it).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// Sleeps while `word` still holds `expected`, at most `timeout` (spurious wake-ups are
/// possible; callers re-check their condition).
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned 32-bit word that lives in a mapping shared
    // between processes (so not FUTEX_PRIVATE); `ts` outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every process sleeping on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned 32-bit word; it only wakes waiters.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length (with and without a tail) at every distance in and around the window
    /// that takes the vector path copies exactly, and touches nothing outside.
    #[test]
    fn copies_are_exact_at_every_distance_and_length() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for distance in [0usize, 1, 15, 16, 48, 63, 64, 100, 4095] {
            for len in [0usize, 1, 63, 1023, 1024, 1025, 4096 + 17, 9000] {
                let mut dst = vec![0xAAu8; 4096 + distance + len + 64];
                let from = src.as_ptr();
                // Place the destination `distance` bytes after the source, modulo 4 KiB.
                let want = (from as usize + distance) % 4096;
                let have = dst.as_ptr() as usize % 4096;
                let start = (want + 4096 - have) % 4096;
                // SAFETY: `src` has `len` bytes; `dst` has `start + len` bytes and more;
                // two allocations never overlap.
                unsafe { copy_bytes(from, dst.as_mut_ptr().add(start), len) };
                assert_eq!(&dst[start..start + len], &src[..len], "{distance} {len}");
                assert!(dst[..start].iter().all(|&b| b == 0xAA), "{distance} {len}");
                assert!(
                    dst[start + len..].iter().all(|&b| b == 0xAA),
                    "{distance} {len}"
                );
            }
        }
    }
}
