//! One rank's situation in one group, from its dump (or, without one, its beacon) and
//! the launcher's view of its process.

use ringccl::flight::beacon::Beacon;
use ringccl::flight::dump::{CallState, Ending, FlightDump, FlightEntry};

use super::evidence::{RankExit, RankProcess};
use super::finding::CallRef;

/// What a rank is doing with respect to ringccl.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Activity {
    /// Inside a running call, waiting for `peer` if known.
    Running {
        call: CallRef,
        peer: Option<usize>,
        since_us: Option<u64>,
    },
    /// Its oldest unfinished call has not started.
    Queued { call: CallRef },
    /// Its first call since the last success failed, and nothing is in flight.
    Failed { call: CallRef, error: String },
    /// No call in flight.
    Idle,
    /// Nothing known (no dump, no beacon).
    Unknown,
}

/// Where the launcher puts the rank's process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Process {
    /// No launcher (offline diagnosis).
    Unknown,
    Running,
    Exited(RankExit),
    /// Not started by this launcher: on another node.
    Elsewhere,
}

impl Process {
    pub(super) fn from_launcher(known: Option<Option<&RankProcess>>) -> Process {
        match known {
            None => Process::Unknown,
            Some(None) => Process::Elsewhere,
            Some(Some(RankProcess::Running)) => Process::Running,
            Some(Some(RankProcess::Exited(exit))) => Process::Exited(exit.clone()),
        }
    }

    pub(super) fn alive(&self) -> Option<bool> {
        match self {
            Process::Running => Some(true),
            Process::Exited(_) => Some(false),
            Process::Unknown | Process::Elsewhere => None,
        }
    }
}

/// One rank in one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RankView {
    pub(super) rank: usize,
    pub(super) activity: Activity,
    pub(super) last_finished: Option<CallRef>,
    /// Calls finished, when only the beacon is known.
    pub(super) finished_calls: Option<u64>,
    pub(super) last_end_us: Option<u64>,
    pub(super) process: Process,
    /// Whether a dump or beacon was found.
    pub(super) seen: bool,
    /// How its dump says its part in the group ended (not broken for a dump on request,
    /// a beacon, or nothing).
    pub(super) ending: Ending,
}

pub(super) fn call_ref(entry: &FlightEntry) -> CallRef {
    CallRef {
        call: entry.call,
        op: entry.op,
        kind: entry.kind.clone(),
        description: entry.description.clone(),
    }
}

impl RankView {
    /// A rank of which nothing is known but its process.
    pub(super) fn unseen(rank: usize, process: Process) -> RankView {
        RankView {
            rank,
            activity: Activity::Unknown,
            last_finished: None,
            finished_calls: None,
            last_end_us: None,
            process,
            seen: false,
            ending: Ending::NotBroken,
        }
    }

    /// From the rank's dump.
    pub(super) fn from_dump(dump: &FlightDump, process: Process) -> RankView {
        let mut entries: Vec<&FlightEntry> = dump.entries.iter().collect();
        entries.sort_by_key(|e| e.call);
        let finished = |e: &FlightEntry| matches!(e.state, CallState::Done | CallState::Failed);
        let last_finished = entries.iter().rev().find(|e| finished(e)).copied();
        let last_done_call = entries
            .iter()
            .rev()
            .find(|e| e.state == CallState::Done)
            .map_or(0, |e| e.call);
        let unfinished = entries.iter().find(|e| !finished(e));
        // A call still on the device (NCCL's stream-ordered calls) is one the rank is in:
        // the oldest such call or running one is where it waits (a host call behind a
        // call on the device waits for it first).
        let running = entries
            .iter()
            .find(|e| matches!(e.state, CallState::Running | CallState::OnDevice));
        let first_failure = entries
            .iter()
            .find(|e| e.state == CallState::Failed && e.call > last_done_call);
        let activity = match (running, unfinished, first_failure) {
            (Some(e), _, _) => Activity::Running {
                call: call_ref(e),
                peer: e.blocked_on.filter(|&p| p != dump.rank),
                since_us: e.started_us.or(Some(e.issued_us)),
            },
            (None, Some(e), _) => Activity::Queued { call: call_ref(e) },
            (None, None, Some(e)) => Activity::Failed {
                call: call_ref(e),
                error: e
                    .error
                    .clone()
                    .unwrap_or_else(|| "no error recorded".into()),
            },
            (None, None, None) => Activity::Idle,
        };
        RankView {
            rank: dump.rank,
            activity,
            last_finished: last_finished.map(call_ref),
            finished_calls: None,
            last_end_us: last_finished.and_then(|e| e.ended_us),
            process,
            seen: true,
            ending: dump.ending(),
        }
    }

    /// From the rank's beacon alone (its dump is missing).
    pub(super) fn from_beacon(rank: usize, beacon: &Beacon, process: Process) -> RankView {
        let activity = if beacon.issued > beacon.finished {
            let call = CallRef {
                call: beacon.finished.saturating_add(1),
                op: (beacon.current_op != 0).then_some(beacon.current_op),
                kind: String::new(),
                description: String::new(),
            };
            if beacon.current_op != 0 {
                Activity::Running {
                    call,
                    peer: beacon
                        .blocked_on
                        .and_then(|p| usize::try_from(p).ok())
                        .filter(|&p| p != rank),
                    since_us: (beacon.current_since_us != 0).then_some(beacon.current_since_us),
                }
            } else {
                Activity::Queued { call }
            }
        } else {
            Activity::Idle
        };
        RankView {
            rank,
            activity,
            last_finished: None,
            finished_calls: Some(beacon.finished),
            last_end_us: (beacon.last_finished_us != 0).then_some(beacon.last_finished_us),
            process,
            seen: true,
            ending: Ending::NotBroken,
        }
    }

    /// Whether it waits (or, ended, waited to the last) on its own account: a rank in a
    /// call, alive or with a final record of a wait that ended at its own deadline. A
    /// rank a peer's abort stopped only reacted: it starts no chain of waits (it is
    /// passed through, [`RankView::waited_to_the_end`]).
    pub(super) fn waits(&self) -> bool {
        matches!(self.activity, Activity::Running { .. })
            && self.ending != Ending::Reacted
            && (!matches!(self.process, Process::Exited(_)) || self.ending == Ending::TimedOut)
    }

    /// Whether its record shows where it waited when it stopped: in a call and alive, or
    /// ended with the record of a wait (its deadline passed, or a peer's abort stopped
    /// it). Such a rank passes a chain of waits on; one that died otherwise ends it.
    pub(super) fn waited_to_the_end(&self) -> bool {
        matches!(self.activity, Activity::Running { .. })
            && (!matches!(self.process, Process::Exited(_))
                || matches!(self.ending, Ending::TimedOut | Ending::Reacted))
    }

    /// The group-wide op number of its last finished collective.
    pub(super) fn last_op(&self) -> Option<u64> {
        self.last_finished.as_ref().and_then(CallRef::group_op)
    }
}
