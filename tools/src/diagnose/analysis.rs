//! The analysis of one group: mismatched calls, who waits for whom (following chains of
//! waiting ranks to the one that holds them up), failed calls and ended processes.

use std::collections::{BTreeMap, BTreeSet};

use ringccl::flight::dump::{CallState, FlightDump};

use super::finding::{CallRef, Culprit, Finding, GroupDiagnosis, Suspect};
use super::rank_view::{call_ref, Activity, Process, RankView};

/// One group's evidence, ready for analysis.
#[derive(Debug)]
pub(super) struct GroupEvidence<'a> {
    pub(super) name: String,
    pub(super) world_size: usize,
    /// The ranks expected to have left files.
    pub(super) expected: BTreeSet<usize>,
    pub(super) dumps: BTreeMap<usize, &'a FlightDump>,
    pub(super) views: BTreeMap<usize, RankView>,
}

/// Analyses one group.
pub(super) fn analyse(group: &GroupEvidence<'_>) -> GroupDiagnosis {
    let mut findings = Vec::new();
    let mismatches = mismatches(group);
    let mismatched_ops: BTreeSet<u64> = mismatches
        .iter()
        .filter_map(|f| match f {
            Finding::Mismatch { op, .. } => Some(*op),
            _ => None,
        })
        .collect();
    findings.extend(mismatches);
    let (waiting, cycles, named) = waiting(group);
    findings.extend(waiting);
    findings.extend(cycles);
    let mut named = named;
    findings.extend(failures(group, &mismatched_ops, &mut named));
    for view in group.views.values() {
        if let Process::Exited(exit) = &view.process {
            if !exit.success && !named.contains(&view.rank) {
                findings.push(Finding::Exited {
                    rank: view.rank,
                    exit: exit.clone(),
                    last_finished: view.last_finished.clone(),
                });
            }
        }
    }
    findings.sort_by_key(priority);
    let missing = group
        .expected
        .iter()
        .copied()
        .filter(|r| !group.views.get(r).is_some_and(|v| v.seen))
        .collect();
    let in_flight = group.views.values().any(|v| {
        matches!(
            v.activity,
            Activity::Running { .. } | Activity::Queued { .. }
        )
    });
    let last_progress = group
        .views
        .values()
        .filter_map(|v| Some((v.rank, v.last_finished.clone()?, v.last_end_us?)))
        .max_by(|a, b| a.2.cmp(&b.2).then(b.0.cmp(&a.0)));
    GroupDiagnosis {
        group: group.name.clone(),
        world_size: group.world_size,
        findings,
        missing,
        in_flight,
        last_progress,
    }
}

/// Most important first: a mismatch explains everything after it; a dead rank explains
/// the waits on it.
fn priority(finding: &Finding) -> u8 {
    let blames_exit = |culprits: &[Culprit]| {
        culprits
            .iter()
            .any(|c| matches!(c.state, Suspect::Exited { .. }))
    };
    match finding {
        Finding::Mismatch { .. } => 0,
        Finding::Waiting { culprits, .. } if blames_exit(culprits) => 1,
        Finding::Failed { culprits, .. } if blames_exit(culprits) => 1,
        Finding::Waiting { culprits, .. } if !culprits.is_empty() => 2,
        Finding::Cycle { .. } => 3,
        Finding::Failed { .. } => 4,
        Finding::Exited { .. } => 5,
        Finding::Waiting { .. } => 6,
    }
}

/// Ops at which ranks recorded different collectives.
fn mismatches(group: &GroupEvidence<'_>) -> Vec<Finding> {
    let mut by_op: BTreeMap<u64, BTreeMap<&str, BTreeSet<usize>>> = BTreeMap::new();
    for (&rank, dump) in &group.dumps {
        for entry in &dump.entries {
            let call = call_ref(entry);
            if let (Some(op), false) = (call.group_op(), entry.state == CallState::Queued) {
                by_op
                    .entry(op)
                    .or_default()
                    .entry(entry.description.as_str())
                    .or_default()
                    .insert(rank);
            }
        }
    }
    by_op
        .into_iter()
        .filter(|(_, calls)| calls.len() > 1)
        .map(|(op, calls)| {
            let mut calls: Vec<(String, Vec<usize>)> = calls
                .into_iter()
                .map(|(desc, ranks)| (desc.to_string(), ranks.into_iter().collect()))
                .collect();
            // The call most ranks agree on first; the odd one out after.
            calls.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1.cmp(&b.1)));
            Finding::Mismatch { op, calls }
        })
        .collect()
}

