//! Setting up shared memory, collectively: every rank on one host? every inbox created?
//! every inbox mapped? Each step's outcome — and, when it failed, why — is published
//! through the rendezvous store, so every rank takes the same decision and can say why.
//! While it waits for a peer, it watches that peer's connection: a rank that dies in the
//! middle of set-up is named within moments, not at the start-up deadline.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use tracing::{info, warn};

use super::inbox::{open_peer, OwnInbox, Ticket};
use super::ring::{inbox_len, Rings};
use crate::{PeerWatch, SetupStore, WatchedStore};

/// The step [`PeerGone`](crate::PeerGone) errors name.
const STEP: &str = "shared-memory set-up";

/// This machine's identity, as far as sharing memory goes: ranks with equal identities
/// share memory. The PID namespace is part of it, because peers open each other's
/// inboxes through `/proc/<pid>/fd`.
fn host_identity() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let pid_namespace = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!(
        "{}/{}/{pid_namespace}",
        read("/proc/sys/kernel/hostname").trim(),
        read("/proc/sys/kernel/random/boot_id").trim()
    )
}

/// Shared memory was required (`RINGCCL_TRANSPORT=shm`) but cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("rank {rank}: shared-memory transport: {reason}; or use RINGCCL_TRANSPORT=tcp")]
pub struct ShmUnavailable {
    /// The rank that reports it.
    pub rank: usize,
    /// Why (another host, an inbox that could not be created, reserved or mapped).
    pub reason: String,
}

/// Every rank's inbox, mapped: what [`ShmTransport::new`](super::ShmTransport::new)
/// needs besides the liveness connections.
pub struct SharedRings(pub(super) Rings);

impl std::fmt::Debug for SharedRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRings")
            .field("ranks", &self.0.inboxes.len())
            .field("ring_bytes", &self.0.ring_bytes)
            .finish()
    }
}

