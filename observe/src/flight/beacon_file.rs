//! A group's live beacon file: created whole (temporary file, then rename), kept current
//! through a shared mapping with a relaxed store per change (no system call), removed
//! when the group ends cleanly. The layout is [`Beacon`]'s.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::beacon::Beacon;
use super::files::temporary_beside;
use super::mapping::BeaconMapping;

// The words of the layout, in the order of `Beacon::encode`.
const ISSUED: usize = 2;
const FINISHED: usize = 3;
const LAST_FINISHED_US: usize = 4;
const CURRENT_OP: usize = 5;
const CURRENT_SINCE_US: usize = 6;
const BLOCKED_ON: usize = 7;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct BeaconFile {
    path: PathBuf,
    mapping: BeaconMapping,
    /// The file's device and inode, so that only this file is ever removed.
    identity: (u64, u64),
}

impl BeaconFile {
    /// Creates (or replaces) the beacon at `path` for this process, nothing issued yet.
    pub(crate) fn create(path: PathBuf) -> io::Result<BeaconFile> {
        let temporary = temporary_beside(&path);
        let initial = Beacon {
            pid: u64::from(std::process::id()),
            ..Beacon::default()
        }
        .encode();
        let made = (|| {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&temporary)?;
            file.write_all(&initial)?;
            let mapping = BeaconMapping::new(&file)?;
            let meta = file.metadata()?;
            fs::rename(&temporary, &path)?;
            Ok(BeaconFile {
                path,
                mapping,
                identity: (meta.dev(), meta.ino()),
            })
        })();
        if made.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        made
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    #[inline]
    fn word(&self, index: usize) -> Option<&AtomicU64> {
        self.mapping.words().get(index)
    }

    #[inline]
    fn set(&self, index: usize, value: u64) {
        if let Some(word) = self.word(index) {
            word.store(value, Relaxed);
        }
    }

    /// `issued` calls issued so far.
    #[inline]
    pub(crate) fn issued(&self, issued: u64) {
        self.set(ISSUED, issued);
    }

    /// Collective `seq` started at `since_us`, waiting for nobody yet.
    #[inline]
    pub(crate) fn started(&self, seq: u64, since_us: u64) {
        self.set(BLOCKED_ON, 0);
        self.set(CURRENT_SINCE_US, since_us);
        self.set(CURRENT_OP, seq);
    }

    /// The running call waits for `peer`.
    #[inline]
    pub(crate) fn blocked_on(&self, peer: usize) {
        self.set(BLOCKED_ON, (peer as u64).saturating_add(1));
    }

    /// `finished` calls finished so far, the last at `at_us`; nothing runs.
    #[inline]
    pub(crate) fn finished(&self, finished: u64, at_us: u64) {
        self.set(CURRENT_OP, 0);
        self.set(BLOCKED_ON, 0);
        self.set(LAST_FINISHED_US, at_us);
        self.set(FINISHED, finished);
    }

    /// Removes the file, if it is still this one (a later group of the same name may
    /// have replaced it).
    pub(crate) fn remove(&self) {
        let ours = fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity);
        if ours {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beacon_file_reads_back_what_was_stored_and_is_removed_only_if_ours() {
        let dir = std::env::temp_dir().join(format!("ringccl-beacon-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rank-1.beacon");
        let beacon = BeaconFile::create(path.clone()).unwrap();
        let read = || Beacon::decode(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(read().pid, u64::from(std::process::id()));
        beacon.issued(3);
        beacon.started(7, 1_000);
        beacon.blocked_on(2);
        let now = read();
        assert_eq!(
            (
                now.issued,
                now.current_op,
                now.current_since_us,
                now.blocked_on
            ),
            (3, 7, 1_000, Some(2))
        );
        beacon.finished(3, 2_000);
        let now = read();
        assert_eq!(
            (
                now.finished,
                now.last_finished_us,
                now.current_op,
                now.blocked_on
            ),
            (3, 2_000, 0, None)
        );
        // A newer group of the same name replaces the file: the old one leaves it alone.
        let newer = BeaconFile::create(path.clone()).unwrap();
        beacon.remove();
        assert!(path.exists());
        drop(beacon);
        assert_eq!(read().issued, 0, "the newer file is intact");
        newer.remove();
        assert!(!path.exists());
        let _ = fs::remove_dir_all(&dir);
    }
}
