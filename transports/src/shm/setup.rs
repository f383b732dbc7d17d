//! Setting up shared memory, collectively: every rank on one host? every inbox created?
//! every inbox mapped? Each step's outcome is published through the rendezvous store, so
//! every rank takes the same decision.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Instant;

use super::mapping::Mapping;
use super::ring::{inbox_len, Rings};
use crate::SetupStore;

fn inbox_path(job_id: u64, rank: usize) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ringccl-{job_id:016x}-{rank}"))
}

/// This machine's identity: ranks with equal identities share memory.
fn host_identity() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    format!(
        "{}/{}",
        read("/proc/sys/kernel/hostname").trim(),
        read("/proc/sys/kernel/random/boot_id").trim()
    )
}

/// Shared memory was required (`RINGCCL_TRANSPORT=shm`) but cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("rank {rank}: shared-memory transport: {reason}; use RINGCCL_TRANSPORT=tcp")]
pub struct ShmUnavailable {
    /// The rank that reports it.
    pub rank: usize,
    /// Why (another host, a file that could not be created or mapped).
    pub reason: String,
}

/// Every rank's inbox, mapped: what [`ShmTransport::new`](super::ShmTransport::new)
/// needs besides the liveness connections.
pub struct SharedRings(pub(super) Rings);

impl std::fmt::Debug for SharedRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRings")
            .field("ranks", &self.0.inboxes.len())
            .field("ring_bytes", &self.0.ring_bytes)
            .finish()
    }
}

/// Sets up shared memory between the `n` ranks of job `job`, collectively: every rank
/// must call it. `Ok(None)` when some rank is on another host or could not set it up
/// (every rank then sees `None` and keeps TCP); with `required`, those cases are errors
/// that say why. The inbox files are unlinked before this returns, so nothing is left
/// in `/dev/shm` even if a process is killed later.
#[allow(clippy::too_many_arguments)] // every argument is one fact of the job; a struct would only rename them
pub fn set_up<S: SetupStore + ?Sized>(
    store: &mut S,
    rank: usize,
    n: usize,
    job: u64,
    ring_bytes: usize,
    deadline: Instant,
    required: bool,
) -> Result<Option<SharedRings>, S::Error> {
    let fail = |reason: String| S::Error::from(ShmUnavailable { rank, reason });
    // 1. Every rank on this host?
    let me = host_identity();
    store.set(&format!("ringccl/host/{rank}"), me.as_bytes())?;
    for peer in 0..n {
        let theirs = store.wait(&format!("ringccl/host/{peer}"), deadline, &|| {
            format!("rank {peer} to report its host")
        })?;
        if theirs != me.as_bytes() {
            if required {
                return Err(fail(format!(
                    "it needs every rank on one host, but rank {peer} runs on {:?} and this rank on {me:?}",
                    String::from_utf8_lossy(&theirs)
                )));
            }
            return Ok(None);
        }
    }
    // 2. Create this rank's inbox.
    let len = inbox_len(n, ring_bytes);
    let own_path = inbox_path(job, rank);
    let unlink_own = || {
        let _ = std::fs::remove_file(&own_path);
    };
    let created = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&own_path)
        .and_then(|file| {
            file.set_len(len as u64)?;
            Mapping::new(&file, len)
        });
    let own_error = created
        .as_ref()
        .err()
        .map(|e| format!("creating {}: {e}", own_path.display()));
    if !agree(store, "created", rank, n, created.is_ok(), deadline)? {
        unlink_own();
        return match (required, own_error) {
            (true, Some(e)) => Err(fail(e)),
            (true, None) => Err(fail("another rank could not create its inbox".into())),
            (false, _) => Ok(None),
        };
    }
    // 3. Map every other rank's inbox.
    let mut own = created.ok();
    let mut inboxes = Vec::with_capacity(n);
    let mut map_error = None;
    for peer in 0..n {
        if peer == rank {
            inboxes.extend(own.take());
            continue;
        }
        let path = inbox_path(job, peer);
        let mapped = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .and_then(|file| {
                let actual = file.metadata()?.len();
                if actual != len as u64 {
                    return Err(io::Error::other(format!(
                        "it has {actual} bytes, expected {len} (same ringccl version everywhere?)"
                    )));
                }
                Mapping::new(&file, len)
            });
        match mapped {
            Ok(mapping) => inboxes.push(mapping),
            Err(e) => {
                map_error = Some(format!("mapping {}: {e}", path.display()));
                break;
            }
        }
    }
    let all_mapped = agree(store, "mapped", rank, n, map_error.is_none(), deadline);
    unlink_own();
    if !all_mapped? {
        return match (required, map_error) {
            (true, Some(e)) => Err(fail(e)),
            (true, None) => Err(fail("another rank could not map the inboxes".into())),
            (false, _) => Ok(None),
        };
    }
    Ok(Some(SharedRings(Rings {
        ring_bytes,
        inboxes,
    })))
}

/// Publishes this rank's outcome of a set-up step and learns everyone's: `Ok(true)`
/// when every rank succeeded.
fn agree<S: SetupStore + ?Sized>(
    store: &mut S,
    step: &str,
    rank: usize,
    n: usize,
    ok: bool,
    deadline: Instant,
) -> Result<bool, S::Error> {
    store.set(
        &format!("ringccl/shm/{step}/{rank}"),
        if ok { b"1" } else { b"0" },
    )?;
    let mut all = true;
    for peer in 0..n {
        let outcome = store.wait(&format!("ringccl/shm/{step}/{peer}"), deadline, &|| {
            format!("rank {peer} to finish setting up shared memory ({step})")
        })?;
        all &= outcome == b"1";
    }
    Ok(all)
}