/// Sets up shared memory between the `n` ranks of job `job`, collectively: every rank
/// must call it. `Ok(None)` when some rank is on another host or could not set it up
/// (every rank then sees `None`, logs why, and keeps TCP); with `required`, those cases
/// are errors that say why. Inboxes never have a name in `/dev/shm`, and their space is
/// reserved here, so a full `/dev/shm` is an error now rather than a SIGBUS later; no
/// descriptor on them is left open once this returns, and the kernel frees them when
/// the last rank unmaps them, even if a process is killed (see the [module](super) docs).
///
/// `job` only labels the log lines: inboxes are found through the store. `peers` tells
/// whether a peer's process has gone away (ringccl passes the mesh's connections):
/// waiting for a peer that has gone ends at once with [`PeerGone`](crate::PeerGone),
/// in either mode, as does a failing store while a peer has gone (rank 0 hosts it).
///
/// ```
/// use std::collections::HashMap;
/// use std::time::{Duration, Instant};
/// use ringccl_transports::{shm, PeerGone, SetupStore};
///
/// /// A store for a group of one (ringccl passes its rendezvous store).
/// #[derive(Default)]
/// struct OneRank(HashMap<String, Vec<u8>>);
///
/// #[derive(Debug, thiserror::Error)]
/// enum Failed {
///     #[error(transparent)]
///     Shm(#[from] shm::ShmUnavailable),
///     #[error(transparent)]
///     Gone(#[from] PeerGone),
///     #[error("nobody published {0}")]
///     Missing(String),
/// }
///
/// impl SetupStore for OneRank {
///     type Error = Failed;
///     fn set(&mut self, key: &str, value: &[u8]) -> Result<(), Failed> {
///         self.0.insert(key.into(), value.into());
///         Ok(())
///     }
///     fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Failed> {
///         Ok(self.0.get(key).cloned())
///     }
///     fn wait(&mut self, key: &str, _: Instant, what: &dyn Fn() -> String)
///         -> Result<Vec<u8>, Failed> {
///         self.0.get(key).cloned().ok_or_else(|| Failed::Missing(what()))
///     }
/// }
///
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let no_peers = |_peer: usize| false;
/// // Not required: `None`, and a logged warning saying why, where it cannot work.
/// let rings = shm::set_up(&mut OneRank::default(), &no_peers, 0, 1, 7, 4096, deadline, false)?;
/// println!("{}", if rings.is_some() { "shared memory" } else { "TCP" });
/// # Ok::<(), Failed>(())
/// ```
#[allow(clippy::too_many_arguments)] // every argument is one fact of the job; a struct would only rename them
pub fn set_up<S: SetupStore + ?Sized, W: PeerWatch + ?Sized>(
    store: &mut S,
    peers: &W,
    rank: usize,
    n: usize,
    job: u64,
    ring_bytes: usize,
    deadline: Instant,
    required: bool,
) -> Result<Option<SharedRings>, S::Error> {
    let group = Group {
        rank,
        n,
        job,
        deadline,
        required,
    };
    let store = &mut WatchedStore::new(store, peers, rank, n, STEP);
    let decline = |store: &mut WatchedStore<'_, S, W>, reason: String| group.decline(store, reason);
    // 1. Every rank on this host?
    let me = host_identity();
    store.set(&format!("ringccl/host/{rank}"), me.as_bytes())?;
    for peer in 0..n {
        let theirs = store.wait_for(peer, &format!("ringccl/host/{peer}"), deadline, &|| {
            format!("rank {peer} to report its host")
        })?;
        if theirs != me.as_bytes() {
            let reason = format!(
                "it needs every rank on one host (and in one PID namespace), but rank {peer} \
                 runs on {:?} and this rank on {me:?}",
                String::from_utf8_lossy(&theirs)
            );
            if required {
                return decline(store, reason);
            }
            info!(rank, "ranks on several hosts: using TCP");
            return Ok(None);
        }
    }
    // 2. Create this rank's inbox, reserving its space; publish where peers find it.
    let len = inbox_len(n, ring_bytes);
    let created = OwnInbox::create(len, n);
    let outcome = match &created {
        Ok(own) => Ok(own.ticket().encode()),
        Err(reason) => Err(format!("creating its inbox: {reason}")),
    };
    let tickets = match agree(store, "created", rank, n, outcome, deadline)? {
        Ok(tickets) => tickets,
        Err(reason) => return decline(store, reason), // `created` drops: its memory is freed
    };
    let Ok(own) = created else {
        return decline(store, "this rank could not create its inbox".into());
    };
    // 3. Map every other rank's inbox, once it has passed the checks.
    let mut inboxes = Vec::with_capacity(n);
    let mut map_error = None;
    for (peer, ticket) in tickets.iter().enumerate() {
        if peer == rank {
            continue;
        }
        let mapped = match Ticket::decode(ticket) {
            Some(ticket) => open_peer(&ticket, len, own.owner())
                .map_err(|e| format!("rank {peer}'s inbox ({}): {e}", ticket.path().display())),
            None => Err(format!(
                "rank {peer} published an unreadable inbox ticket {ticket:?}"
            )),
        };
        match mapped {
            Ok(mapping) => inboxes.push((peer, mapping)),
            Err(e) => {
                map_error = Some(format!("mapping {e}"));
                break;
            }
        }
    }
    let outcome = map_error.map_or(Ok(String::new()), Err);
    let all_mapped = agree(store, "mapped", rank, n, outcome, deadline);
    // Every peer has opened this rank's inbox (or given up): close it to everyone else.
    let own = own.into_mapping();
    if let Err(reason) = all_mapped? {
        return decline(store, reason);
    }
    inboxes.push((rank, own));
    inboxes.sort_by_key(|(r, _)| *r);
    Ok(Some(SharedRings(Rings {
        ring_bytes,
        inboxes: inboxes.into_iter().map(|(_, m)| m).collect(),
        tails_seen: (0..n).map(|_| AtomicU64::new(0)).collect(),
    })))
}

/// The facts of the job that giving up needs.
struct Group {
    rank: usize,
    n: usize,
    job: u64,
    deadline: Instant,
    required: bool,
}

