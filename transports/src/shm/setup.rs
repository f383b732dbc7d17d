//! Setting up shared memory, collectively: every rank on one host? every inbox created?
//! every inbox mapped? Each step's outcome — and, when it failed, why — is published
//! through the rendezvous store, so every rank takes the same decision and can say why.
//! While it waits for a peer, it watches that peer's connection: a rank that dies in the
//! middle of set-up is named within moments, not at the start-up deadline.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn};

use super::inbox::{open_peer, OwnInbox, Ticket};
use super::mapping::Mapping;
use super::ring::{can_read_owner, inbox_len, publish_own_address, Rings};
use crate::host_map::{exchange, host_identity};
use crate::setup_errors::ShmUnavailable;
use crate::HostMap;
use crate::{PeerWatch, SetupStore, WatchedStore};

/// The step [`PeerGone`](crate::PeerGone) errors name.
const STEP: &str = "shared-memory set-up";

/// Ends a rank's list of mapped peers when it can read every one's memory.
const READS_PEERS: &str = ";reads";

/// Every rank's inbox, mapped: what [`ShmTransport::new`](super::ShmTransport::new)
/// needs besides the liveness connections.
pub struct SharedRings {
    pub(super) rings: Rings,
    /// Where every rank runs.
    pub(super) map: HostMap,
    /// Every pair of the group's ranks shares memory, as every rank learnt alike from
    /// what each published: the barrier in memory is for this group.
    pub(super) with_every_rank: bool,
    /// `processes[r]`: the process of rank `r`, for the ranks this rank shares memory
    /// with and may read the memory of; all `None` unless every rank of the group can
    /// read every other's (as every rank learnt alike at set-up).
    pub(super) processes: Vec<Option<u32>>,
}

impl SharedRings {
    /// No memory shared with any of the `n` ranks, which run where `map` says.
    fn without_rings(n: usize, ring_bytes: usize, map: HostMap) -> SharedRings {
        SharedRings {
            rings: Rings {
                ring_bytes,
                inboxes: (0..n).map(|_| None).collect(),
                slots: vec![None; n],
                tails_seen: (0..n).map(|_| AtomicU64::new(0)).collect(),
            },
            map,
            with_every_rank: false,
            processes: vec![None; n],
        }
    }

    /// Whether this rank shares memory with `peer`.
    ///
    /// ```no_run
    /// # fn f(rings: ringccl_transports::shm::SharedRings) {
    /// println!("{}", if rings.shares_memory_with(1) { "shm" } else { "tcp" });
    /// # }
    /// ```
    pub fn shares_memory_with(&self, peer: usize) -> bool {
        self.rings.has(peer)
    }

    /// Whether every pair of the group's ranks shares memory (the same answer on every
    /// rank, from what each rank published at set-up).
    ///
    /// ```
    /// # fn f(rings: ringccl_transports::shm::SharedRings) {
    /// if rings.shared_by_every_pair() {
    ///     assert!(rings.shares_memory_with(1));
    /// }
    /// # }
    /// ```
    pub fn shared_by_every_pair(&self) -> bool {
        self.with_every_rank
    }
}

impl std::fmt::Debug for SharedRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRings")
            .field("ranks", &self.rings.inboxes.len())
            .field("ring_bytes", &self.rings.ring_bytes)
            .field("hosts", &self.map.hosts)
            .finish()
    }
}

/// Sets up shared memory between the `n` ranks of job `job`, collectively: every rank
/// must call it. Each rank shares memory with the other ranks of its host that it can
/// (see the [module](super) docs); the result says with which, and where every rank
/// runs, for a transport that reaches the others over TCP. A pair that cannot share
/// memory logs why and uses TCP; with `required`, any rank elsewhere or any pair that
/// cannot is an error that says why, on every rank. Inboxes never have a name in `/dev/shm`, and their space is
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
/// // Not required: a group of one shares memory with nobody.
/// let rings = shm::set_up(&mut OneRank::default(), &no_peers, 0, 1, 7, 4096, deadline, false)?;
/// assert!(rings.is_some_and(|r| !r.shares_memory_with(0)));
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
    set_up_as(store, &group, &host_identity(), ring_bytes)
}

