//! What the rendezvous store holds about the job: its record (random id and attempt,
//! written once by rank 0), who claimed each rank, and where each rank listens. Every key
//! that must be written once is written with set-if-absent.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::SystemTime;

use bytes::{Buf, BufMut};

/// The job's record, written by rank 0.
pub(crate) const JOB_KEY: &str = "ringccl/job";

/// Who claimed `rank` (`host:pid`).
pub(crate) fn rank_key(rank: usize) -> String {
    format!("{RANK_KEY_PREFIX}{rank}")
}

/// What every [`rank_key`] starts with.
pub(crate) const RANK_KEY_PREFIX: &str = "ringccl/rank/";

/// Where `rank`'s data listener is (`ip:port`).
pub(crate) fn addr_key(rank: usize) -> String {
    format!("ringccl/addr/{rank}")
}

/// The identity of one attempt of a job: every rank of the attempt reads it from the store
/// and checks the attempt against its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JobRecord {
    /// Random, fresh for every attempt: the peer hellos carry it.
    pub(crate) job_id: u64,
    /// Which attempt of a restarted job (`TORCHELASTIC_RESTART_COUNT`).
    pub(crate) attempt: u32,
    /// Rank 0's world size: every rank checks its own against it.
    pub(crate) world_size: u32,
}

/// Size of an encoded [`JobRecord`]: job id (u64), attempt (u32), world size (u32),
/// little-endian.
pub(crate) const JOB_RECORD_LEN: usize = 16;

impl JobRecord {
    /// A record with a fresh random job id.
    pub(crate) fn fresh(attempt: u32, world_size: usize) -> JobRecord {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        hasher.write_u32(std::process::id());
        JobRecord {
            job_id: hasher.finish(),
            attempt,
            // MeshConfig::validate keeps it far below; saturate rather than wrap anyway.
            world_size: u32::try_from(world_size).unwrap_or(u32::MAX),
        }
    }

    pub(crate) fn encode(&self) -> [u8; JOB_RECORD_LEN] {
        let mut out = [0u8; JOB_RECORD_LEN];
        let mut w = &mut out[..];
        w.put_u64_le(self.job_id);
        w.put_u32_le(self.attempt);
        w.put_u32_le(self.world_size);
        debug_assert!(w.is_empty());
        out
    }

    /// `None` unless `bytes` is exactly one record.
    pub(crate) fn decode(bytes: &[u8]) -> Option<JobRecord> {
        if bytes.len() != JOB_RECORD_LEN {
            return None;
        }
        let mut r = bytes;
        Some(JobRecord {
            job_id: r.try_get_u64_le().ok()?,
            attempt: r.try_get_u32_le().ok()?,
            world_size: r.try_get_u32_le().ok()?,
        })
    }
}

/// `host:pid` of this process, to name both claimants of a rank claimed twice.
pub(crate) fn this_process() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_rejects_other_lengths() {
        let record = JobRecord {
            job_id: 0x0102_0304_0506_0708,
            attempt: 3,
            world_size: 258,
        };
        let bytes = record.encode();
        assert_eq!(bytes, [8, 7, 6, 5, 4, 3, 2, 1, 3, 0, 0, 0, 2, 1, 0, 0]);
        assert_eq!(JobRecord::decode(&bytes), Some(record));
        assert_eq!(JobRecord::decode(&bytes[..12]), None);
        assert_eq!(JobRecord::decode(&[0; 17]), None);
        assert_ne!(JobRecord::fresh(0, 2).job_id, JobRecord::fresh(0, 2).job_id);
        assert_eq!(JobRecord::fresh(0, 7).world_size, 7);
    }

    #[test]
    fn this_process_names_host_and_pid() {
        let me = this_process();
        assert!(me.ends_with(&format!(":{}", std::process::id())), "{me}");
    }
}