impl Group {
    /// Gives up on shared memory, as every rank does at this same step. Not required:
    /// logs why and keeps TCP (start-up goes on, and `Mesh::finish` keeps the store up
    /// until everyone is done with it). Required: the error, once rank 0 has seen every
    /// rank come this far — its failing start-up takes the store away, and a rank still
    /// reading the outcome would get "connection closed" instead of the reason.
    fn decline<S: SetupStore + ?Sized, W: PeerWatch + ?Sized>(
        &self,
        store: &mut WatchedStore<'_, S, W>,
        reason: String,
    ) -> Result<Option<SharedRings>, S::Error> {
        let rank = self.rank;
        if !self.required {
            warn!(
                rank,
                job = format_args!("{:016x}", self.job),
                "shared memory cannot be used, so this job runs over TCP: {reason}"
            );
            return Ok(None);
        }
        let error = ShmUnavailable { rank, reason };
        // Best effort: the error to report is the reason, whatever the store says.
        if store
            .set(&format!("ringccl/shm/declined/{rank}"), b"1")
            .is_ok()
            && rank == 0
        {
            for peer in 1..self.n {
                let key = format!("ringccl/shm/declined/{peer}");
                // A rank that went away will never give up: stop waiting for it.
                if store
                    .wait_for(peer, &key, self.deadline, &|| {
                        format!("rank {peer} to give up too")
                    })
                    .is_err()
                {
                    break;
                }
            }
        }
        Err(S::Error::from(error))
    }
}

