//! Waiting on the rendezvous store while watching the peers. A start-up step after the
//! mesh (shared-memory set-up) waits for keys its peers publish; a peer that dies
//! publishes nothing more, so the store alone would keep the others waiting until the
//! start-up deadline. Its connections to this rank close at once, though (the kernel
//! closes them), and [`WatchedStore`] looks at them between its questions to the store.

use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::liveness::connection_lost;
use crate::setup_errors::PeerGone;
use crate::SetupStore;

/// Longest pause between two looks at the peers' connections while waiting.
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// Longest pause between two questions to the store while waiting (as the store's own
/// wait does: a large job's ranks all ask rank 0's store).
const ASK_EVERY: Duration = Duration::from_millis(200);
/// How long a failed store request waits for a peer's connection to close too, so that
/// a dead rank 0 (which hosts the store) is named instead of the store's symptom.
const STORE_FAILURE_GRACE: Duration = Duration::from_millis(500);

/// Whether a peer's process has gone away during start-up.
///
/// The rendezvous crate's mesh connections implement it (`[Option<TcpStream>]`, indexed
/// by rank), and so does any `Fn(usize) -> bool`.
///
/// ```
/// use ringccl_transports::PeerWatch;
/// let nobody_leaves = |_peer: usize| false;
/// assert!(!nobody_leaves.gone(1));
/// ```
pub trait PeerWatch {
    /// Whether `peer`'s connection to this rank has closed or failed. Never blocks;
    /// bytes waiting to be read do not count (a peer that finished a step early may
    /// already have sent some).
    fn gone(&self, peer: usize) -> bool;
}

impl PeerWatch for [Option<TcpStream>] {
    fn gone(&self, peer: usize) -> bool {
        self.get(peer)
            .and_then(Option::as_ref)
            .is_some_and(connection_lost)
    }
}

impl<F: Fn(usize) -> bool> PeerWatch for F {
    fn gone(&self, peer: usize) -> bool {
        self(peer)
    }
}

/// The rendezvous store of one start-up step, with the peers' connections watched:
/// waiting for a peer's key ends as soon as that peer's connection closes, and a store
/// that fails while a peer's connection has closed (rank 0 hosts the store) names that
/// peer. The peers are looked at before every question to the store, so when several
/// go, the first one this rank saw go is named as the cause and the others listed.
/// Errors are the store's type, so the caller sees one error type for start-up.
pub struct WatchedStore<'a, S: SetupStore + ?Sized, W: PeerWatch + ?Sized> {
    store: &'a mut S,
    peers: &'a W,
    rank: usize,
    world_size: usize,
    step: &'static str,
    /// The peers whose connections have closed, in the order this rank saw them go.
    gone: Vec<usize>,
}

