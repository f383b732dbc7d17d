//! What the diagnosis works from: every rank's dump and beacon, and what the launcher
//! knows about the ranks' processes.

use std::collections::BTreeMap;

use ringccl::flight::beacon::Beacon;
use ringccl::flight::dump::FlightDump;

/// How a rank's process ended, as the launcher saw it.
///
/// ```
/// use ringccl_tools::diagnose::RankExit;
///
/// let exit = RankExit { status: "exit code 3".into(), success: false, at_us: 1_000_000 };
/// assert!(!exit.success);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankExit {
    /// How it ended, in words: `"exit code 3"`, `"killed by signal 9 (SIGKILL)"`.
    pub status: String,
    /// Whether it exited with status 0.
    pub success: bool,
    /// When the launcher saw it end (µs since the Unix epoch).
    pub at_us: u64,
}

/// A rank's process, as the launcher sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankProcess {
    /// Still running.
    Running,
    /// Ended.
    Exited(RankExit),
}

/// One rank's beacon, read from `rank-<rank>[.<group tag>].beacon`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeaconReading {
    /// The rank, from the file's name.
    pub rank: usize,
    /// The reading.
    pub beacon: Beacon,
}

/// Everything the diagnosis looks at.
///
/// ```
/// use ringccl_tools::diagnose::Evidence;
/// use ringccl::flight::dump::FlightDump;
///
/// let mut evidence = Evidence::at(5_000_000);
/// evidence.dumps.push(FlightDump::empty(0, 2, "main", "requested"));
/// assert_eq!(evidence.dumps.len(), 1);
/// assert!(evidence.launcher.is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// Every rank's dump (of every group); the newest per rank and group counts.
    pub dumps: Vec<FlightDump>,
    /// Beacons of the group made by `init_process_group`, for ranks whose dump is missing.
    pub beacons: Vec<BeaconReading>,
    /// The launcher's view of the ranks it started, by job-wide rank; `None` offline.
    /// Ranks of the job missing from the map run elsewhere (another node).
    pub launcher: Option<BTreeMap<usize, RankProcess>>,
    /// Files that were skipped, and why (unreadable, another version, stale).
    pub notes: Vec<String>,
    /// The time of the diagnosis (µs since the Unix epoch).
    pub now_us: u64,
}

impl Evidence {
    /// No evidence yet, diagnosed at `now_us`.
    pub fn at(now_us: u64) -> Evidence {
        Evidence {
            now_us,
            ..Evidence::default()
        }
    }
}