/// Publishes this rank's outcome of a set-up step (a payload, or why it failed) and
/// learns everyone's. `Ok(Ok(payloads))`, by rank, when every rank succeeded; else
/// `Ok(Err(why))` naming the first rank that failed — the same answer on every rank.
fn agree<S: SetupStore + ?Sized, W: PeerWatch + ?Sized>(
    store: &mut WatchedStore<'_, S, W>,
    step: &str,
    rank: usize,
    n: usize,
    outcome: Result<String, String>,
    deadline: Instant,
) -> Result<Result<Vec<String>, String>, S::Error> {
    let published = match &outcome {
        Ok(payload) => format!("ok:{payload}"),
        Err(reason) => format!("err:{reason}"),
    };
    store.set(&format!("ringccl/shm/{step}/{rank}"), published.as_bytes())?;
    let mut payloads = Vec::with_capacity(n);
    let mut failure = None;
    for peer in 0..n {
        let key = format!("ringccl/shm/{step}/{peer}");
        let value = store.wait_for(peer, &key, deadline, &|| {
            format!("rank {peer} to finish setting up shared memory ({step})")
        })?;
        let value = String::from_utf8_lossy(&value).into_owned();
        if let Some(payload) = value.strip_prefix("ok:") {
            payloads.push(payload.to_string());
            continue;
        }
        if failure.is_none() {
            failure = Some(match (peer == rank, value.strip_prefix("err:")) {
                (true, Some(reason)) => reason.to_string(),
                (false, Some(reason)) => format!("rank {peer} failed: {reason}"),
                (_, None) => format!("rank {peer} published an unreadable outcome {value:?}"),
            });
        }
        payloads.push(String::new());
    }
    Ok(failure.map_or(Ok(payloads), Err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    /// An in-memory store shared by threads (or by a test playing a hostile rank).
    #[derive(Clone, Default)]
    struct MemoryStore(Arc<(Mutex<Keys>, Condvar)>);

    type Keys = HashMap<String, Vec<u8>>;

    #[derive(Debug, thiserror::Error)]
    enum StoreError {
        #[error(transparent)]
        Unavailable(#[from] ShmUnavailable),
        #[error(transparent)]
        Gone(#[from] crate::PeerGone),
        #[error("timed out waiting for {0}")]
        Timeout(String),
    }

    impl SetupStore for MemoryStore {
        type Error = StoreError;

        fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
            let (map, changed) = &*self.0;
            map.lock().unwrap().insert(key.into(), value.into());
            changed.notify_all();
            Ok(())
        }

        fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(self.0 .0.lock().unwrap().get(key).cloned())
        }

        fn wait(
            &mut self,
            key: &str,
            deadline: Instant,
            waiting_for: &dyn Fn() -> String,
        ) -> Result<Vec<u8>, StoreError> {
            let (map, changed) = &*self.0;
            let mut map = map.lock().unwrap();
            loop {
                if let Some(v) = map.get(key) {
                    return Ok(v.clone());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(StoreError::Timeout(waiting_for()));
                }
                map = changed.wait_timeout(map, left).unwrap().0;
            }
        }
    }

    const RING: usize = 4096;

    /// Every peer still there.
    fn all_there(_peer: usize) -> bool {
        false
    }

    fn have_shm() -> bool {
        let ok = std::path::Path::new(super::super::inbox::SHM_DIR).is_dir();
        if !ok {
            eprintln!("skipped: no /dev/shm on this machine");
        }
        ok
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(20)
    }

    #[test]
    fn ranks_set_up_and_share_their_rings() {
        if !have_shm() {
            return;
        }
        let store = MemoryStore::default();
        let started = Instant::now();
        let rings: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let mut store = store.clone();
                    s.spawn(move || set_up(&mut store, &all_there, rank, 3, 1, RING, soon(), true))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap().unwrap())
                .collect()
        });
        assert!(started.elapsed() < Duration::from_secs(20));
        // Rank 0 writes to rank 2; rank 2 reads it from its own inbox.
        let sent = rings[0].0.write(0, 2, &[std::io::IoSlice::new(b"ring")]);
        assert_eq!(sent, 4);
        let mut got = [0u8; 4];
        let read = rings[2]
            .0
            .read(2, 0, &mut [std::io::IoSliceMut::new(&mut got)]);
        assert_eq!((read, &got), (4, b"ring"));
    }

    /// A store in which rank 1 of a two-rank job on this host has published its host and,
    /// with `created`, the outcome of creating its inbox.
    fn rank_1_published(created: Option<&str>) -> MemoryStore {
        let mut store = MemoryStore::default();
        store
            .set("ringccl/host/1", host_identity().as_bytes())
            .unwrap();
        if let Some(created) = created {
            store
                .set("ringccl/shm/created/1", created.as_bytes())
                .unwrap();
        }
        store
    }

    /// Plays rank 1 of a two-rank job that publishes `ticket` as its inbox, and runs
    /// rank 0's set-up against it.
    fn rank_0_against(ticket: &str, required: bool) -> Result<Option<SharedRings>, StoreError> {
        let mut store = rank_1_published(Some(&format!("ok:{ticket}")));
        store.set("ringccl/shm/mapped/1", b"ok:").unwrap();
        store.set("ringccl/shm/declined/1", b"1").unwrap();
        set_up(&mut store, &all_there, 0, 2, 1, RING, soon(), required)
    }

    #[test]
    fn a_forged_ticket_is_refused_and_auto_falls_back() {
        if !have_shm() {
            return;
        }
        let len = inbox_len(2, RING);
        let cases = [
            ("garbage", "unreadable inbox ticket".to_string()),
            ("1 2 3 4 5", "expected".to_string()),
            (
                // This process's stdin, at the right length: not an inbox.
                &*format!("{} 0 0 0 {len}", std::process::id()),
                "rank 1's inbox (/proc/".to_string(),
            ),
        ];
        for (ticket, why) in &cases {
            let started = Instant::now();
            match rank_0_against(ticket, true) {
                Err(StoreError::Unavailable(e)) => {
                    assert!(e.to_string().contains(why.as_str()), "{ticket}: {e}");
                    assert!(e.to_string().contains("RINGCCL_TRANSPORT=tcp"), "{e}");
                }
                other => panic!("{ticket}: {:?}", other.map(|r| r.is_some())),
            }
            assert!(started.elapsed() < Duration::from_secs(10));
            assert!(matches!(rank_0_against(ticket, false), Ok(None)));
        }
    }

    #[test]
    fn every_rank_learns_why_another_could_not_create_its_inbox() {
        let mut store = rank_1_published(Some("err:creating its inbox: /dev/shm is full: ..."));
        store.set("ringccl/shm/declined/1", b"1").unwrap();
        let err = match set_up(&mut store, &all_there, 0, 2, 1, RING, soon(), true) {
            Err(StoreError::Unavailable(e)) => e,
            other => panic!("{:?}", other.map(|r| r.is_some())),
        };
        assert_eq!(err.rank, 0);
        assert!(
            err.reason
                .contains("rank 1 failed: creating its inbox: /dev/shm is full"),
            "{err}"
        );
    }

    #[test]
    fn rank_0_keeps_the_store_until_every_rank_has_the_reason() {
        // Rank 1 reports a failure, then takes its time to read everyone's outcome;
        // rank 0 (which hosts the store) must not return before rank 1 has given up too.
        let mut store = rank_1_published(Some("err:creating its inbox: full"));
        let started = Instant::now();
        let mut rank_1 = store.clone();
        let slow = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            rank_1.set("ringccl/shm/declined/1", b"1").unwrap();
        });
        let err = set_up(&mut store, &all_there, 0, 2, 1, RING, soon(), true);
        let waited = started.elapsed();
        slow.join().unwrap();
        assert!(matches!(err, Err(StoreError::Unavailable(_))), "{err:?}");
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
        // A rank that never comes: rank 0 still reports the reason, by the deadline.
        let mut store = rank_1_published(Some("err:creating its inbox: full"));
        let deadline = Instant::now() + Duration::from_millis(300);
        match set_up(&mut store, &all_there, 0, 2, 1, RING, deadline, true) {
            Err(StoreError::Unavailable(e)) => assert!(e.reason.contains("full"), "{e}"),
            other => panic!("{:?}", other.map(|r| r.is_some())),
        }
        assert!(Instant::now() < deadline + Duration::from_secs(5));
    }

    #[test]
    fn a_silent_rank_ends_set_up_at_the_deadline() {
        let mut store = MemoryStore::default();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let err = set_up(&mut store, &all_there, 0, 2, 1, RING, deadline, false).unwrap_err();
        assert!(
            matches!(&err, StoreError::Timeout(w) if w.contains("rank 1")),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_rank_that_dies_in_set_up_is_named_at_once_in_either_mode() {
        // Rank 1 reports its host, then dies before creating its inbox; the deadline is
        // ten minutes away.
        for required in [true, false] {
            let mut store = rank_1_published(None);
            let rank_1_died = |peer: usize| peer == 1;
            let started = Instant::now();
            let deadline = started + Duration::from_secs(600);
            let err = match set_up(&mut store, &rank_1_died, 0, 2, 1, RING, deadline, required) {
                Err(StoreError::Gone(gone)) => gone,
                other => panic!("{:?}", other.map(|r| r.is_some())),
            };
            assert_eq!((err.rank, err.peer, err.step), (0, 1, STEP));
            let text = err.to_string();
            assert!(
                text.contains("waited for rank 1 to finish setting up shared memory (created)"),
                "{text}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "required={required}"
            );
        }
    }

    #[test]
    fn rank_0_stops_waiting_for_a_dead_rank_to_give_up() {
        // Rank 1 failed to create its inbox, then died before saying it gave up: rank 0
        // reports the reason at once instead of at the deadline.
        let mut store = rank_1_published(Some("err:creating its inbox: full"));
        let rank_1_died = |peer: usize| peer == 1;
        let started = Instant::now();
        let deadline = started + Duration::from_secs(600);
        match set_up(&mut store, &rank_1_died, 0, 2, 1, RING, deadline, true) {
            Err(StoreError::Unavailable(e)) => assert!(e.reason.contains("full"), "{e}"),
            other => panic!("{:?}", other.map(|r| r.is_some())),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
