//! The only `unsafe` of the flight recorder: the beacon file mapped shared into memory,
//! its eight words used as atomics.

// mmap/munmap of the beacon file, and its words viewed as atomics.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::beacon::BEACON_LEN;

/// The words of a beacon file.
pub(crate) type Words = [AtomicU64; BEACON_LEN / 8];

/// A `MAP_SHARED` mapping of the first [`BEACON_LEN`] bytes of a file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct BeaconMapping {
    base: NonNull<Words>,
}

// SAFETY: the mapping is plain shared memory, accessed only through atomics.
unsafe impl Send for BeaconMapping {}
// SAFETY: as above.
unsafe impl Sync for BeaconMapping {}

impl BeaconMapping {
    /// Maps `file`, which must be at least [`BEACON_LEN`] bytes long.
    pub(crate) fn new(file: &File) -> io::Result<BeaconMapping> {
        if file.metadata()?.len() < BEACON_LEN as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the beacon file is shorter than a beacon",
            ));
        }
        // SAFETY: a fresh mapping of a file we hold open and checked to be long enough;
        // the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BEACON_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<Words>())
            .ok_or_else(|| io::Error::other("mmap returned a null pointer"))?;
        Ok(BeaconMapping { base })
    }

    /// The file's words.
    pub(crate) fn words(&self) -> &Words {
        // SAFETY: the mapping is page-aligned, BEACON_LEN bytes long and lives as long as
        // `self`; AtomicU64 has the layout of u64, and this process touches the words only
        // atomically (readers in other processes only read).
        unsafe { self.base.as_ref() }
    }
}

impl Drop for BeaconMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference into it outlives
        // `self` (`words` borrows `self`).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), BEACON_LEN);
        }
    }
}
