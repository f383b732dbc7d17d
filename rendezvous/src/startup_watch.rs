//! Start-up that talks: a rank still waiting at start-up says so by itself, whom it waits
//! for and since when, first after [`MeshConfig::startup_report`] and then every twice
//! that, in any program (no logging set-up needed).
//!
//! The wording and the schedule are pure ([`describe`], [`ReportClock`]); [`StartupWatch`]
//! is the thin driver: a thread that sleeps until the next report is due, reads what the
//! start-up is waiting for (which [`StartupWatch::waiting`] updates as it goes) and
//! [`announce`]s it. Dropping the watch ends the thread.
//!
//! [`MeshConfig::startup_report`]: crate::MeshConfig::startup_report

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What a rank waits for at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// The rendezvous store to answer (rank 0 not started yet, or unreachable).
    Store {
        /// The last connection error, if any.
        last_error: Option<String>,
    },
    /// Rank 0 to write the job's record in its store.
    JobRecord,
    /// A lower rank to publish its address (it has not joined yet).
    Address {
        /// The lower rank.
        peer: usize,
    },
    /// A lower rank to accept this rank's connection.
    Accept {
        /// The lower rank.
        peer: usize,
    },
    /// The higher ranks that have not connected to this rank yet (every lower rank has).
    Joins {
        /// The higher ranks still missing, in order.
        missing: Vec<usize>,
    },
    /// A step after every rank joined (shared-memory set-up, the end of start-up).
    SetUp {
        /// The step, in words.
        step: &'static str,
    },
}

/// The sentence a rank waiting at start-up prints, e.g. `rank 0: 1 of 2 ranks joined after
/// 30 s; still waiting for rank 1 (MASTER_ADDR 10.0.0.1:29500, WORLD_SIZE 2)`.
///
/// `master` is the store's address as configured, `waited` how long start-up has run.
/// `not_started`, known where the store is hosted, lists the ranks no process has
/// claimed yet: a rank that has claimed its rank but not connected is still starting.
pub(crate) fn describe(
    rank: usize,
    world_size: usize,
    master: &str,
    waited: Duration,
    waiting: &Waiting,
    not_started: Option<&[usize]>,
) -> String {
    let after = format!("after {} s", waited.as_secs());
    let what = match waiting {
        Waiting::Store { last_error } => {
            let error = last_error
                .as_deref()
                .map(|e| format!(" (last error: {e})"))
                .unwrap_or_default();
            format!(
                "still waiting {after} for rank 0's rendezvous store{error}; is rank 0 \
                 running, and do MASTER_ADDR and MASTER_PORT point at it?"
            )
        }
        Waiting::JobRecord => {
            format!("reached the rendezvous store but rank 0 has not started the job {after}")
        }
        Waiting::Address { peer } => format!(
            "still waiting {after} for rank {peer} to join (ranks below {peer} have); is \
             rank {peer} running, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?"
        ),
        Waiting::Accept { peer } => format!(
            "still waiting {after} for rank {peer} to accept this rank's connection; can \
             this host reach rank {peer}'s host (firewall, RINGCCL_SOCKET_IFNAME)?"
        ),
        Waiting::Joins { missing } => match not_started {
            Some(absent) if !absent.is_empty() => {
                let joined = world_size.saturating_sub(absent.len());
                let connecting: Vec<usize> = missing
                    .iter()
                    .copied()
                    .filter(|r| !absent.contains(r))
                    .collect();
                let mut text = format!(
                    "{joined} of {world_size} ranks joined {after}; still waiting for {}",
                    rank_list(absent)
                );
                if !connecting.is_empty() {
                    let _ = write!(
                        text,
                        " ({} started, not yet connected to this rank)",
                        rank_list(&connecting)
                    );
                }
                text
            }
            Some(_) => format!(
                "all {world_size} ranks started {after}; still waiting for {} to connect to \
                 this rank",
                rank_list(missing)
            ),
            None => {
                let joined = world_size.saturating_sub(missing.len());
                format!(
                    "{joined} of {world_size} ranks joined {after}; still waiting for {}",
                    rank_list(missing)
                )
            }
        },
        Waiting::SetUp { step } => {
            format!("all {world_size} ranks joined; still {step} {after}")
        }
    };
    format!("rank {rank}: {what} (MASTER_ADDR {master}, WORLD_SIZE {world_size})")
}

