//! ringrun's diagnoses: when the hang watch sees a stall, or a rank fails, ringrun asks
//! every live rank for a fresh flight dump (SIGUSR1, which ringccl handles when
//! RINGCCL_FLIGHT_DIR is set), waits briefly for the files, adds what it knows of the
//! ranks' processes, and prints one diagnosis on stderr, each line starting with
//! `ringrun: DIAGNOSIS:`.
//!
//! A rank that exits while ringrun waits sends no fresh dump: its last one (the dump it
//! wrote as its call failed) is final, and is used as it is. So after a timeout, the
//! ranks that gave up and exited still show whom they waited for, and the diagnosis names
//! the rank they all waited for, as `ringrun diagnose DIR` does afterwards.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringccl_tools::diagnose::{
    diagnose, load_dir, modified_us, rank_list, read_beacon, read_dump, scan, Diagnosis, Evidence,
    FlightFileKind, RankExit, RankProcess,
};

use crate::args::HangAction;
use crate::hang_watch::{HangWatch, Stall};
use crate::process_group::{self, Pid};
use crate::spawn::Rank;
use crate::supervise;

/// What every diagnosis line starts with (after `ringrun: `).
pub(crate) const PREFIX: &str = "DIAGNOSIS:";
/// How long ringrun waits for the ranks' fresh dumps.
const DUMP_WAIT: Duration = Duration::from_secs(2);
const DUMP_POLL: Duration = Duration::from_millis(50);
/// File times come from a coarse clock that may lag the precise one a little.
const SLACK_US: u64 = 50_000;

