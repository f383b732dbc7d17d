//! The flight recorder's dump: one JSON file per rank and group, written to
//! `RINGCCL_FLIGHT_DIR`. The library writes it; `ringrun diagnose` and `ringrun
//! --hang-timeout` read it. Times are microseconds since the Unix epoch, so dumps of
//! different ranks (and, with synchronised clocks, different hosts) line up.

use serde::{Deserialize, Serialize};

/// The version written in [`FlightDump::format`]. Format 2 added
/// [`CallState::OnDevice`]; readers accept formats 1 and 2.
pub const FORMAT_VERSION: u32 = 2;

/// The oldest format readers accept.
pub const OLDEST_FORMAT_READ: u32 = 1;

/// The file one rank writes for one group: `rank-<rank>.json` for the group made by
/// `init_process_group`, `rank-<rank>.<group>.json` for groups formed from it.
///
/// ```
/// use ringccl_observe::flight::dump::{FlightDump, FORMAT_VERSION};
///
/// let dump = FlightDump::empty(2, 4, "main", "requested");
/// let text = serde_json::to_string(&dump).unwrap();
/// let back: FlightDump = serde_json::from_str(&text).unwrap();
/// assert_eq!(back, dump);
/// assert_eq!(back.format, FORMAT_VERSION);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlightDump {
    /// [`FORMAT_VERSION`] of the writer.
    pub format: u32,
    /// The rank in `group`.
    pub rank: usize,
    /// The number of ranks in `group`.
    pub world_size: usize,
    /// `"main"`, or the formed group's namespace (e.g. `"group/0/1/"`).
    pub group: String,
    /// `"gloo"` or `"nccl"`.
    pub backend: String,
    /// `"tcp"`, `"shm"` or `"nccl"`.
    pub transport: String,
    /// The host's name.
    pub host: String,
    /// The writing process.
    pub pid: u32,
    /// Why the dump was written: `"requested"`, `"group broken: …"`, `"timeout: …"`.
    pub reason: String,
    /// When it was written.
    pub dumped_at_us: u64,
    /// How many calls the ring holds at most.
    pub capacity: usize,
    /// How many calls were ever recorded; the ring holds the last `entries.len()`.
    pub recorded: u64,
    /// The recorded calls, oldest first.
    pub entries: Vec<FlightEntry>,
}

impl FlightDump {
    /// A dump with no entries, with this process's pid and an empty host (for tests and
    /// for groups that have issued nothing yet).
    pub fn empty(rank: usize, world_size: usize, group: &str, reason: &str) -> FlightDump {
        FlightDump {
            format: FORMAT_VERSION,
            rank,
            world_size,
            group: group.into(),
            backend: String::new(),
            transport: String::new(),
            host: String::new(),
            pid: std::process::id(),
            reason: reason.into(),
            dumped_at_us: 0,
            capacity: 0,
            recorded: 0,
            entries: Vec::new(),
        }
    }

    /// How the rank's part in the group ended, as the dump's [`reason`](Self::reason)
    /// says.
    ///
    /// ```
    /// use ringccl_observe::flight::dump::{Ending, FlightDump};
    ///
    /// let ending = |reason| FlightDump::empty(0, 2, "main", reason).ending();
    /// assert_eq!(ending("requested"), Ending::NotBroken);
    /// assert_eq!(ending("timeout: all_reduce op #5 timed out"), Ending::TimedOut);
    /// assert_eq!(ending("group broken: rank 1 aborted the group: lost rank 3"), Ending::Reacted);
    /// assert_eq!(ending("group broken: rank 0: lost rank 3"), Ending::Failed);
    /// ```
    pub fn ending(&self) -> Ending {
        let reason = self.reason.as_str();
        if reason.starts_with("timeout: ") {
            return Ending::TimedOut;
        }
        let Some(rest) = reason.strip_prefix("group broken: ") else {
            return Ending::NotBroken;
        };
        let reacted = rest
            .strip_prefix("rank ")
            .map(|r| r.trim_start_matches(|c: char| c.is_ascii_digit()))
            .is_some_and(|r| r.starts_with(" aborted the group"));
        if reacted {
            Ending::Reacted
        } else {
            Ending::Failed
        }
    }
}