/// [`set_up`] for a rank whose host identity is `me` (a test gives several ranks of one
/// process different hosts).
pub(super) fn set_up_as<S: SetupStore + ?Sized, W: PeerWatch + ?Sized>(
    store: &mut WatchedStore<'_, S, W>,
    group: &Group,
    me: &str,
    ring_bytes: usize,
) -> Result<Option<SharedRings>, S::Error> {
    let (rank, n, deadline) = (group.rank, group.n, group.deadline);
    // 1. Which ranks share this host: those that report this rank's identity.
    let map = exchange(store, rank, n, me, deadline)?;
    let local = map.ranks_with(rank);
    let elsewhere = map.first_elsewhere(rank);
    if let (Some((peer, theirs)), true) = (&elsewhere, group.required) {
        let reason = format!(
            "it needs every rank on one host (and in one PID namespace), but rank {peer} \
             runs on {theirs:?} and this rank on {me:?}"
        );
        return group.decline(store, reason);
    }
    if local.len() < 2 {
        info!(rank, "no other rank on this host: TCP to every peer");
        return Ok(Some(SharedRings::without_rings(n, ring_bytes, map)));
    }
    // 2. Create this rank's inbox, with a ring for every local rank, reserving its
    // space; publish where the local peers find it.
    let len = inbox_len(local.len(), ring_bytes);
    let created = OwnInbox::create(len, local.len());
    if let Ok(own) = &created {
        publish_own_address(own.mapping());
    }
    let outcome = match &created {
        Ok(own) => Ok(own.ticket().encode()),
        Err(reason) => Err(format!("creating its inbox: {reason}")),
    };
    let tickets = gather(store, "created", rank, &local, outcome, deadline)?;
    if group.required {
        if let Some(Err(reason)) = tickets.iter().find(|t| t.is_err()) {
            return group.decline(store, reason.clone());
        }
    }
    // 3. Map the inbox of every local peer that created one: the probe. A peer that
    // reports this host but whose inbox cannot be opened from here (another /dev/shm,
    // another user) is not one to share memory with.
    let mut mapped = Vec::new();
    let mut why_not: Vec<(usize, String)> = Vec::new();
    // Whether this rank can read the memory of every peer it mapped (cross-memory
    // attach), and if not, why.
    let mut cannot_read: Option<(usize, String)> = None;
    match &created {
        Ok(own) => {
            for (&peer, ticket) in local.iter().zip(&tickets) {
                if peer == rank {
                    continue;
                }
                let opened = match ticket {
                    Err(reason) => Err(reason.clone()),
                    Ok(ticket) => match Ticket::decode(ticket) {
                        Some(ticket) => open_peer(&ticket, len, own.owner())
                            .map(|mapping| (mapping, ticket.pid()))
                            .map_err(|e| {
                                format!(
                                    "mapping rank {peer}'s inbox ({}): {e}",
                                    ticket.path().display()
                                )
                            }),
                        None => Err(format!(
                            "rank {peer} published an unreadable inbox ticket {ticket:?}"
                        )),
                    },
                };
                match opened {
                    Ok((mapping, pid)) => {
                        if cannot_read.is_none() {
                            if let Err(reason) = can_read_owner(&mapping, pid) {
                                cannot_read = Some((peer, reason));
                            }
                        }
                        mapped.push((peer, mapping, pid));
                    }
                    Err(reason) => why_not.push((peer, reason)),
                }
            }
        }
        Err(reason) => why_not.extend(
            local
                .iter()
                .filter(|&&p| p != rank)
                .map(|&p| (p, format!("this rank could not create its inbox: {reason}"))),
        ),
    }
    let list: Vec<String> = mapped.iter().map(|(peer, ..)| peer.to_string()).collect();
    // "0,2,3" (the peers mapped), then ";reads" when this rank can read every one's
    // memory.
    let reads = if cannot_read.is_none() && created.is_ok() {
        READS_PEERS
    } else {
        ""
    };
    let published = format!("{}{reads}", list.join(","));
    let theirs = gather(store, "mapped", rank, &local, Ok(published), deadline)?;
    // Every local peer has opened this rank's inbox (or given up): close it to everyone
    // else.
    let own = created.map(OwnInbox::into_mapping);
    // 4. Shared memory with the peers each of the two could map. `mapped_by[i]`: the
    // ranks local rank `local[i]` mapped (none if its list was unreadable).
    let mapped_by: Vec<Vec<usize>> = theirs
        .iter()
        .map(|list| {
            let list = list.as_deref().unwrap_or("");
            let list = list.strip_suffix(READS_PEERS).unwrap_or(list);
            list.split(',').filter_map(|p| p.parse().ok()).collect()
        })
        .collect();
    let every_rank_reads = theirs
        .iter()
        .all(|list| list.as_deref().is_ok_and(|l| l.ends_with(READS_PEERS)));
    let maps = |a: usize, b: usize| {
        let index = local.iter().position(|&p| p == a);
        index
            .and_then(|i| mapped_by.get(i))
            .is_some_and(|l| l.contains(&b))
    };
    let mut inboxes: Vec<Option<Arc<Mapping>>> = (0..n).map(|_| None).collect();
    let mut processes: Vec<Option<u32>> = vec![None; n];
    for (peer, mapping, pid) in mapped {
        if maps(peer, rank) {
            if let Some(slot) = inboxes.get_mut(peer) {
                *slot = Some(Arc::new(mapping));
            }
            if let Some(slot) = processes.get_mut(peer) {
                *slot = Some(pid);
            }
        } else {
            why_not.push((
                peer,
                format!("rank {peer} could not map this rank's inbox (its log says why)"),
            ));
        }
    }
    why_not.sort_by_key(|(peer, _)| *peer);
    if group.required {
        // Every rank must share memory with every other: all decline alike if a pair
        // cannot, the one that failed with its own reason.
        let missing = local.iter().find_map(|&a| {
            let b = local.iter().copied().find(|&b| b != a && !maps(a, b))?;
            Some((a, b))
        });
        if let Some((a, b)) = missing {
            let reason = match why_not.first() {
                Some((_, reason)) if a == rank => reason.clone(),
                _ => format!("rank {a} could not map rank {b}'s inbox (its log says why)"),
            };
            return group.decline(store, reason);
        }
    }
    let job = format!("{:016x}", group.job);
    if inboxes.iter().all(Option::is_none) {
        if let Some((_, reason)) = why_not.first() {
            warn!(
                rank,
                job, "shared memory cannot be used, so this job runs over TCP: {reason}"
            );
        }
    } else {
        for (peer, reason) in &why_not {
            warn!(
                rank,
                peer,
                job,
                "rank {peer} is on this host, but shared memory with it cannot be set up, so \
                 the two use TCP: {reason}"
            );
        }
    }
    let (Ok(own), true) = (own, inboxes.iter().any(Option::is_some)) else {
        return Ok(Some(SharedRings::without_rings(n, ring_bytes, map)));
    };
    if let Some(slot) = inboxes.get_mut(rank) {
        *slot = Some(Arc::new(own));
    }
    let mut slots = vec![None; n];
    for (position, &peer) in local.iter().enumerate() {
        if let Some(slot) = slots.get_mut(peer) {
            *slot = Some(position);
        }
    }
    // Every rank reads the same published lists, so every rank reaches the same answer.
    let with_every_rank = local.len() == n
        && local
            .iter()
            .all(|&a| local.iter().all(|&b| a == b || maps(a, b)));
    let reads_peer_memory = with_every_rank && every_rank_reads;
    if with_every_rank && !reads_peer_memory {
        let reason = match &cannot_read {
            Some((peer, reason)) => format!("this rank cannot read rank {peer}'s: {reason}"),
            None => "another rank cannot (its log says why)".into(),
        };
        info!(
            rank,
            "ranks do not read each other's memory, so an all-reduce asked to read the \
             peers' buffers (RINGCCL_ALGO=pm) goes through the rings: {reason}"
        );
    }
    if !reads_peer_memory {
        processes = vec![None; n];
    }
    Ok(Some(SharedRings {
        with_every_rank,
        processes,
        rings: Rings {
            ring_bytes,
            inboxes,
            slots,
            tails_seen: (0..n).map(|_| AtomicU64::new(0)).collect(),
        },
        map,
    }))
}

