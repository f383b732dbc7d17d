//! What the diagnosis found, in structured form (the text is made from it by `report`).

use super::evidence::RankExit;

/// A recorded call, as the diagnosis names it.
///
/// ```
/// use ringccl_tools::diagnose::CallRef;
///
/// let call = CallRef { call: 17, op: Some(17), kind: "all_reduce".into(), description: "all_reduce(sum, 1024 x f32)".into() };
/// assert_eq!(call.label(), "op #17 all_reduce(sum, 1024 x f32)");
/// assert_eq!(call.short(), "op #17");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRef {
    /// Its position among the rank's calls in the group, from 1.
    pub call: u64,
    /// Its sequence number on the wire, once started (collectives only).
    pub op: Option<u64>,
    /// `"all_reduce"`, `"send"`, …; empty when only a beacon told of it.
    pub kind: String,
    /// `"all_reduce(sum, 1024 x f32)"`; empty when only a beacon told of it.
    pub description: String,
}

impl CallRef {
    /// Whether it is a point-to-point call, whose number counts messages on its pair,
    /// not the group's collectives.
    pub fn is_point_to_point(&self) -> bool {
        matches!(self.kind.as_str(), "send" | "recv" | "send/recv")
    }

    /// The group-wide op number: collectives only.
    pub fn group_op(&self) -> Option<u64> {
        if self.is_point_to_point() {
            None
        } else {
            self.op
        }
    }

    /// `"op #17 all_reduce(sum, 1024 x f32)"`, `"call #9 send(tag=0, 4 x f32)"`, `"op #17"`.
    pub fn label(&self) -> String {
        let number = self.short_number();
        if self.description.is_empty() {
            number
        } else {
            format!("{number} {}", self.description)
        }
    }

    /// `"op #17"` for a collective; the whole label for other calls.
    pub fn short(&self) -> String {
        if self.group_op().is_some() {
            self.short_number()
        } else {
            self.label()
        }
    }

    fn short_number(&self) -> String {
        match self.group_op() {
            Some(op) => format!("op #{op}"),
            None => format!("call #{}", self.call),
        }
    }
}

/// What a rank that others wait for is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Suspect {
    /// Not in any call: busy outside ringccl, or it skipped the call the others are in.
    Idle {
        /// Its last finished call (`None`: none, or only a beacon told of it).
        last_finished: Option<CallRef>,
        /// How many calls it finished, when only its beacon is known.
        finished_calls: Option<u64>,
        /// When its last call finished (µs since the Unix epoch).
        last_seen_us: Option<u64>,
        /// Whether its process is alive, where the launcher knows.
        alive: Option<bool>,
    },
    /// Its process ended.
    Exited {
        /// How and when.
        exit: RankExit,
        /// Its last finished call.
        last_finished: Option<CallRef>,
        /// How many calls it finished, when only its beacon is known.
        finished_calls: Option<u64>,
        /// The call it was in, if its dump shows one.
        in_call: Option<CallRef>,
    },
    /// Inside a call but not waiting for any peer (computing, or between two waits).
    Busy {
        /// The call.
        call: CallRef,
        /// Since when it runs (µs since the Unix epoch).
        since_us: Option<u64>,
    },
    /// It issued a call that has not started.
    Queued {
        /// The call.
        call: CallRef,
    },
    /// Its call failed.
    Failed {
        /// The call.
        call: CallRef,
        /// The error.
        error: String,
    },
    /// Neither a dump nor a beacon of it was found.
    NoData {
        /// Whether its process is alive, where the launcher knows.
        alive: Option<bool>,
    },
    /// It runs on another node, whose files this diagnosis does not see.
    Elsewhere,
}

/// A rank named as the reason others wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Culprit {
    /// The rank.
    pub rank: usize,
    /// What it is doing.
    pub state: Suspect,
}

/// One thing the diagnosis found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Ranks called different collectives (or sizes) at the same op number.
    Mismatch {
        /// The op number.
        op: u64,
        /// Each description, with the ranks that called it.
        calls: Vec<(String, Vec<usize>)>,
    },
    /// Ranks wait inside a call; `culprits` is where their waiting leads.
    Waiting {
        /// The call (of the lowest waiting rank).
        call: CallRef,
        /// The waiting ranks.
        waiters: Vec<usize>,
        /// Who they wait for, at the end of each chain; empty when no one was found.
        culprits: Vec<Culprit>,
        /// For each waiter that waits through others: waiter, ..., culprit.
        chains: Vec<Vec<usize>>,
    },
    /// Ranks whose call failed (the group broke).
    Failed {
        /// The call (of the lowest failed rank).
        call: CallRef,
        /// The failed ranks.
        ranks: Vec<usize>,
        /// The lowest failed rank's error.
        error: String,
        /// Ranks behind them (idle, exited, without a dump).
        culprits: Vec<Culprit>,
    },
    /// Ranks wait for each other in a circle.
    Cycle {
        /// Each rank of the circle with the call it waits in, in waiting order.
        ranks: Vec<(usize, CallRef)>,
    },
    /// A rank's process ended unsuccessfully (not already named as a culprit).
    Exited {
        /// The rank.
        rank: usize,
        /// How and when.
        exit: RankExit,
        /// Its last finished call.
        last_finished: Option<CallRef>,
    },
}

impl Finding {
    /// Whether it names a cause: a rank, a mismatch, a failure, a circle.
    pub fn names_a_cause(&self) -> bool {
        match self {
            Finding::Waiting { culprits, .. } => !culprits.is_empty(),
            _ => true,
        }
    }
}

/// What was found for one group (the one made by `init_process_group`, or a group formed
/// from it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupDiagnosis {
    /// `"main"` or the formed group's name.
    pub group: String,
    /// Its number of ranks.
    pub world_size: usize,
    /// Most important first.
    pub findings: Vec<Finding>,
    /// Ranks expected here with neither dump nor beacon.
    pub missing: Vec<usize>,
    /// Whether any rank has a call queued or running.
    pub in_flight: bool,
    /// The last finished call seen in the group: rank, call, end time.
    pub last_progress: Option<(usize, CallRef, u64)>,
}

/// The diagnosis of a job: see [`diagnose`](super::diagnose).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    /// One per group that has dumps; the group made by `init_process_group` first.
    pub groups: Vec<GroupDiagnosis>,
    /// About the evidence: files skipped, ranks not seen.
    pub notes: Vec<String>,
    /// The job-wide ranks this diagnosis covers when they are not all (multi-node).
    pub local_ranks: Option<Vec<usize>>,
    /// When it was made (µs since the Unix epoch).
    pub now_us: u64,
}

impl Diagnosis {
    /// Whether it names a cause (a rank, a mismatch, a failure) rather than only
    /// describing what it saw.
    pub fn found_cause(&self) -> bool {
        self.groups
            .iter()
            .any(|g| g.findings.iter().any(Finding::names_a_cause))
    }

    /// The most important finding of all groups, if any.
    pub fn first_finding(&self) -> Option<&Finding> {
        self.groups.iter().find_map(|g| g.findings.first())
    }
}