/// Where one waiting rank's chain ends.
enum ChainEnd {
    /// At these ranks (more than one only when guessed from who is behind).
    Culprits(Vec<Culprit>),
    /// In a circle of waiting ranks (in waiting order).
    Cycle(Vec<usize>),
    /// Nowhere: no rank is seen behind.
    Unknown,
}

/// The `Waiting` findings (grouped by call and culprits), the circles, and every rank
/// named as a culprit.
fn waiting(group: &GroupEvidence<'_>) -> (Vec<Finding>, Vec<Finding>, BTreeSet<usize>) {
    // (call label, culprit ranks) -> (first call, waiters, culprits, chains)
    type Key = (String, Vec<usize>);
    type Slot = (CallRef, Vec<usize>, Vec<Culprit>, Vec<Vec<usize>>);
    let mut groups: BTreeMap<Key, Slot> = BTreeMap::new();
    let mut cycles: BTreeSet<Vec<usize>> = BTreeSet::new();
    let mut named = BTreeSet::new();
    for view in group.views.values() {
        let Activity::Running { call, .. } = &view.activity else {
            continue;
        };
        // A rank that ended no longer waits (its dump shows where it died), unless its
        // last record is of the wait its own deadline ended: that record is final. A rank
        // a peer's abort stopped only reacted.
        if !view.waits() {
            continue;
        }
        let (end, path) = follow(group, view.rank);
        let culprits = match end {
            ChainEnd::Cycle(circle) => {
                cycles.insert(canonical(circle));
                continue;
            }
            ChainEnd::Culprits(culprits) => culprits,
            ChainEnd::Unknown => Vec::new(),
        };
        named.extend(culprits.iter().map(|c| c.rank));
        let key = (call.label(), culprits.iter().map(|c| c.rank).collect());
        let slot = groups
            .entry(key)
            .or_insert_with(|| (call.clone(), Vec::new(), culprits, Vec::new()));
        slot.1.push(view.rank);
        if path.len() > 2 {
            slot.3.push(path);
        }
    }
    let waiting = groups
        .into_values()
        .map(|(call, waiters, culprits, chains)| Finding::Waiting {
            call,
            waiters,
            culprits,
            chains,
        })
        .collect();
    let cycles = cycles
        .into_iter()
        .map(|circle| Finding::Cycle {
            ranks: circle
                .into_iter()
                .filter_map(|r| match &group.views.get(&r)?.activity {
                    Activity::Running { call, .. } => Some((r, call.clone())),
                    _ => None,
                })
                .collect(),
        })
        .collect();
    (waiting, cycles, named)
}

/// A circle started at its lowest rank, so each circle is found once.
fn canonical(mut circle: Vec<usize>) -> Vec<usize> {
    if let Some(at) = circle
        .iter()
        .enumerate()
        .min_by_key(|(_, r)| **r)
        .map(|(i, _)| i)
    {
        circle.rotate_left(at);
    }
    circle
}

/// Follows "waits for" from `start` to the rank that holds the chain up; returns the
/// end and the path (start, ..., culprit).
fn follow(group: &GroupEvidence<'_>, start: usize) -> (ChainEnd, Vec<usize>) {
    let mut path = vec![start];
    let mut current = start;
    // Every step visits a new rank, so the walk ends within the group's size.
    loop {
        let Some(view) = group.views.get(&current) else {
            return (ChainEnd::Unknown, path);
        };
        let next = match &view.activity {
            Activity::Running {
                peer: Some(peer), ..
            } => *peer,
            Activity::Running { call, since_us, .. } => {
                // Not waiting for a peer right now. The waiting starter: look for ranks
                // behind it. A rank others wait on: it is the one holding them up,
                // unless it is itself held up by a rank behind.
                let behind = behind(group, view.rank, call);
                if !behind.is_empty() {
                    if current != start {
                        path.push(behind[0].rank);
                    }
                    return (ChainEnd::Culprits(behind), path);
                }
                if current == start {
                    return (ChainEnd::Unknown, path);
                }
                let busy = Culprit {
                    rank: current,
                    state: Suspect::Busy {
                        call: call.clone(),
                        since_us: *since_us,
                    },
                };
                return (ChainEnd::Culprits(vec![busy]), path);
            }
            _ if current != start => {
                return (ChainEnd::Culprits(vec![suspect(group, current)]), path);
            }
            _ => return (ChainEnd::Unknown, path),
        };
        if let Some(at) = path.iter().position(|&r| r == next) {
            return (ChainEnd::Cycle(path.split_off(at)), path);
        }
        path.push(next);
        match group.views.get(&next) {
            Some(v) if v.waited_to_the_end() => current = next,
            _ => return (ChainEnd::Culprits(vec![suspect(group, next)]), path),
        }
    }
}