/// `"rank 3"`, `"ranks 1, 4"`, `"ranks 4-7, 9"`; at most [`MAX_RANGES`] runs, then how
/// many ranks more.
pub(crate) fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let mut text = String::from(if ranks.len() == 1 { "rank " } else { "ranks " });
    for (i, &(start, end)) in runs.iter().take(MAX_RANGES).enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        let _ = match end - start {
            0 => write!(text, "{start}"),
            1 => write!(text, "{start}, {end}"),
            _ => write!(text, "{start}-{end}"),
        };
    }
    if runs.len() > MAX_RANGES {
        let more: usize = runs[MAX_RANGES..].iter().map(|(s, e)| e - s + 1).sum();
        let _ = write!(text, " and {more} more");
    }
    text
}

/// Runs of ranks a report lists before it only counts the rest.
const MAX_RANGES: usize = 16;

/// When reports are due: first `first` after the start, then every twice that.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReportClock {
    next: Instant,
    every: Duration,
}

impl ReportClock {
    /// Reports for a start-up that began at `started`.
    pub(crate) fn new(started: Instant, first: Duration) -> ReportClock {
        ReportClock {
            next: started + first,
            every: first.saturating_mul(2),
        }
    }

    /// When the next report is due.
    pub(crate) fn next(&self) -> Instant {
        self.next
    }

    /// Whether a report is due at `now`; when it is, the next one is scheduled.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        // A late wake-up skips the reports it missed rather than printing them in a burst.
        while self.next <= now {
            self.next += self.every;
        }
        true
    }
}

/// Prints `message` where the application will see it: as a WARN event when it has
/// installed a global `tracing` subscriber, otherwise straight to stderr (an application
/// that set up no logging still hears that its job is waiting).
pub(crate) fn announce(message: &str) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!(target: "ringccl::startup", "{message}");
    } else {
        // Best effort: a closed stderr loses the line, never the start-up.
        let _ = writeln!(std::io::stderr().lock(), "ringccl: {message}");
    }
}

/// Whether a process has claimed rank `r` (answered where the store is hosted).
pub(crate) type Started = Box<dyn Fn(usize) -> bool + Send>;

/// What the start-up thread and the watch share.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug)]
struct State {
    waiting: Waiting,
    stopped: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct StartupWatch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl StartupWatch {
    /// Starts watching rank `rank`'s start-up, begun at `started`; the first report is due
    /// `first` later. With `claimed` (where the store is hosted), reports tell ranks not
    /// started from ranks still connecting. If no thread can be started, start-up goes on
    /// unwatched.
    pub(crate) fn start(
        rank: usize,
        world_size: usize,
        master: &str,
        started: Instant,
        first: Duration,
        claimed: Option<Started>,
    ) -> StartupWatch {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                waiting: Waiting::Store { last_error: None },
                stopped: false,
            }),
            wake: Condvar::new(),
        });
        let master = master.to_string();
        let watched = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("ringccl-startup".into())
            .spawn(move || {
                let mut clock = ReportClock::new(started, first);
                let mut state = lock(&watched.state);
                loop {
                    let left = clock.next().saturating_duration_since(Instant::now());
                    state = watched
                        .wake
                        .wait_timeout_while(state, left, |s| !s.stopped)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    if state.stopped {
                        return;
                    }
                    let now = Instant::now();
                    if clock.due(now) {
                        let waited = now.saturating_duration_since(started);
                        let not_started: Option<Vec<usize>> = claimed
                            .as_ref()
                            .map(|claimed| (0..world_size).filter(|&r| !claimed(r)).collect());
                        announce(&describe(
                            rank,
                            world_size,
                            &master,
                            waited,
                            &state.waiting,
                            not_started.as_deref(),
                        ));
                    }
                }
            });
        let thread = match thread {
            Ok(thread) => Some(thread),
            Err(e) => {
                tracing::debug!(rank, error = %e, "start-up reports are off: no thread");
                None
            }
        };
        StartupWatch { shared, thread }
    }

    /// Start-up now waits for `waiting`.
    pub(crate) fn waiting(&self, waiting: Waiting) {
        lock(&self.shared.state).waiting = waiting;
    }
}