impl<S: SetupStore + ?Sized, W: PeerWatch + ?Sized> std::fmt::Debug for WatchedStore<'_, S, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedStore")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl<'a, S: SetupStore + ?Sized, W: PeerWatch + ?Sized> WatchedStore<'a, S, W> {
    /// Watches `peers` (ranks `0..world_size` but `rank`) while `store` serves `step`.
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::time::Instant;
    /// use ringccl_transports::{shm::ShmUnavailable, PeerGone, SetupStore, WatchedStore};
    /// # #[derive(Debug)] struct E(String);
    /// # impl std::fmt::Display for E { fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result { f.write_str(&self.0) } }
    /// # impl From<ShmUnavailable> for E { fn from(e: ShmUnavailable) -> E { E(e.to_string()) } }
    /// # impl From<PeerGone> for E { fn from(e: PeerGone) -> E { E(e.to_string()) } }
    /// # #[derive(Default)] struct Memory(HashMap<String, Vec<u8>>);
    /// # impl SetupStore for Memory {
    /// #     type Error = E;
    /// #     fn set(&mut self, k: &str, v: &[u8]) -> Result<(), E> { self.0.insert(k.into(), v.into()); Ok(()) }
    /// #     fn get(&mut self, k: &str) -> Result<Option<Vec<u8>>, E> { Ok(self.0.get(k).cloned()) }
    /// #     fn wait(&mut self, k: &str, _: Instant, w: &dyn Fn() -> String) -> Result<Vec<u8>, E> {
    /// #         self.get(k)?.ok_or_else(|| E(format!("timed out waiting for {}", w())))
    /// #     }
    /// # }
    /// let mut store = Memory::default();
    /// let rank_1_died = |peer: usize| peer == 1;
    /// let mut watched = WatchedStore::new(&mut store, &rank_1_died, 0, 2, "shared-memory set-up");
    /// let deadline = Instant::now() + std::time::Duration::from_secs(600);
    /// let err = watched.wait_for(1, "ready/1", deadline, &|| "rank 1 to be ready".into()).unwrap_err();
    /// assert!(err.0.contains("rank 1 went away during shared-memory set-up"));
    /// ```
    pub fn new(
        store: &'a mut S,
        peers: &'a W,
        rank: usize,
        world_size: usize,
        step: &'static str,
    ) -> Self {
        WatchedStore {
            store,
            peers,
            rank,
            world_size,
            step,
            gone: Vec::new(),
        }
    }

    /// Publishes `value` under `key` (see [`WatchedStore::wait_for`] for its errors).
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::time::Instant;
    /// # use ringccl_transports::{shm::ShmUnavailable, PeerGone, SetupStore, WatchedStore};
    /// # #[derive(Debug)] struct E;
    /// # impl std::fmt::Display for E { fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result { f.write_str("e") } }
    /// # impl From<ShmUnavailable> for E { fn from(_: ShmUnavailable) -> E { E } }
    /// # impl From<PeerGone> for E { fn from(_: PeerGone) -> E { E } }
    /// # #[derive(Default)] struct Memory(HashMap<String, Vec<u8>>);
    /// # impl SetupStore for Memory {
    /// #     type Error = E;
    /// #     fn set(&mut self, k: &str, v: &[u8]) -> Result<(), E> { self.0.insert(k.into(), v.into()); Ok(()) }
    /// #     fn get(&mut self, k: &str) -> Result<Option<Vec<u8>>, E> { Ok(self.0.get(k).cloned()) }
    /// #     fn wait(&mut self, k: &str, _: Instant, _: &dyn Fn() -> String) -> Result<Vec<u8>, E> { self.get(k)?.ok_or(E) }
    /// # }
    /// let mut store = Memory::default();
    /// let everyone_there = |_: usize| false;
    /// let mut watched = WatchedStore::new(&mut store, &everyone_there, 0, 2, "start-up");
    /// watched.set("ready/0", b"1")?;
    /// # Ok::<(), E>(())
    /// ```
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), S::Error> {
        match self.store.set(key, value) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.explain_store_failure(e)),
        }
    }

    /// Waits until `peer` has published `key` and returns its value. Fails
    /// - with [`PeerGone`] (as the store's error type) within moments of `peer`'s
    ///   connection closing, unless `key` was published before it closed;
    /// - with `PeerGone` naming the first peer whose connection this rank saw close, if
    ///   the store itself fails meanwhile (the store's error is quoted);
    /// - with the store's own timeout error, naming `waiting_for()`, at `deadline`.
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::time::Instant;
    /// # use ringccl_transports::{shm::ShmUnavailable, PeerGone, SetupStore, WatchedStore};
    /// # #[derive(Debug)] struct E;
    /// # impl std::fmt::Display for E { fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result { f.write_str("e") } }
    /// # impl From<ShmUnavailable> for E { fn from(_: ShmUnavailable) -> E { E } }
    /// # impl From<PeerGone> for E { fn from(_: PeerGone) -> E { E } }
    /// # #[derive(Default)] struct Memory(HashMap<String, Vec<u8>>);
    /// # impl SetupStore for Memory {
    /// #     type Error = E;
    /// #     fn set(&mut self, k: &str, v: &[u8]) -> Result<(), E> { self.0.insert(k.into(), v.into()); Ok(()) }
    /// #     fn get(&mut self, k: &str) -> Result<Option<Vec<u8>>, E> { Ok(self.0.get(k).cloned()) }
    /// #     fn wait(&mut self, k: &str, _: Instant, _: &dyn Fn() -> String) -> Result<Vec<u8>, E> { self.get(k)?.ok_or(E) }
    /// # }
    /// let mut store = Memory::default();
    /// store.set("ready/1", b"1")?;
    /// let everyone_there = |_: usize| false;
    /// let mut watched = WatchedStore::new(&mut store, &everyone_there, 0, 2, "start-up");
    /// let deadline = Instant::now() + std::time::Duration::from_secs(10);
    /// assert_eq!(watched.wait_for(1, "ready/1", deadline, &|| "rank 1".into())?, b"1");
    /// # Ok::<(), E>(())
    /// ```
    pub fn wait_for(
        &mut self,
        peer: usize,
        key: &str,
        deadline: Instant,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, S::Error> {
        let mut pause = Duration::from_millis(1);
        let mut next_question = Instant::now();
        loop {
            // Look before asking: a peer publishes before it leaves, so a key still
            // missing after its connection was seen closed will never come.
            self.look();
            let peer_gone = self.gone.contains(&peer);
            if peer_gone || Instant::now() >= next_question {
                if let Some(value) = self.get(key)? {
                    return Ok(value);
                }
                if peer_gone {
                    let how = format!(
                        "its connection to this rank closed while this rank waited for {}{}",
                        waiting_for(),
                        self.also_gone(peer)
                    );
                    return Err(self.gone(peer, how).into());
                }
                next_question = Instant::now() + pause;
                pause = (pause * 2).min(ASK_EVERY);
            }
            let now = Instant::now();
            if now >= deadline {
                // The store words its own timeout (the deadline has passed: it returns at once).
                return match self.store.wait(key, deadline, waiting_for) {
                    Ok(value) => Ok(value),
                    Err(e) => Err(self.explain_store_failure(e)),
                };
            }
            let nap = LOOK_EVERY
                .min(next_question.saturating_duration_since(now))
                .min(deadline - now);
            thread::sleep(nap);
        }
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, S::Error> {
        match self.store.get(key) {
            Ok(value) => Ok(value),
            Err(e) => Err(self.explain_store_failure(e)),
        }
    }

    /// Notes the peers whose connections have closed since the last look, in the order
    /// this rank saw them go.
    fn look(&mut self) {
        for peer in 0..self.world_size {
            if peer != self.rank && !self.gone.contains(&peer) && self.peers.gone(peer) {
                self.gone.push(peer);
            }
        }
    }

    /// The error for a failed store request: [`PeerGone`] if some peer's connection has
    /// closed, before it or within [`STORE_FAILURE_GRACE`] after it; else the store's
    /// own error. It names the first peer this rank saw go (of several seen at once, the
    /// lowest rank: rank 0 hosts the store), since a rank that notices a death gives up
    /// and closes its own connections too.
    fn explain_store_failure(&mut self, error: S::Error) -> S::Error {
        let until = Instant::now() + STORE_FAILURE_GRACE;
        loop {
            self.look();
            if let Some(&peer) = self.gone.first() {
                let how = format!(
                    "its connection to this rank had closed{}, and the rendezvous store failed: {error}",
                    self.also_gone(peer)
                );
                return self.gone(peer, how).into();
            }
            if Instant::now() >= until {
                return error;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// `" (rank 0's connection had closed too)"`, naming the gone peers but `peer`.
    fn also_gone(&self, peer: usize) -> String {
        let others: Vec<String> = self
            .gone
            .iter()
            .filter(|&&p| p != peer)
            .map(|p| format!("rank {p}'s"))
            .collect();
        match others.len() {
            0 => String::new(),
            1 => format!(" ({} connection had closed too)", others[0]),
            _ => format!(" ({} connections had closed too)", others.join(", ")),
        }
    }

    fn gone(&self, peer: usize, how: String) -> PeerGone {
        let gone = PeerGone {
            rank: self.rank,
            peer,
            step: self.step,
            how,
        };
        warn!(rank = self.rank, peer, step = self.step, "{gone}");
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::ShmUnavailable;
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// What the tests' store reports: the watch's verdicts, or its own failures.
    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error(transparent)]
        Gone(#[from] PeerGone),
        #[error(transparent)]
        Unavailable(#[from] ShmUnavailable),
        #[error("store connection closed")]
        StoreClosed,
        #[error("timed out waiting for {0}")]
        Timeout(String),
    }

    /// A store shared by threads; `closed` makes every request fail.
    #[derive(Clone, Default)]
    struct Memory {
        keys: Arc<Mutex<HashMap<String, Vec<u8>>>>,
        closed: Arc<AtomicBool>,
    }

    impl SetupStore for Memory {
        type Error = TestError;

        fn set(&mut self, key: &str, value: &[u8]) -> Result<(), TestError> {
            if self.closed.load(Ordering::SeqCst) {
                return Err(TestError::StoreClosed);
            }
            self.keys.lock().unwrap().insert(key.into(), value.into());
            Ok(())
        }

        fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, TestError> {
            if self.closed.load(Ordering::SeqCst) {
                return Err(TestError::StoreClosed);
            }
            Ok(self.keys.lock().unwrap().get(key).cloned())
        }

        fn wait(
            &mut self,
            key: &str,
            deadline: Instant,
            waiting_for: &dyn Fn() -> String,
        ) -> Result<Vec<u8>, TestError> {
            loop {
                if let Some(value) = self.get(key)? {
                    return Ok(value);
                }
                if Instant::now() >= deadline {
                    return Err(TestError::Timeout(waiting_for()));
                }
                thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Peers that go away when told: `gone_mask` bit `p` set means rank `p` is gone.
    #[derive(Clone, Default)]
    struct Doors(Arc<AtomicUsize>);

    impl Doors {
        fn close(&self, peer: usize) {
            self.0.fetch_or(1 << peer, Ordering::SeqCst);
        }
    }

    impl PeerWatch for Doors {
        fn gone(&self, peer: usize) -> bool {
            self.0.load(Ordering::SeqCst) & (1 << peer) != 0
        }
    }

    const STEP: &str = "shared-memory set-up";

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(600)
    }

    #[test]
    fn a_closed_connection_is_gone_and_pending_bytes_are_not() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        let connections = [None, Some(ours)];
        assert!(!connections.gone(0), "no connection to itself");
        assert!(!connections.gone(1));
        assert!(!connections.gone(7), "a rank out of range is not gone");
        std::io::Write::write_all(&mut &theirs, b"x").unwrap();
        thread::sleep(Duration::from_millis(20));
        assert!(!connections.gone(1), "a byte waiting to be read is no loss");
        drop(theirs);
        let until = Instant::now() + Duration::from_secs(10);
        while !connections.gone(1) {
            assert!(Instant::now() < until, "the close was not seen");
            thread::sleep(Duration::from_millis(5));
        }
        // The byte is still there to be read: watching consumed nothing.
        let mut byte = [0u8; 1];
        let ours = connections[1].as_ref().unwrap();
        assert_eq!(std::io::Read::read(&mut &*ours, &mut byte).unwrap(), 1);
        assert_eq!(&byte, b"x");
    }

    #[test]
    fn a_peer_that_goes_away_ends_the_wait_at_once_naming_it() {
        let mut store = Memory::default();
        let doors = Doors::default();
        let closer = doors.clone();
        let started = Instant::now();
        let killer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            closer.close(2);
        });
        let mut watched = WatchedStore::new(&mut store, &doors, 0, 3, STEP);
        let err = watched
            .wait_for(2, "created/2", far(), &|| {
                "rank 2 to create its inbox".into()
            })
            .unwrap_err();
        killer.join().unwrap();
        let waited = started.elapsed();
        let TestError::Gone(gone) = &err else {
            panic!("{err:?}")
        };
        assert_eq!((gone.rank, gone.peer, gone.step), (0, 2, STEP));
        let text = err.to_string();
        for needle in [
            "rank 0: rank 2 went away during shared-memory set-up",
            "while this rank waited for rank 2 to create its inbox",
            "restart every rank",
        ] {
            assert!(text.contains(needle), "no {needle:?} in {text}");
        }
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn a_key_published_before_the_peer_left_is_still_read() {
        let mut store = Memory::default();
        store.set("mapped/1", b"ok:").unwrap();
        let doors = Doors::default();
        doors.close(1);
        let mut watched = WatchedStore::new(&mut store, &doors, 0, 2, STEP);
        let value = watched
            .wait_for(1, "mapped/1", far(), &|| "rank 1".into())
            .unwrap();
        assert_eq!(value, b"ok:");
    }

    #[test]
    fn only_the_awaited_peer_counts_while_the_store_answers() {
        // Rank 2 has left (after finishing, say); rank 1 publishes late: no error.
        let mut store = Memory::default();
        let mut late = store.clone();
        let doors = Doors::default();
        doors.close(2);
        let publisher = thread::spawn(move || {
            thread::sleep(Duration::from_millis(150));
            late.set("mapped/1", b"ok:").unwrap();
        });
        let mut watched = WatchedStore::new(&mut store, &doors, 0, 3, STEP);
        let value = watched.wait_for(1, "mapped/1", far(), &|| "rank 1".into());
        publisher.join().unwrap();
        assert_eq!(value.unwrap(), b"ok:");
    }

    #[test]
    fn a_failed_store_with_a_closed_connection_names_that_peer() {
        // Rank 0 (the store's host) dies: the store fails and its connection closes.
        let mut store = Memory::default();
        let doors = Doors::default();
        store.closed.store(true, Ordering::SeqCst);
        let closer = doors.clone();
        let started = Instant::now();
        let late_close = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            closer.close(0);
        });
        let mut watched = WatchedStore::new(&mut store, &doors, 1, 3, STEP);
        let err = watched
            .wait_for(2, "host/2", far(), &|| "rank 2 to report its host".into())
            .unwrap_err();
        late_close.join().unwrap();
        let TestError::Gone(gone) = &err else {
            panic!("{err:?}")
        };
        assert_eq!((gone.rank, gone.peer), (1, 0));
        assert!(
            err.to_string()
                .contains("rendezvous store failed: store connection closed"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // A set fails the same way.
        let mut watched = WatchedStore::new(&mut store, &doors, 1, 3, STEP);
        let err = watched.set("host/1", b"h").unwrap_err();
        assert!(
            matches!(err, TestError::Gone(PeerGone { peer: 0, .. })),
            "{err:?}"
        );
    }

    #[test]
    fn the_first_peer_seen_to_go_is_named_and_the_others_listed() {
        // Rank 1 of 4 waits for rank 3 (alive). Rank 2 dies first; later rank 0, which
        // hosts the store, gives up and exits: rank 2 is the cause.
        let mut store = Memory::default();
        let closed = Arc::clone(&store.closed);
        let doors = Doors::default();
        let closer = doors.clone();
        let deaths = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            closer.close(2);
            thread::sleep(Duration::from_millis(200));
            closer.close(0);
            closed.store(true, Ordering::SeqCst);
        });
        let mut watched = WatchedStore::new(&mut store, &doors, 1, 4, STEP);
        let err = watched
            .wait_for(3, "mapped/3", far(), &|| "rank 3".into())
            .unwrap_err();
        deaths.join().unwrap();
        assert!(
            matches!(err, TestError::Gone(PeerGone { peer: 2, .. })),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("(rank 0's connection had closed too)"),
            "{err}"
        );
        // Both seen at once: the lower rank (rank 0 hosts the store) is named.
        let doors = Doors::default();
        doors.close(2);
        doors.close(0);
        let mut watched = WatchedStore::new(&mut store, &doors, 1, 4, STEP);
        let err = watched
            .wait_for(3, "mapped/3", far(), &|| "rank 3".into())
            .unwrap_err();
        assert!(
            matches!(err, TestError::Gone(PeerGone { peer: 0, .. })),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("(rank 2's connection had closed too)"),
            "{err}"
        );
    }

    #[test]
    fn a_failed_store_with_every_peer_there_is_the_stores_own_error() {
        let mut store = Memory::default();
        store.closed.store(true, Ordering::SeqCst);
        let doors = Doors::default();
        let started = Instant::now();
        let mut watched = WatchedStore::new(&mut store, &doors, 1, 3, STEP);
        let err = watched
            .wait_for(2, "mapped/2", far(), &|| "rank 2".into())
            .unwrap_err();
        assert!(matches!(err, TestError::StoreClosed), "{err:?}");
        let waited = started.elapsed();
        assert!(waited >= STORE_FAILURE_GRACE, "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn a_silent_live_peer_ends_the_wait_at_the_deadline_with_the_stores_timeout() {
        let mut store = Memory::default();
        let doors = Doors::default();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let mut watched = WatchedStore::new(&mut store, &doors, 0, 2, STEP);
        let err = watched
            .wait_for(1, "created/1", deadline, &|| {
                "rank 1 to create its inbox".into()
            })
            .unwrap_err();
        assert!(
            matches!(&err, TestError::Timeout(w) if w == "rank 1 to create its inbox"),
            "{err:?}"
        );
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
}
