//! The progress beacon: a 64-byte file per rank and group in `RINGCCL_FLIGHT_DIR`
//! (`rank-<rank>.beacon`, `rank-<rank>.<group>.beacon`), kept current through a shared
//! mapping (a few relaxed stores per call, no system call), and read by `ringrun
//! --hang-timeout` to see whether the job still makes progress.
//!
//! Layout: eight little-endian `u64` words, in the order of [`Beacon`]'s fields, the
//! first being [`BEACON_MAGIC`]. A reader may see a word torn between two updates of
//! different words, never within one word.

/// Size of a beacon file.
pub const BEACON_LEN: usize = 64;
/// The first word: `"RCCLBCN1"` in ASCII.
pub const BEACON_MAGIC: u64 = u64::from_le_bytes(*b"RCCLBCN1");

/// One reading of a rank's beacon.
///
/// ```
/// use ringccl_observe::flight::beacon::{Beacon, BEACON_LEN};
///
/// let beacon = Beacon { pid: 7, issued: 3, finished: 2, current_op: 3, blocked_on: Some(1), ..Beacon::default() };
/// let bytes = beacon.encode();
/// assert_eq!(bytes.len(), BEACON_LEN);
/// assert_eq!(Beacon::decode(&bytes), Some(beacon));
/// assert_eq!(Beacon::decode(&[0; BEACON_LEN]), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Beacon {
    /// The writing process.
    pub pid: u64,
    /// Calls issued so far on this rank and group.
    pub issued: u64,
    /// Calls finished so far (either way).
    pub finished: u64,
    /// When the last call finished (µs since the Unix epoch; 0: none yet).
    pub last_finished_us: u64,
    /// The sequence number of the collective running now (0: none).
    pub current_op: u64,
    /// Since when it runs (µs since the Unix epoch).
    pub current_since_us: u64,
    /// The peer the running call waits for, if it waits.
    pub blocked_on: Option<u64>,
}

impl Beacon {
    /// The file's 64 bytes for this reading.
    pub fn encode(&self) -> [u8; BEACON_LEN] {
        let words = [
            BEACON_MAGIC,
            self.pid,
            self.issued,
            self.finished,
            self.last_finished_us,
            self.current_op,
            self.current_since_us,
            self.blocked_on.map_or(0, |p| p.saturating_add(1)),
        ];
        let mut out = [0u8; BEACON_LEN];
        for (chunk, word) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// Reads a beacon file's bytes; `None` unless they start with [`BEACON_MAGIC`] and
    /// hold all eight words.
    pub fn decode(bytes: &[u8]) -> Option<Beacon> {
        let word = |i: usize| -> Option<u64> {
            let raw = bytes.get(i * 8..i * 8 + 8)?;
            Some(u64::from_le_bytes(raw.try_into().ok()?))
        };
        if word(0)? != BEACON_MAGIC {
            return None;
        }
        let blocked = word(7)?;
        Some(Beacon {
            pid: word(1)?,
            issued: word(2)?,
            finished: word(3)?,
            last_finished_us: word(4)?,
            current_op: word(5)?,
            current_since_us: word(6)?,
            blocked_on: blocked.checked_sub(1),
        })
    }
}
