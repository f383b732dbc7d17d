//! Space in `/dev/shm`: reserving an inbox's bytes up front (`posix_fallocate`), and
//! reading how much is free (`statvfs`) to say so when there is not enough. These are
//! the two libc calls std has no safe wrapper for.

// posix_fallocate and statvfs: plain libc calls on a file we own and a path we name.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Allocates every byte of `file` up to `len`, so that touching them later can never
/// fail for lack of space (a sparse file in a full tmpfs faults with SIGBUS instead).
/// On a full file system this is `ENOSPC` at once, and nothing stays allocated.
pub(super) fn reserve(file: &File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size does not fit off_t"))?;
    loop {
        // SAFETY: a plain system call on a descriptor `file` keeps open for the call; it
        // reads and writes no memory of ours.
        let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        match code {
            0 => return Ok(()),
            libc::EINTR => continue,
            code => return Err(io::Error::from_raw_os_error(code)),
        }
    }
}

/// Free and total bytes of the file system holding `path`, as an unprivileged process
/// may use them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Space {
    pub(super) free: u64,
    pub(super) total: u64,
}

/// What `statvfs(2)` says about the file system holding `path`.
#[allow(clippy::useless_conversion)] // the fields are u64 here but narrower on some targets
pub(super) fn space(path: &Path) -> io::Result<Space> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    let mut stat = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call, and `stat`
    // points to writable memory of the struct's size, which statvfs fills on success.
    let code = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if code != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    let unit = u64::from(stat.f_frsize);
    Ok(Space {
        free: u64::from(stat.f_bavail).saturating_mul(unit),
        total: u64::from(stat.f_blocks).saturating_mul(unit),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_bytes_are_allocated_not_sparse() {
        use std::os::unix::fs::MetadataExt;
        if !Path::new("/dev/shm").is_dir() {
            eprintln!("skipped: no /dev/shm on this machine");
            return;
        }
        let file = tempfile_in(Path::new("/dev/shm"));
        reserve(&file, 1 << 20).unwrap();
        let meta = file.metadata().unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert!(meta.blocks() * 512 >= 1 << 20, "{} blocks", meta.blocks());
    }

    #[test]
    fn space_reads_the_file_system_and_refuses_odd_paths() {
        let space = space(Path::new("/")).unwrap();
        assert!(space.total > 0 && space.free <= space.total, "{space:?}");
        assert!(super::space(Path::new("/no/such/dir")).is_err());
        assert!(super::space(Path::new("a\0b")).is_err());
    }

    fn tempfile_in(dir: &Path) -> File {
        use std::os::unix::fs::OpenOptionsExt;
        File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
            .unwrap()
    }
}