/// How a rank's part in a group ended, as its dump's reason says ([`FlightDump::ending`]).
/// A break's dump gives `"timeout: …"` when the rank's own deadline passed, `"group
/// broken: rank N aborted the group: …"` when a peer's abort stopped it, and `"group
/// broken: …"` for any other error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Not a break: a dump on request, or a reason this build does not know.
    NotBroken,
    /// Its own deadline passed while it waited in the call (`"timeout: …"`).
    TimedOut,
    /// A peer's abort stopped it (`"group broken: rank N aborted the group: …"`): what it
    /// was doing then is where it waited, not a failure of its own.
    Reacted,
    /// Its own error broke the group (a mismatch, a lost peer, a panic, …).
    Failed,
}

/// Where a recorded call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Issued, waiting behind earlier calls.
    Queued,
    /// Moving data now.
    Running,
    /// Handed to a device without a wait (NCCL has it on its stream); the device has
    /// not finished it yet. Format 2.
    OnDevice,
    /// Finished with `Ok`.
    Done,
    /// Finished with an error (see [`FlightEntry::error`]).
    Failed,
}

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlightEntry {
    /// The call's position among every call issued on this rank and group, from 1.
    pub call: u64,
    /// The collective's sequence number on the wire ("op #"), once it has started; for
    /// point-to-point calls, the message's number on its pair.
    pub op: Option<u64>,
    /// `"all_reduce"`, `"broadcast"`, `"barrier"`, `"send"`, `"recv"`, …
    pub kind: String,
    /// The call as error messages print it, e.g. `"all_reduce(sum, 1024 x f32)"`.
    pub description: String,
    /// Element type (`"f32"`, …), for calls that carry data.
    pub dtype: Option<String>,
    /// Elements in the caller's buffer.
    pub count: u64,
    /// Reduction operator (`"sum"`, …), for reducing calls.
    pub reduce_op: Option<String>,
    /// Root rank, for rooted calls; the peer, for point-to-point calls.
    pub root: Option<usize>,
    /// The schedule that ran it (`"ring"`, `"recursive_doubling"`, …), once started.
    pub algorithm: Option<String>,
    /// Where it is.
    pub state: CallState,
    /// When it was issued.
    pub issued_us: u64,
    /// When it started moving data.
    pub started_us: Option<u64>,
    /// When it finished.
    pub ended_us: Option<u64>,
    /// Bytes exchanged with each peer it talked to (the first
    /// [`PEER_SLOTS`](crate::flight::PEER_SLOTS) peers of the call, in the order it first
    /// moved bytes with them; see [`FlightEntry::other_peers`] for the rest).
    pub peers: Vec<PeerBytes>,
    /// Bytes exchanged with the peers beyond the first
    /// [`PEER_SLOTS`](crate::flight::PEER_SLOTS), summed: only calls that talk to more
    /// peers than that (an all-to-all of more than 9 ranks, a barrier of more than 16)
    /// have it. Absent from files that do not need it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_peers: Option<OtherPeers>,
    /// The peer it is blocked on at the moment of the dump, if running and waiting.
    pub blocked_on: Option<usize>,
    /// The error, if it failed.
    pub error: Option<String>,
}

/// Bytes one call exchanged with one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerBytes {
    /// The peer's rank.
    pub peer: usize,
    /// Bytes sent to it.
    pub sent: u64,
    /// Bytes received from it.
    pub received: u64,
}

/// Bytes one call exchanged with the peers that did not get a [`PeerBytes`] of their own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OtherPeers {
    /// Bytes sent to them, together.
    pub sent: u64,
    /// Bytes received from them, together.
    pub received: u64,
}
