//! The flight recorder of one group on one rank: its last calls in a fixed-size ring,
//! the beacon file, and the dumps.
//!
//! Who records what:
//! - the facade's issue order (`ringccl`'s sequencer): a call is issued
//!   ([`FlightRecorder::issued`]), gets its turn ([`FlightRecorder::turn`]), or is given
//!   up while queued ([`FlightRecorder::gave_up`]);
//! - the group's runner, through the hooks ([`Observers`](crate::Observers)): a call
//!   starts ([`FlightRecorder::start`]), finishes or fails ([`FlightRecorder::finish`]),
//!   is refused ([`FlightRecorder::refused`]), and the group breaks (the dump);
//! - what the call is, its algorithm, the bytes it moves per peer and the peer it waits
//!   for are read from the group's [`Probe`](ringccl_collectives::control::Probe), where
//!   the engine puts them, when the call ends or a dump is taken.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::beacon_file::BeaconFile;
use super::dump::{CallState, FlightDump, FlightEntry, OtherPeers, PeerBytes, FORMAT_VERSION};
use super::files::{file_name, write_atomically, MAIN_GROUP};
use super::live::{LiveCall, LiveRecord};
use super::requests;
use super::ring::{Ring, Slot, AT_ISSUE};
use super::tick_clock::TickClock;
use ringccl_collectives::control::{GroupControl, LastCall, MovedBytes};
use ringccl_collectives::Sequence;
use ringccl_collectives::{CollectiveKind, Error, OpDesc};

/// In [`FlightRecorder`]'s `turn`: the call did not wait for its turn.
const AT_ONCE: u64 = 1 << 63;

/// Calls kept by default (`RINGCCL_FLIGHT_ENTRIES`).
pub const DEFAULT_FLIGHT_ENTRIES: usize = 2000;
/// The most calls a recorder keeps (each takes about 400 bytes).
pub const MAX_FLIGHT_ENTRIES: usize = 100_000;

/// How one group's recorder is set up.
///
/// ```
/// use ringccl_observe::flight::{FlightConfig, DEFAULT_FLIGHT_ENTRIES};
///
/// let config = FlightConfig::default();
/// assert_eq!((config.entries, config.dir, config.group.as_str()), (DEFAULT_FLIGHT_ENTRIES, None, "main"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightConfig {
    /// How many calls the ring keeps (clamped to `1..=`[`MAX_FLIGHT_ENTRIES`]).
    pub entries: usize,
    /// Where the dumps and the beacon go (`RINGCCL_FLIGHT_DIR`); `None`: no files, and
    /// no SIGUSR1 handler (the ring is kept all the same).
    pub dir: Option<PathBuf>,
    /// `"main"` for the group `init_process_group` made, else the formed group's
    /// namespace (it names the files; see [`file_name`](super::file_name)).
    pub group: String,
    /// `"tcp"`, `"shm"` or `"nccl"`, for the dump.
    pub transport: &'static str,
}