impl Drop for StartupWatch {
    fn drop(&mut self) {
        lock(&self.shared.state).stopped = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The state, even if a thread panicked while holding it (it is only ever replaced whole).
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_collapse_runs_and_cap_their_length() {
        assert_eq!(rank_list(&[1]), "rank 1");
        assert_eq!(rank_list(&[1, 4]), "ranks 1, 4");
        assert_eq!(rank_list(&[2, 3]), "ranks 2, 3");
        assert_eq!(rank_list(&[4, 5, 6, 7, 9]), "ranks 4-7, 9");
        let many: Vec<usize> = (0..100).map(|r| r * 2).collect();
        let text = rank_list(&many);
        assert!(text.starts_with("ranks 0, 2, 4,"), "{text}");
        assert!(text.ends_with(" and 84 more"), "{text}");
    }

    #[test]
    fn rank_zero_counts_who_joined_and_names_who_did_not() {
        let waiting = Waiting::Joins { missing: vec![1] };
        let text = describe(
            0,
            2,
            "10.0.0.1:29500",
            Duration::from_secs(30),
            &waiting,
            None,
        );
        assert_eq!(
            text,
            "rank 0: 1 of 2 ranks joined after 30 s; still waiting for rank 1 \
             (MASTER_ADDR 10.0.0.1:29500, WORLD_SIZE 2)"
        );
        let with_claims = describe(
            0,
            2,
            "10.0.0.1:29500",
            Duration::from_secs(30),
            &waiting,
            Some(&[1]),
        );
        assert_eq!(with_claims, text);
    }

    #[test]
    fn where_the_store_is_hosted_ranks_still_connecting_are_told_apart() {
        let waiting = Waiting::Joins {
            missing: vec![1, 2, 5],
        };
        let say = |absent: &[usize]| {
            describe(0, 6, "h:1", Duration::from_secs(30), &waiting, Some(absent))
        };
        assert!(
            say(&[5]).starts_with(
                "rank 0: 5 of 6 ranks joined after 30 s; still waiting for rank 5 (ranks 1, 2 \
                 started, not yet connected to this rank)"
            ),
            "{}",
            say(&[5])
        );
        assert!(
            say(&[]).starts_with(
                "rank 0: all 6 ranks started after 30 s; still waiting for ranks 1, 2, 5 to connect"
            ),
            "{}",
            say(&[])
        );
    }

    #[test]
    fn other_waits_name_the_rank_or_the_store() {
        let say = |w: Waiting| describe(3, 8, "h:1", Duration::from_secs(90), &w, None);
        let text = say(Waiting::Store {
            last_error: Some("connection refused".into()),
        });
        assert!(text.starts_with("rank 3: still waiting after 90 s for rank 0's rendezvous store (last error: connection refused)"), "{text}");
        assert!(say(Waiting::Address { peer: 2 }).contains("for rank 2 to join"));
        assert!(say(Waiting::Accept { peer: 1 }).contains("rank 1 to accept"));
        assert!(say(Waiting::SetUp {
            step: "setting up shared memory"
        })
        .contains("all 8 ranks joined; still setting up shared memory after 90 s"));
        assert!(say(Waiting::JobRecord).ends_with("(MASTER_ADDR h:1, WORLD_SIZE 8)"));
    }

    #[test]
    fn reports_come_after_the_first_delay_then_every_twice_that() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut clock = ReportClock::new(t0, 30 * s);
        assert!(!clock.due(t0));
        assert!(!clock.due(t0 + 29 * s));
        assert!(clock.due(t0 + 30 * s));
        assert!(!clock.due(t0 + 31 * s));
        assert!(!clock.due(t0 + 89 * s));
        assert!(clock.due(t0 + 90 * s));
        // A late wake-up reports once, not once per missed slot.
        assert!(clock.due(t0 + 400 * s));
        assert!(!clock.due(t0 + 401 * s));
        assert_eq!(clock.next(), t0 + 450 * s);
    }

    #[test]
    fn the_watch_stops_at_once_when_dropped() {
        let started = Instant::now();
        let watch = StartupWatch::start(0, 2, "h:1", started, Duration::from_secs(3600), None);
        watch.waiting(Waiting::Joins { missing: vec![1] });
        drop(watch);
        assert!(started.elapsed() < Duration::from_secs(60));
    }
}