/// The facts of the job that set-up and giving up need.
pub(super) struct Group {
    pub(super) rank: usize,
    pub(super) n: usize,
    pub(super) job: u64,
    pub(super) deadline: Instant,
    pub(super) required: bool,
}

impl Group {
    /// Rank `rank` of `n` in a test's job, its deadline 20 s away.
    #[cfg(test)]
    pub(super) fn for_test(rank: usize, n: usize, required: bool) -> Group {
        Group {
            rank,
            n,
            job: 1,
            deadline: Instant::now() + std::time::Duration::from_secs(20),
            required,
        }
    }

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
/// learns that of every rank in `ranks` (this one among them): their outcomes, in the
/// order of `ranks`, each with the reason it failed, said from this rank's side.
fn gather<S: SetupStore + ?Sized, W: PeerWatch + ?Sized>(
    store: &mut WatchedStore<'_, S, W>,
    step: &str,
    rank: usize,
    ranks: &[usize],
    outcome: Result<String, String>,
    deadline: Instant,
) -> Result<Vec<Result<String, String>>, S::Error> {
    let published = match &outcome {
        Ok(payload) => format!("ok:{payload}"),
        Err(reason) => format!("err:{reason}"),
    };
    store.set(&format!("ringccl/shm/{step}/{rank}"), published.as_bytes())?;
    let mut outcomes = Vec::with_capacity(ranks.len());
    for &peer in ranks {
        let key = format!("ringccl/shm/{step}/{peer}");
        let value = store.wait_for(peer, &key, deadline, &|| {
            format!("rank {peer} to finish setting up shared memory ({step})")
        })?;
        let value = String::from_utf8_lossy(&value).into_owned();
        outcomes.push(
            match (value.strip_prefix("ok:"), value.strip_prefix("err:")) {
                (Some(payload), _) => Ok(payload.to_string()),
                (None, Some(reason)) if peer == rank => Err(reason.to_string()),
                (None, Some(reason)) => Err(format!("rank {peer} failed: {reason}")),
                (None, None) => Err(format!(
                    "rank {peer} published an unreadable outcome {value:?}"
                )),
            },
        );
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::shm::test_store::{MemoryStore, StoreError};

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
        let (sent, _) = rings[0]
            .rings
            .write(0, 2, &[std::io::IoSlice::new(b"ring")]);
        assert_eq!(sent, 4);
        let mut got = [0u8; 4];
        let (read, _) = rings[2]
            .rings
            .read(2, 0, &mut [std::io::IoSliceMut::new(&mut got)]);
        assert_eq!((read, &got), (4, b"ring"));
    }

    /// Ranks 0 and 1 share a host with rank 2, whose inbox cannot be mapped (a ticket
    /// that names no inbox): 0 and 1 share memory, and each uses TCP with rank 2.
    #[test]
    fn a_pair_that_cannot_share_memory_falls_back_alone() {
        if !have_shm() {
            return;
        }
        let mut store = MemoryStore::default();
        store.set("ringccl/host/2", b"here").unwrap();
        store.set("ringccl/shm/created/2", b"ok:garbage").unwrap();
        store.set("ringccl/shm/mapped/2", b"ok:0,1").unwrap();
        let rings: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|rank| {
                    let mut store = store.clone();
                    s.spawn(move || {
                        let group = Group::for_test(rank, 3, false);
                        let mut store = WatchedStore::new(&mut store, &all_there, rank, 3, STEP);
                        set_up_as(&mut store, &group, "here", RING).unwrap()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        for (rank, rings) in rings.iter().enumerate() {
            let shared: Vec<bool> = (0..3).map(|peer| rings.rings.has(peer)).collect();
            assert_eq!(shared, [true, true, false], "rank {rank}");
        }
        // The same job required to share memory everywhere: an error naming the pair.
        let group = Group {
            deadline: Instant::now() + Duration::from_millis(500),
            ..Group::for_test(0, 3, true)
        };
        let mut alone = store.clone();
        alone.set("ringccl/host/1", b"here").unwrap();
        alone.set("ringccl/shm/declined/1", b"1").unwrap();
        alone.set("ringccl/shm/declined/2", b"1").unwrap();
        alone
            .set("ringccl/shm/created/1", b"err:creating its inbox: full")
            .unwrap();
        let mut watched = WatchedStore::new(&mut alone, &all_there, 0, 3, STEP);
        match set_up_as(&mut watched, &group, "here", RING) {
            Err(StoreError::Unavailable(e)) => assert!(e.reason.contains("rank 1 failed"), "{e}"),
            other => panic!("{:?}", other.map(|r| r.is_some())),
        }
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
            match rank_0_against(ticket, false) {
                Ok(Some(rings)) => assert!(!rings.shares_memory_with(1), "{ticket}"),
                other => panic!("{ticket}: {:?}", other.map(|r| r.is_some())),
            }
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