/// Microseconds since the Unix epoch of `time`.
pub(crate) fn micros(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The hang watch of one run, and what to do when it fires.
#[derive(Debug)]
pub(crate) struct HangCheck {
    watch: HangWatch,
    dir: PathBuf,
    action: HangAction,
    timeout: Duration,
    not_before_us: u64,
    diagnosed: bool,
}

impl HangCheck {
    /// Watches `dir` for the run that starts now.
    pub(crate) fn new(dir: &Path, timeout: Duration, action: HangAction) -> HangCheck {
        let not_before_us = micros(SystemTime::now());
        HangCheck {
            watch: HangWatch::new(dir, timeout, not_before_us),
            dir: dir.to_path_buf(),
            action,
            timeout,
            not_before_us,
            diagnosed: false,
        }
    }

    /// Whether a diagnosis was printed for this run.
    pub(crate) fn diagnosed(&self) -> bool {
        self.diagnosed
    }

    /// Polls the watch; on a stall, prints a diagnosis. Returns whether the job must stop.
    pub(crate) fn tick(&mut self, ranks: &mut [Rank]) -> bool {
        let Some(Stall {
            idle_for,
            in_flight,
        }) = self.watch.poll()
        else {
            return false;
        };
        let mut main: Vec<usize> = in_flight
            .iter()
            .filter(|(_, tag)| tag.is_empty())
            .map(|(rank, _)| *rank)
            .collect();
        main.sort_unstable();
        main.dedup();
        let who = match main.as_slice() {
            [] => "ranks of a formed group have calls in flight".to_string(),
            [one] => format!("rank {one} has a call in flight"),
            many => format!("ranks {} have calls in flight", rank_list(many)),
        };
        let why = format!(
            "hang: no call has finished for {:.1} s (--hang-timeout {:.1} s) while {who}",
            idle_for.as_secs_f64(),
            self.timeout.as_secs_f64()
        );
        let diagnosis = gather(&self.dir, ranks, self.not_before_us);
        print(&why, &self.dir, &diagnosis);
        self.diagnosed = true;
        if self.action == HangAction::Stop {
            crate::say!("stopping the job (--hang-action stop)");
            return true;
        }
        false
    }

    /// After a rank failed: prints a diagnosis of the whole job, unless no rank left a
    /// flight record (a program that does not use ringccl).
    pub(crate) fn after_failure(&mut self, ranks: &mut [Rank], rank: usize) {
        let diagnosis = gather(&self.dir, ranks, self.not_before_us);
        if diagnosis.groups.is_empty() {
            return;
        }
        self.diagnosed = true;
        let why = format!("rank {rank} failed; what the flight records show:");
        print(&why, &self.dir, &diagnosis);
    }
}

/// Asks the live ranks for dumps, waits for them (at most [`DUMP_WAIT`]), and diagnoses.
fn gather(dir: &Path, ranks: &mut [Rank], not_before_us: u64) -> Diagnosis {
    let requested_us = micros(SystemTime::now());
    let mut awaited = request_dumps(dir, ranks, not_before_us);
    let deadline = Instant::now() + DUMP_WAIT;
    loop {
        // A fresh dump has come, or the process ended: its last dump is final.
        awaited.retain(|(path, pid)| {
            let ended = process_group::process_state(*pid)
                .is_none_or(|(state, _)| state == 'Z' || state == 'X');
            !ended && read_dump(path).map_or(true, |d| d.dumped_at_us < requested_us)
        });
        if awaited.is_empty() || Instant::now() >= deadline {
            break;
        }
        thread::sleep(DUMP_POLL);
    }
    let now_us = micros(SystemTime::now());
    let mut evidence = load_dir(dir, now_us, not_before_us).unwrap_or_else(|e| {
        let mut evidence = Evidence::at(now_us);
        evidence
            .notes
            .push(format!("cannot read {}: {e}", dir.display()));
        evidence
    });
    if !awaited.is_empty() {
        let names: Vec<String> = awaited
            .iter()
            .filter_map(|(p, _)| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect();
        evidence.notes.push(format!(
            "no fresh dump within {DUMP_WAIT:?} for {} (older files, or the beacon, were used)",
            names.join(", ")
        ));
    }
    evidence.launcher = Some(launcher_view(ranks));
    diagnose(&evidence)
}

/// Sends SIGUSR1 to every live process that keeps a beacon of this run in `dir`, belongs
/// to one of the ranks' process groups and handles SIGUSR1. Returns the dump files to
/// wait for, with the process that writes each.
fn request_dumps(dir: &Path, ranks: &mut [Rank], not_before_us: u64) -> Vec<(PathBuf, Pid)> {
    let groups: BTreeSet<Pid> = ranks
        .iter_mut()
        .filter_map(|r| r.poll().is_none().then_some(r.pgid))
        .collect();
    let mut signalled = BTreeSet::new();
    let mut awaited = Vec::new();
    for file in scan(dir).unwrap_or_default() {
        if file.kind != FlightFileKind::Beacon
            || modified_us(&file.path).is_none_or(|at| at.saturating_add(SLACK_US) < not_before_us)
        {
            continue;
        }
        let Some(pid) = read_beacon(&file.path).and_then(|b| Pid::try_from(b.pid).ok()) else {
            continue;
        };
        let ours = process_group::process_state(pid)
            .is_some_and(|(state, group)| state != 'Z' && state != 'X' && groups.contains(&group));
        // Only a process that handles SIGUSR1 gets it (it would kill any other); ringccl
        // installs its handler just after it creates its beacon.
        if !ours || !process_group::catches(pid, libc::SIGUSR1) {
            continue;
        }
        if signalled.insert(pid) && !process_group::signal_process(pid, libc::SIGUSR1) {
            continue;
        }
        awaited.push((file.path.with_extension("json"), pid));
    }
    awaited
}

/// Each rank's process: running, or how and when it ended.
fn launcher_view(ranks: &mut [Rank]) -> BTreeMap<usize, RankProcess> {
    ranks
        .iter_mut()
        .map(|r| {
            let process = match r.poll() {
                None => RankProcess::Running,
                Some(status) => RankProcess::Exited(RankExit {
                    status: supervise::describe(status),
                    success: status.success(),
                    at_us: r.ended_at.map_or(0, micros),
                }),
            };
            (r.rank, process)
        })
        .collect()
}

/// Prints the diagnosis as one block on stderr.
fn print(why: &str, dir: &Path, diagnosis: &Diagnosis) {
    let mut text = format!("ringrun: {PREFIX} {why}\n");
    for line in diagnosis.lines() {
        text.push_str(&format!("ringrun: {PREFIX} {line}\n"));
    }
    text.push_str(&format!(
        "ringrun: {PREFIX} (flight records in {}; `ringrun diagnose {}` reads them again)\n",
        dir.display(),
        dir.display()
    ));
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}
