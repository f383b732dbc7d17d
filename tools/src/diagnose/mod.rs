//! Diagnosis across ranks: from every rank's flight dump (and beacon), and what the
//! launcher knows of the ranks' processes, says who is stuck where and why, in one text.
//! `ringrun diagnose DIR` runs it on a flight directory; `ringrun --hang-timeout` runs it
//! when a job stops making progress.
//!
//! It names, most important first:
//! - ranks that called different collectives (or sizes) at the same op number;
//! - ranks waiting inside a call, following "rank 0 waits for 1, 1 waits for 2" to the
//!   rank holding them up, and what that rank does: nothing (`last finished op #16 and
//!   has issued nothing since`), ended (with its exit status), busy inside a call;
//! - ranks waiting for each other in a circle;
//! - failed calls, and ranks whose process failed.
//!
//! ```
//! use ringccl_tools::diagnose::{diagnose, Evidence};
//!
//! let diagnosis = diagnose(&Evidence::at(0));
//! assert!(!diagnosis.found_cause());
//! assert!(diagnosis.to_string().contains("no flight dump"));
//! ```

mod analysis;
mod evidence;
mod finding;
mod load;
mod rank_view;
mod report;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

pub use evidence::{BeaconReading, Evidence, RankExit, RankProcess};
pub use finding::{CallRef, Culprit, Diagnosis, Finding, GroupDiagnosis, Suspect};
pub use load::{load_dir, modified_us, read_beacon, read_dump, scan, FlightFile, FlightFileKind};
pub use report::rank_list;

use analysis::GroupEvidence;
use rank_view::{Process, RankView};
use ringccl::flight::dump::FlightDump;
use ringccl::flight::MAIN_GROUP;
/// Larger groups get no list of expected ranks (only the ranks seen count).
const MAX_EXPECTED: usize = 1 << 16;

/// Diagnoses a job from its evidence; see the module documentation.
///
/// ```
/// use ringccl_tools::diagnose::{diagnose, Evidence};
/// use ringccl::flight::dump::FlightDump;
///
/// let mut evidence = Evidence::at(10_000_000);
/// evidence.dumps.push(FlightDump::empty(0, 2, "main", "requested"));
/// let diagnosis = diagnose(&evidence);
/// assert_eq!(diagnosis.groups[0].missing, [1]);
/// ```
pub fn diagnose(evidence: &Evidence) -> Diagnosis {
    let mut notes = evidence.notes.clone();
    // The newest dump per group and rank.
    let mut by_group: BTreeMap<&str, BTreeMap<usize, &FlightDump>> = BTreeMap::new();
    for dump in &evidence.dumps {
        let slot = by_group
            .entry(dump.group.as_str())
            .or_default()
            .entry(dump.rank)
            .or_insert(dump);
        if dump.dumped_at_us > slot.dumped_at_us {
            *slot = dump;
        }
    }
    // Job-wide ranks by process, to carry the launcher's view over to formed groups.
    let rank_of_pid: BTreeMap<u64, usize> = by_group
        .get(MAIN_GROUP)
        .into_iter()
        .flat_map(|dumps| dumps.values().map(|d| (u64::from(d.pid), d.rank)))
        .chain(evidence.beacons.iter().map(|b| (b.beacon.pid, b.rank)))
        .collect();
    let launcher_of = |job_rank: Option<usize>| -> Process {
        match (&evidence.launcher, job_rank) {
            (None, _) | (Some(_), None) => Process::Unknown,
            (Some(known), Some(rank)) => Process::from_launcher(Some(known.get(&rank))),
        }
    };
    let mut groups = Vec::new();
    let main_has_evidence = by_group.contains_key(MAIN_GROUP) || !evidence.beacons.is_empty();
    let mut names: Vec<&str> = by_group.keys().copied().collect();
    names.sort_by_key(|name| (*name != MAIN_GROUP, *name));
    if main_has_evidence && !names.contains(&MAIN_GROUP) {
        names.insert(0, MAIN_GROUP);
    }
    let mut local_ranks = None;
    for name in names {
        let dumps = by_group.get(name).cloned().unwrap_or_default();
        let is_main = name == MAIN_GROUP;
        let sizes: BTreeSet<usize> = dumps.values().map(|d| d.world_size).collect();
        if sizes.len() > 1 {
            notes.push(format!(
                "the dumps of group {name} disagree on its size ({}); the largest counts",
                rank_list(&sizes.iter().copied().collect::<Vec<_>>())
            ));
        }
        let beacons: BTreeMap<usize, _> = if is_main {
            evidence
                .beacons
                .iter()
                .map(|b| (b.rank, b.beacon))
                .collect()
        } else {
            BTreeMap::new()
        };
        let launched: Vec<usize> = match (&evidence.launcher, is_main) {
            (Some(known), true) => known.keys().copied().collect(),
            _ => Vec::new(),
        };
        let world_size = sizes
            .last()
            .copied()
            .or_else(|| {
                beacons
                    .keys()
                    .chain(launched.iter())
                    .max()
                    .map(|r| r.saturating_add(1))
            })
            .unwrap_or(0);
        let expected: BTreeSet<usize> = if is_main && evidence.launcher.is_some() {
            if launched.len() < world_size {
                local_ranks = Some(launched.clone());
            }
            launched
                .iter()
                .copied()
                .filter(|&r| r < world_size)
                .collect()
        } else if world_size <= MAX_EXPECTED {
            (0..world_size).collect()
        } else {
            dumps.keys().copied().collect()
        };
        let mut views = BTreeMap::new();
        for &rank in dumps.keys().chain(beacons.keys()).chain(expected.iter()) {
            if views.contains_key(&rank) {
                continue;
            }
            let job_rank = if is_main {
                Some(rank)
            } else {
                dumps
                    .get(&rank)
                    .and_then(|d| rank_of_pid.get(&u64::from(d.pid)).copied())
            };
            let process = launcher_of(job_rank);
            let view = match (dumps.get(&rank), beacons.get(&rank)) {
                (Some(dump), _) => RankView::from_dump(dump, process),
                (None, Some(beacon)) => RankView::from_beacon(rank, beacon, process),
                (None, None) => RankView::unseen(rank, process),
            };
            views.insert(rank, view);
        }
        if is_main {
            // The launcher's other ranks of the job (on other nodes) are known to be
            // elsewhere; only they are listed when someone waits for them.
            if let Some(known) = &evidence.launcher {
                for rank in 0..world_size.min(MAX_EXPECTED) {
                    if !known.contains_key(&rank) && !views.contains_key(&rank) {
                        views.insert(rank, RankView::unseen(rank, Process::Elsewhere));
                    }
                }
            }
        }
        let group = GroupEvidence {
            name: name.to_string(),
            world_size,
            expected,
            dumps,
            views,
        };
        groups.push(analysis::analyse(&group));
    }
    Diagnosis {
        groups,
        notes,
        local_ranks,
        now_us: evidence.now_us,
    }
}