/// The ranks behind a rank that is in `call`: not in any call (idle, ended, unseen) and
/// not past it. They are what a waiting rank with no named peer waits for.
fn behind(group: &GroupEvidence<'_>, rank: usize, call: &CallRef) -> Vec<Culprit> {
    let op = call.group_op();
    let all: Vec<Culprit> = group
        .expected
        .iter()
        .chain(group.views.keys())
        .copied()
        .collect::<BTreeSet<usize>>()
        .into_iter()
        .filter(|&r| r != rank)
        .filter(|r| {
            let Some(view) = group.views.get(r) else {
                return true;
            };
            let not_past = match (op, view.last_op()) {
                (Some(op), Some(last)) => last < op,
                _ => true,
            };
            not_past
                && (matches!(view.process, Process::Exited(_))
                    || matches!(
                        view.activity,
                        Activity::Idle | Activity::Unknown | Activity::Queued { .. }
                    ))
        })
        .map(|r| suspect(group, r))
        .collect();
    // Ranks seen idle or ended explain more than ranks not seen at all.
    let seen: Vec<Culprit> = all
        .iter()
        .filter(|c| !matches!(c.state, Suspect::NoData { .. } | Suspect::Elsewhere))
        .cloned()
        .collect();
    if seen.is_empty() {
        all
    } else {
        seen
    }
}

/// What rank `rank` is doing, as the one others wait for.
fn suspect(group: &GroupEvidence<'_>, rank: usize) -> Culprit {
    let Some(view) = group.views.get(&rank) else {
        return Culprit {
            rank,
            state: Suspect::NoData { alive: None },
        };
    };
    let in_call = match &view.activity {
        Activity::Running { call, .. } | Activity::Queued { call } => Some(call.clone()),
        Activity::Failed { call, .. } => Some(call.clone()),
        Activity::Idle | Activity::Unknown => None,
    };
    let state = match (&view.process, &view.activity) {
        (Process::Exited(exit), _) => Suspect::Exited {
            exit: exit.clone(),
            last_finished: view.last_finished.clone(),
            finished_calls: view.finished_calls,
            in_call,
        },
        (Process::Elsewhere, Activity::Unknown) => Suspect::Elsewhere,
        (process, Activity::Unknown) => Suspect::NoData {
            alive: process.alive(),
        },
        (process, Activity::Idle) => Suspect::Idle {
            last_finished: view.last_finished.clone(),
            finished_calls: view.finished_calls,
            last_seen_us: view.last_end_us,
            alive: process.alive(),
        },
        (_, Activity::Queued { call }) => Suspect::Queued { call: call.clone() },
        (_, Activity::Failed { call, error }) => Suspect::Failed {
            call: call.clone(),
            error: error.clone(),
        },
        (_, Activity::Running { call, since_us, .. }) => Suspect::Busy {
            call: call.clone(),
            since_us: *since_us,
        },
    };
    Culprit { rank, state }
}

/// Failed calls, grouped by call, with the ranks behind them; calls at a mismatched op
/// are left to the mismatch finding.
fn failures(
    group: &GroupEvidence<'_>,
    mismatched_ops: &BTreeSet<u64>,
    named: &mut BTreeSet<usize>,
) -> Vec<Finding> {
    let mut by_call: BTreeMap<String, (CallRef, Vec<usize>, String)> = BTreeMap::new();
    for view in group.views.values() {
        let Activity::Failed { call, error } = &view.activity else {
            continue;
        };
        if call
            .group_op()
            .is_some_and(|op| mismatched_ops.contains(&op))
        {
            continue;
        }
        by_call
            .entry(call.label())
            .or_insert_with(|| (call.clone(), Vec::new(), error.clone()))
            .1
            .push(view.rank);
    }
    by_call
        .into_values()
        .map(|(call, ranks, error)| {
            let culprits: Vec<Culprit> = behind(group, ranks[0], &call)
                .into_iter()
                .filter(|c| !ranks.contains(&c.rank))
                .collect();
            named.extend(culprits.iter().map(|c| c.rank));
            Finding::Failed {
                call,
                ranks,
                error,
                culprits,
            }
        })
        .collect()
}