impl Default for FlightConfig {
    fn default() -> FlightConfig {
        FlightConfig {
            entries: DEFAULT_FLIGHT_ENTRIES,
            dir: None,
            group: MAIN_GROUP.into(),
            transport: "",
        }
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

struct Book {
    ring: Ring,
    /// Calls finished so far, either way.
    finished: u64,
    /// Times the end of each call.
    clock: TickClock,
}

/// One group's flight recorder on one rank. See the module documentation.
///
/// ```
/// use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
///
/// let recorder = FlightRecorder::new(0, 2, "gloo", FlightConfig::default());
/// let call = recorder.issued("barrier");
/// recorder.turn(call, true);
/// let dump = recorder.snapshot("requested");
/// assert_eq!(dump.entries[0].state, CallState::Queued);
/// assert_eq!((dump.entries[0].call, dump.entries[0].kind.as_str()), (1, "barrier"));
/// ```
pub struct FlightRecorder {
    rank: usize,
    world_size: usize,
    backend: &'static str,
    config: FlightConfig,
    book: Mutex<Book>,
    /// The call whose turn it is, until the runner starts it (0: none), with
    /// [`AT_ONCE`] when it did not wait for it.
    turn: AtomicU64,
    /// With a beacon: the last call issued and when (Unix microseconds), for the
    /// beacon's start time of a call whose turn came as it was issued.
    last_issued: (AtomicU64, AtomicU64),
    live: LiveCall,
    beacon: Option<BeaconFile>,
    /// The group's control state, once the recorder is attached to a group: its probe
    /// says what the running call does; when a peer aborts the group while this rank
    /// runs no call, the request thread writes the dump.
    control: OnceLock<Arc<GroupControl>>,
    /// The group broke and its dump was taken: later breaks do not dump again, and the
    /// beacon stays behind for the diagnosis.
    dumped_on_break: AtomicBool,
    /// The running call was handed to a device without a wait: it ends
    /// [`CallState::OnDevice`] rather than done.
    handed_off: AtomicBool,
    /// Times are read from the monotonic clock and written as Unix time: `epoch` was
    /// `epoch_us` microseconds after the Unix epoch.
    epoch: Instant,
    epoch_us: u64,
}

impl FlightRecorder {
    /// A recorder for rank `rank` of `world_size` on `backend`, set up by `config`.
    /// With `config.dir`, the directory is created, the beacon written, and the
    /// recorder answers SIGUSR1 (see [`dump_all`](super::dump_all)).
    ///
    /// ```
    /// use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(1, 4, "gloo", FlightConfig { entries: 16, ..FlightConfig::default() });
    /// assert_eq!(recorder.capacity(), 16);
    /// ```
    pub fn new(
        rank: usize,
        world_size: usize,
        backend: &'static str,
        mut config: FlightConfig,
    ) -> Arc<FlightRecorder> {
        config.entries = config.entries.clamp(1, MAX_FLIGHT_ENTRIES);
        let beacon = config.dir.as_deref().and_then(|dir| {
            let path = dir.join(file_name(rank, &config.group, "beacon"));
            let made = std::fs::create_dir_all(dir).and_then(|()| BeaconFile::create(path));
            made.map_err(|e| {
                tracing::warn!(rank, dir = %dir.display(), error = %e,
                    "the flight recorder cannot write its beacon there; dumps may fail too")
            })
            .ok()
        });
        let recorder = Arc::new(FlightRecorder {
            rank,
            world_size,
            backend,
            book: Mutex::new(Book {
                ring: Ring::new(config.entries),
                finished: 0,
                clock: TickClock::new(now_us()),
            }),
            config,
            turn: AtomicU64::new(0),
            last_issued: (AtomicU64::new(0), AtomicU64::new(0)),
            live: LiveCall::default(),
            beacon,
            control: OnceLock::new(),
            dumped_on_break: AtomicBool::new(false),
            handed_off: AtomicBool::new(false),
            epoch: Instant::now(),
            epoch_us: now_us(),
        });
        if recorder.config.dir.is_some() {
            requests::register(&recorder);
        }
        recorder
    }

    /// The recorder now watches the group whose control state is `control` (its hooks
    /// were attached to it); a recorder watches one group.
    pub(crate) fn watch(&self, control: &Arc<GroupControl>) {
        let _ = self.control.set(Arc::clone(control));
    }

    /// `at` in microseconds since the Unix epoch.
    #[inline]
    fn stamp(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.epoch);
        self.epoch_us
            .saturating_add(since.as_secs().saturating_mul(1_000_000))
            .saturating_add(u64::from(since.subsec_micros()))
    }

    /// When `slot`'s call was issued, in microseconds since the Unix epoch.
    fn issued_us(&self, slot: &Slot) -> u64 {
        slot.issued.map_or(0, |at| self.stamp(at))
    }

    /// Now, in microseconds since the Unix epoch.
    #[inline]
    fn now(&self) -> u64 {
        self.stamp(Instant::now())
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        // Every update completes before the lock is released: a poisoned lock holds
        // consistent entries.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many calls the ring keeps.
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig { entries: 0, ..FlightConfig::default() });
    /// assert_eq!(recorder.capacity(), 1);
    /// ```
    pub fn capacity(&self) -> usize {
        self.config.entries
    }

    /// Where the dumps go, if anywhere.
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// assert!(recorder.dump_path().is_none());
    /// ```
    pub fn dump_path(&self) -> Option<PathBuf> {
        let dir = self.config.dir.as_ref()?;
        Some(dir.join(file_name(self.rank, &self.config.group, "json")))
    }

    /// The beacon file, if one was made.
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// assert!(recorder.beacon_path().is_none());
    /// ```
    pub fn beacon_path(&self) -> Option<&Path> {
        self.beacon.as_ref().map(BeaconFile::path)
    }

    /// A call of `kind` (`"all_reduce"`) is issued now; returns its number, which the
    /// issuer passes to [`FlightRecorder::turn`] or [`FlightRecorder::gave_up`].
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// assert_eq!((recorder.issued("barrier"), recorder.issued("barrier")), (1, 2));
    /// ```
    pub fn issued(&self, kind: &'static str) -> u64 {
        self.issued_at(kind, Instant::now())
    }

    /// [`FlightRecorder::issued`] for a call issued at `at` (an issuer that has just
    /// read the clock, to fix the call's deadline, saves reading it again).
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// use std::time::Instant;
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// assert_eq!(recorder.issued_at("barrier", Instant::now()), 1);
    /// ```
    pub fn issued_at(&self, kind: &'static str, at: Instant) -> u64 {
        let mut book = self.lock();
        let call = book.ring.push(kind, at);
        if let Some(beacon) = &self.beacon {
            beacon.issued(call);
            self.last_issued.1.store(self.stamp(at), Ordering::Relaxed);
            self.last_issued.0.store(call, Ordering::Release);
        }
        call
    }

    /// It is call `call`'s turn: the next call the runner starts on this thread is it.
    /// `waited`: whether time passed since it was issued (it queued behind others, or
    /// was handed to another thread); a call that did not wait is recorded as started
    /// when it was issued, which saves a reading of the clock on the common path.
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// use ringccl_collectives::Sequence;
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// recorder.turn(recorder.issued("barrier"), false);
    /// recorder.start(Sequence::Collective, 1);
    /// let entry = &recorder.snapshot("requested").entries[0];
    /// assert_eq!(entry.started_us, Some(entry.issued_us));
    /// ```
    pub fn turn(&self, call: u64, waited: bool) {
        let flag = if waited { 0 } else { AT_ONCE };
        self.turn.store(call | flag, Ordering::Relaxed);
    }

    /// Call `call` will never run (given up while queued, or refused): it failed with
    /// `error`.
    ///
    /// ```
    /// # use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// let call = recorder.issued("barrier");
    /// recorder.gave_up(call, &"queued past its deadline");
    /// assert_eq!(recorder.snapshot("requested").entries[0].state, CallState::Failed);
    /// ```
    pub fn gave_up(&self, call: u64, error: &dyn fmt::Display) {
        let error = error.to_string();
        let now = self.now();
        let mut book = self.lock();
        let Some(slot) = book.ring.get_mut(call) else {
            return;
        };
        if slot.state != CallState::Queued {
            return;
        }
        slot.state = CallState::Failed;
        slot.ended_us = Some(now);
        slot.error = Some(error);
        self.finished_one(&mut book, now);
    }

    fn finished_one(&self, book: &mut Book, now: u64) {
        book.finished += 1;
        if let Some(beacon) = &self.beacon {
            beacon.finished(book.finished, now);
        }
    }

    /// The call whose turn it is, if it is still queued; else a new call, for one that
    /// came to the runner without the facade (or a second one in the same turn).
    /// `now`: the time to record a new call with, if the clock was read.
    fn claim(&self, book: &mut Book, sequence: Sequence, now: Option<Instant>) -> u64 {
        let turn = self.turn.swap(0, Ordering::Relaxed) & !AT_ONCE;
        let queued = book
            .ring
            .get_mut(turn)
            .is_some_and(|slot| slot.state == CallState::Queued);
        if queued {
            return turn;
        }
        let kind = match sequence {
            Sequence::Collective => "collective",
            Sequence::SentTo(_) => "send",
            Sequence::ReceivedFrom(_) => "recv",
        };
        let call = book.ring.push(kind, now.unwrap_or_else(Instant::now));
        if let Some(beacon) = &self.beacon {
            beacon.issued(call);
        }
        call
    }

    /// The runner starts a call numbered `seq` in `sequence` (the call whose turn it
    /// is, or a new one).
    ///
    /// ```
    /// # use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
    /// use ringccl_collectives::Sequence;
    /// let recorder = FlightRecorder::new(0, 2, "gloo", FlightConfig::default());
    /// recorder.start(Sequence::SentTo(1), 1);
    /// let entry = &recorder.snapshot("requested").entries[0];
    /// assert_eq!((entry.kind.as_str(), entry.state, entry.root), ("send", CallState::Running, Some(1)));
    /// ```
    pub fn start(&self, sequence: Sequence, seq: u64) {
        self.handed_off.store(false, Ordering::Relaxed);
        let turn = self.turn.swap(0, Ordering::Relaxed);
        // A call whose turn came as it was issued started then.
        let at_once = turn & AT_ONCE != 0;
        let started = (!at_once).then(Instant::now);
        let started_us = started.map(|at| self.stamp(at));
        let call = match turn & !AT_ONCE {
            // No turn was given: a call that came to the runner without the facade, or
            // a second one in the same turn, gets an entry of its own, under the lock.
            0 => {
                let mut book = self.lock();
                self.claim(&mut book, sequence, started)
            }
            // The facade's call, queued until now: no lock on this path. (If a ring
            // smaller than the calls queued has overwritten its entry, the call runs
            // unrecorded.)
            queued => queued,
        };
        self.live.begin(call, seq, started_us, sequence.peer());
        if let Some(beacon) = &self.beacon {
            let since = started_us.unwrap_or_else(|| {
                // A newer issue racing between the two loads gives a time a little
                // later than this call's issue: harmless for a beacon.
                if self.last_issued.0.load(Ordering::Acquire) == call {
                    self.last_issued.1.load(Ordering::Relaxed)
                } else {
                    self.now()
                }
            });
            beacon.started(seq, since);
        }
    }

    /// The current call ended, with `error` if it failed.
    ///
    /// ```
    /// # use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
    /// use ringccl_collectives::Sequence;
    /// let recorder = FlightRecorder::new(0, 2, "gloo", FlightConfig::default());
    /// recorder.start(Sequence::Collective, 1);
    /// recorder.finish(None);
    /// assert_eq!(recorder.snapshot("requested").entries[0].state, CallState::Done);
    /// ```
    pub fn finish(&self, error: Option<&Error>) {
        let on_device = self.handed_off.swap(false, Ordering::Relaxed);
        let error = error.map(ToString::to_string);
        let mut book = self.lock();
        let Some(call) = self.live.call() else {
            return;
        };
        let mut now = book.clock.now_us(|| self.now());
        match book.ring.get_mut(call) {
            Some(slot) => {
                if let Some(live) = self.live.end() {
                    let last = self.last_call(&live, &mut slot.peers);
                    settle(slot, &live, last.as_ref());
                }
                // The tick clock may trail the precise one by its calibration error (a
                // dump also keeps the end from falling before the issue).
                if let Some(started) = slot.started_us.filter(|&s| s != AT_ISSUE) {
                    now = now.max(started);
                }
                slot.state = match (&error, on_device) {
                    (Some(_), _) => CallState::Failed,
                    (None, true) => CallState::OnDevice,
                    (None, false) => CallState::Done,
                };
                // A call on the device ends when the device says so.
                slot.ended_us = (slot.state != CallState::OnDevice).then_some(now);
                slot.error = error;
                if slot.state == CallState::OnDevice {
                    // Counted as finished (for the beacon) in `device_finished`.
                    return;
                }
            }
            // Overwritten while it ran (a ring smaller than the calls queued).
            None => {
                self.live.end();
            }
        }
        self.finished_one(&mut book, now);
    }

    /// The engine handed the running call to its device without waiting (NCCL's
    /// stream-ordered calls): when the runner finishes it, it stays
    /// [`CallState::OnDevice`] until [`FlightRecorder::device_finished`]. Returns the
    /// call's number for that, `None` when no call is running.
    ///
    /// ```
    /// # use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
    /// use ringccl_collectives::Sequence;
    /// let recorder = FlightRecorder::new(0, 1, "nccl", FlightConfig::default());
    /// recorder.start(Sequence::Collective, 1);
    /// let call = recorder.handed_to_device().unwrap();
    /// recorder.finish(None);
    /// assert_eq!(recorder.snapshot("requested").entries[0].state, CallState::OnDevice);
    /// recorder.device_finished(call, None);
    /// assert_eq!(recorder.snapshot("requested").entries[0].state, CallState::Done);
    /// ```
    pub fn handed_to_device(&self) -> Option<u64> {
        let call = self.live.call()?;
        self.handed_off.store(true, Ordering::Relaxed);
        Some(call)
    }

    /// Call `call`, left [`CallState::OnDevice`], has finished on the device (failed,
    /// with `error`); only now does it count as finished (the beacon's count). A call
    /// the ring has since overwritten is only counted.
    ///
    /// ```
    /// # use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
    /// use ringccl_collectives::{Error, Sequence};
    /// let recorder = FlightRecorder::new(0, 1, "nccl", FlightConfig::default());
    /// recorder.start(Sequence::Collective, 1);
    /// let call = recorder.handed_to_device().unwrap();
    /// recorder.finish(None);
    /// recorder.device_finished(call, Some(&Error::InvalidArgument("overdue".into())));
    /// let entry = &recorder.snapshot("requested").entries[0];
    /// assert_eq!((entry.state, entry.error.is_some(), entry.ended_us.is_some()), (CallState::Failed, true, true));
    /// ```
    pub fn device_finished(&self, call: u64, error: Option<&Error>) {
        let error = error.map(ToString::to_string);
        let mut book = self.lock();
        let now = book.clock.now_us(|| self.now());
        match book.ring.get_mut(call) {
            Some(slot) if slot.state == CallState::OnDevice => {
                slot.state = if error.is_some() {
                    CallState::Failed
                } else {
                    CallState::Done
                };
                slot.ended_us = Some(now);
                slot.error = error;
            }
            // Settled already.
            Some(_) => return,
            // Overwritten while on the device: counted now all the same.
            None => {}
        }
        self.finished_one(&mut book, now);
    }

    /// The runner refused a call in `sequence` before it started (misuse, or a broken
    /// group).
    ///
    /// ```
    /// # use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
    /// use ringccl_collectives::{Error, Sequence};
    /// let recorder = FlightRecorder::new(0, 2, "gloo", FlightConfig::default());
    /// recorder.refused(Sequence::Collective, &Error::InvalidArgument("bad root".into()));
    /// assert_eq!(recorder.snapshot("requested").entries[0].state, CallState::Failed);
    /// ```
    pub fn refused(&self, sequence: Sequence, error: &Error) {
        self.record_refusal(sequence, None, error);
    }

    /// The runner refused a call because the group was aborted, as it was about to
    /// start it as op `seq`, described by `op` when the runner knows it: the dump then
    /// shows what this rank was about to run.
    ///
    /// ```
    /// # use ringccl_observe::flight::{CallState, FlightConfig, FlightRecorder};
    /// use ringccl_collectives::{DType, Error, OpDesc, ReduceOp, Sequence};
    /// let recorder = FlightRecorder::new(0, 2, "gloo", FlightConfig::default());
    /// let op = OpDesc::all_reduce(5, DType::F32, 8, ReduceOp::Sum);
    /// recorder.refused_as(Sequence::Collective, 5, Some(op), &Error::InvalidArgument("aborted".into()));
    /// let entry = &recorder.snapshot("requested").entries[0];
    /// assert_eq!((entry.op, entry.kind.as_str(), entry.state), (Some(5), "all_reduce", CallState::Failed));
    /// ```
    pub fn refused_as(&self, sequence: Sequence, seq: u64, op: Option<OpDesc>, error: &Error) {
        self.record_refusal(sequence, Some((seq, op)), error);
    }

    fn record_refusal(
        &self,
        sequence: Sequence,
        would_be: Option<(u64, Option<OpDesc>)>,
        error: &Error,
    ) {
        let error = error.to_string();
        let at = Instant::now();
        let now = self.stamp(at);
        let mut book = self.lock();
        let call = self.claim(&mut book, sequence, Some(at));
        if let Some(slot) = book.ring.get_mut(call) {
            slot.state = CallState::Failed;
            slot.ended_us = Some(now);
            slot.error = Some(error);
            if let Some((seq, op)) = would_be {
                slot.seq = Some(seq);
                slot.op = op;
                slot.peer = sequence.peer();
            }
        }
        self.finished_one(&mut book, now);
    }

    /// The running call is about to sleep until `peer` is ready: the beacon says so.
    #[inline]
    pub(crate) fn blocked_on(&self, peer: usize) {
        if let Some(beacon) = &self.beacon {
            beacon.blocked_on(peer);
        }
    }

    /// What the group's probe says of `live`, the recorder's running call, when it is
    /// about that call; the bytes it moved go into `moved` (none when the probe knows
    /// nothing of it).
    fn last_call(&self, live: &LiveRecord, moved: &mut MovedBytes) -> Option<LastCall> {
        let last = self
            .control
            .get()
            .and_then(|control| control.probe().last_call(moved))
            .filter(|last| last.seq == live.seq && last.sequence.peer() == live.peer);
        if last.is_none() {
            *moved = MovedBytes::default();
        }
        last
    }

    /// Everything recorded, as a dump written for `reason`. The ring is copied under the
    /// lock; the entries are built outside it.
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(2, 4, "gloo", FlightConfig::default());
    /// let dump = recorder.snapshot("requested");
    /// assert_eq!((dump.rank, dump.world_size, dump.recorded, dump.reason.as_str()), (2, 4, 0, "requested"));
    /// ```
    pub fn snapshot(&self, reason: &str) -> FlightDump {
        let mut slots: Vec<Slot> = Vec::with_capacity(self.config.entries);
        let (recorded, live) = {
            let book = self.lock();
            slots.extend(book.ring.iter().cloned());
            // Under the lock, so that the running call cannot finish between the two.
            (book.ring.recorded(), self.live.read())
        };
        let mut moved = MovedBytes::default();
        let last = live
            .as_ref()
            .and_then(|live| self.last_call(live, &mut moved));
        let entries = slots
            .iter_mut()
            .map(|slot| match &live {
                Some(live) if live.call == slot.call => {
                    settle(slot, live, last.as_ref());
                    slot.peers = moved;
                    slot.state = CallState::Running;
                    let waiting = last.and_then(|last| last.blocked_on);
                    entry(slot, self.issued_us(slot), waiting)
                }
                _ => entry(slot, self.issued_us(slot), None),
            })
            .collect();
        FlightDump {
            format: FORMAT_VERSION,
            rank: self.rank,
            world_size: self.world_size,
            group: self.config.group.clone(),
            backend: self.backend.into(),
            transport: self.config.transport.into(),
            host: host_name(),
            pid: std::process::id(),
            reason: reason.into(),
            dumped_at_us: self.now(),
            capacity: self.config.entries,
            recorded,
            entries,
        }
    }

    /// Writes `dump` to [`FlightRecorder::dump_path`]; returns where, or `None` without
    /// a directory.
    fn write(&self, dump: &FlightDump) -> Option<PathBuf> {
        let path = self.dump_path()?;
        let written = serde_json::to_vec_pretty(dump)
            .map_err(std::io::Error::from)
            .and_then(|bytes| write_atomically(&path, &bytes));
        match written {
            Ok(()) => {
                tracing::info!(rank = self.rank, path = %path.display(), reason = %dump.reason,
                    "wrote the flight recorder's dump");
                Some(path)
            }
            Err(e) => {
                tracing::warn!(rank = self.rank, path = %path.display(), error = %e,
                    "could not write the flight recorder's dump; check RINGCCL_FLIGHT_DIR");
                None
            }
        }
    }

    /// Writes the dump now, for `reason` (`"requested"`), when there is a directory.
    ///
    /// ```
    /// # use ringccl_observe::flight::{FlightConfig, FlightRecorder};
    /// let recorder = FlightRecorder::new(0, 1, "gloo", FlightConfig::default());
    /// assert_eq!(recorder.dump("requested"), None, "no directory, no file");
    /// ```
    pub fn dump(&self, reason: &str) -> Option<PathBuf> {
        self.config.dir.as_ref()?;
        self.write(&self.snapshot(reason))
    }

    /// The group broke, for `reason`: the first time, with a directory, takes the dump
    /// (calls still running show as running), to be written by
    /// [`FlightRecorder::write_break`] once the caller has released its locks.
    pub(crate) fn break_snapshot(&self, reason: &str) -> Option<FlightDump> {
        self.config.dir.as_ref()?;
        if self.dumped_on_break.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(self.snapshot(reason))
    }

    /// Writes a dump taken by [`FlightRecorder::break_snapshot`].
    pub(crate) fn write_break(&self, dump: Option<FlightDump>) {
        if let Some(dump) = dump {
            self.write(&dump);
        }
    }

    /// For the request thread: when a peer has aborted the group and this rank has not
    /// taken its break dump yet, takes it. This is how a rank that runs no call (it
    /// computes, or waits in user code) leaves its record; a rank inside a call usually
    /// takes it first, from its runner, as the call fails.
    pub(crate) fn dump_if_aborted(&self) {
        let Some(control) = self.control.get() else {
            return;
        };
        if !control.is_aborted() || self.dumped_on_break.load(Ordering::Acquire) {
            return;
        }
        let Some(record) = control.aborted() else {
            return;
        };
        if record.origin == self.rank {
            return;
        }
        let reason = format!(
            "group broken: rank {} aborted the group: {}",
            record.origin, record.reason
        );
        let dump = self.break_snapshot(&reason);
        self.write_break(dump);
    }
}

/// The reason a dump for the break caused by `error` gives (read back by
/// [`FlightDump::ending`], with [`FlightRecorder::dump_if_aborted`]'s).
pub(crate) fn break_reason(error: &Error) -> String {
    match error {
        Error::Timeout { .. } => format!("timeout: {error}"),
        _ => format!("group broken: {error}"),
    }
}

/// Writes what was recorded of a call that started into the call's slot: `live`, as
/// the recorder numbered it, and `last`, what the group's probe says the call is (its
/// bytes are written into the slot by [`FlightRecorder::last_call`]).
fn settle(slot: &mut Slot, live: &LiveRecord, last: Option<&LastCall>) {
    slot.seq = Some(live.seq);
    slot.started_us = Some(live.started_us.unwrap_or(AT_ISSUE));
    slot.peer = live.peer;
    if let Some(last) = last {
        if let Some((op, algorithm)) = last.described {
            slot.op = Some(op);
            slot.algorithm = Some(algorithm);
        }
    }
}

/// `all_reduce(sum, 1024 x f32)`: the op's description without its number.
fn describe(op: &OpDesc) -> String {
    let text = op.to_string();
    text.splitn(3, ' ')
        .nth(2)
        .map(str::to_string)
        .unwrap_or(text)
}

/// `slot`'s dump entry; `issued_us`: its issue time in Unix microseconds.
/// `blocked_on`: for the running call, the peer it waits for.
fn entry(slot: &Slot, issued_us: u64, blocked_on: Option<usize>) -> FlightEntry {
    let started_us = slot
        .started_us
        .map(|at| if at == AT_ISSUE { issued_us } else { at });
    let p2p = slot.peer.is_some()
        || slot
            .op
            .is_some_and(|op| op.kind == CollectiveKind::SendRecv);
    let counts = &slot.peers;
    FlightEntry {
        call: slot.call,
        op: slot.seq,
        kind: match slot.op {
            Some(op) if !p2p => op.kind.name().into(),
            _ => slot.kind.into(),
        },
        description: slot
            .op
            .as_ref()
            .map_or_else(|| slot.kind.to_string(), describe),
        dtype: slot.op.and_then(|op| op.dtype).map(|d| d.name().into()),
        count: slot.op.map_or(0, |op| op.count),
        reduce_op: slot.op.and_then(|op| op.op).map(|o| o.name().into()),
        root: if p2p {
            slot.peer
        } else {
            slot.op.and_then(|op| op.root).map(|r| r as usize)
        },
        algorithm: slot.algorithm.map(|a| a.label().into()),
        state: slot.state,
        issued_us,
        started_us,
        // The end is read from the tick clock; it never falls before the start.
        ended_us: slot
            .ended_us
            .map(|at| at.max(started_us.unwrap_or(issued_us))),
        peers: counts
            .used()
            .iter()
            .map(|c| PeerBytes {
                peer: c.peer,
                sent: c.sent,
                received: c.received,
            })
            .collect(),
        other_peers: counts
            .others
            .map(|(sent, received)| OtherPeers { sent, received }),
        blocked_on,
        error: slot.error.clone(),
    }
}

/// This host's name (Linux), or empty.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

impl Drop for FlightRecorder {
    fn drop(&mut self) {
        if let Some(beacon) = &self.beacon {
            if !self.dumped_on_break.load(Ordering::Acquire) {
                beacon.remove();
            }
        }
    }
}

impl fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("rank", &self.rank)
            .field("group", &self.config.group)
            .field("entries", &self.config.entries)
            .field("dir", &self.config.dir)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
