//! Watching the ranks' progress beacons for a hang: no rank has finished a call for the
//! hang timeout while some rank has had one in flight that long. One report per hang: the
//! watch re-arms when a call finishes again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringccl_tools::diagnose::{read_beacon, scan, FlightFileKind};

/// How often the beacons are read.
const POLL: Duration = Duration::from_millis(200);

/// One beacon file, as last read.
#[derive(Debug)]
struct Tracked {
    rank: usize,
    group_tag: String,
    finished: u64,
    /// Since when (as seen here) it has had a call in flight without finishing one.
    in_flight_since: Option<Instant>,
}

/// A hang, as the watch saw it.
#[derive(Debug)]
pub(crate) struct Stall {
    /// How long no call has finished anywhere.
    pub(crate) idle_for: Duration,
    /// Ranks (and their group's tag) with a call in flight that long.
    pub(crate) in_flight: Vec<(usize, String)>,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct HangWatch {
    dir: PathBuf,
    timeout: Duration,
    /// Beacons older than this belong to an earlier run.
    not_before_us: u64,
    started: Instant,
    next_poll: Instant,
    last_progress: Instant,
    beacons: BTreeMap<PathBuf, Tracked>,
    reported: bool,
    told_no_beacons: bool,
}

impl HangWatch {
    /// Starts watching `dir` for the run that started at `not_before_us`.
    pub(crate) fn new(dir: &Path, timeout: Duration, not_before_us: u64) -> HangWatch {
        let now = Instant::now();
        HangWatch {
            dir: dir.to_path_buf(),
            timeout,
            not_before_us,
            started: now,
            next_poll: now,
            last_progress: now,
            beacons: BTreeMap::new(),
            reported: false,
            told_no_beacons: false,
        }
    }

    /// Reads the beacons if it is time to; returns a stall once per hang.
    pub(crate) fn poll(&mut self) -> Option<Stall> {
        let now = Instant::now();
        if now < self.next_poll {
            return None;
        }
        self.next_poll = now + POLL;
        self.read(now);
        if self.beacons.is_empty()
            && !self.told_no_beacons
            && now.duration_since(self.started) >= self.timeout.max(Duration::from_secs(30))
        {
            self.told_no_beacons = true;
            crate::say!(
                "--hang-timeout: no rank has written a progress beacon to {} yet; hangs are \
                 seen only in programs that use ringccl (its flight recorder writes them)",
                self.dir.display()
            );
        }
        let idle_for = now.duration_since(self.last_progress);
        let in_flight: Vec<(usize, String)> = self
            .beacons
            .values()
            .filter(|t| {
                t.in_flight_since
                    .is_some_and(|since| now.duration_since(since) >= self.timeout)
            })
            .map(|t| (t.rank, t.group_tag.clone()))
            .collect();
        if self.reported || idle_for < self.timeout || in_flight.is_empty() {
            return None;
        }
        self.reported = true;
        Some(Stall {
            idle_for,
            in_flight,
        })
    }

    fn read(&mut self, now: Instant) {
        let Ok(files) = scan(&self.dir) else {
            return;
        };
        let mut seen = BTreeMap::new();
        for file in files {
            if file.kind != FlightFileKind::Beacon {
                continue;
            }
            let fresh = ringccl_tools::diagnose::modified_us(&file.path)
                .is_some_and(|at| at.saturating_add(SLACK_US) >= self.not_before_us);
            let Some(beacon) = read_beacon(&file.path).filter(|_| fresh) else {
                continue;
            };
            let mut tracked = self.beacons.remove(&file.path).unwrap_or(Tracked {
                rank: file.rank,
                group_tag: file.group_tag.clone(),
                finished: 0,
                in_flight_since: None,
            });
            if beacon.finished != tracked.finished {
                tracked.finished = beacon.finished;
                tracked.in_flight_since = None;
                self.last_progress = now;
                self.reported = false;
            }
            if beacon.issued > beacon.finished {
                tracked.in_flight_since.get_or_insert(now);
            } else {
                tracked.in_flight_since = None;
            }
            seen.insert(file.path, tracked);
        }
        // Beacons removed (their group ended) are forgotten.
        self.beacons = seen;
    }
}

/// File times come from a coarse clock that may lag the precise one a little.
const SLACK_US: u64 = 50_000;
