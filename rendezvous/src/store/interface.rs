//! What start-up needs from a key/value store, so that it can run over any store every
//! rank reaches: ringccl's own ([`StoreClient`](super::StoreClient)) or one the
//! application already has (torch's c10d store, in the Python package).

use std::fmt;
use std::net::IpAddr;
use std::thread;
use std::time::{Duration, Instant};

use crate::SetupError;

/// The key under which a store without an abort operation of its own records why
/// start-up was abandoned (see [`Store::abort`]'s default).
pub const ABORT_KEY: &str = "ringccl/abandoned";

/// Longest pause between two looks at a key [`wait_by_polling`] waits for.
const MAX_POLL: Duration = Duration::from_millis(200);

/// A key/value store every rank of a group reaches during start-up.
///
/// Keys are text, values bytes. Every method returns or fails within the store's own
/// deadline; [`Store::wait`] also by the deadline it is given. Errors are
/// [`SetupError`]s that name the rank and the store.
///
/// Implement `describe`, `rank`, `timeout`, `set`, `set_if_absent`, `get` and `scoped`;
/// `wait` has a default that polls ([`wait_by_polling`]), `abort` and `check` defaults
/// over [`ABORT_KEY`], and `local_ip` says `None` (the store is not reached over IP).
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
/// use std::time::{Duration, Instant};
/// use ringccl_rendezvous::store::Store;
/// use ringccl_rendezvous::SetupError;
///
/// /// A store shared by the threads of one process.
/// #[derive(Debug, Clone, Default)]
/// struct Shared { map: Arc<Mutex<HashMap<String, Vec<u8>>>>, prefix: String }
///
/// impl Store for Shared {
///     fn describe(&self) -> String { "the in-process store".into() }
///     fn rank(&self) -> usize { 0 }
///     fn timeout(&self) -> Duration { Duration::from_secs(10) }
///     fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
///         self.map.lock().unwrap().insert(format!("{}{key}", self.prefix), value.to_vec());
///         Ok(())
///     }
///     fn set_if_absent(&mut self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>, SetupError> {
///         let mut map = self.map.lock().unwrap();
///         let key = format!("{}{key}", self.prefix);
///         if let Some(old) = map.get(&key) { return Ok(Some(old.clone())); }
///         map.insert(key, value.to_vec());
///         Ok(None)
///     }
///     fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError> {
///         Ok(self.map.lock().unwrap().get(&format!("{}{key}", self.prefix)).cloned())
///     }
///     fn scoped(&self, namespace: &str, _rank: usize) -> Result<Box<dyn Store>, SetupError> {
///         Ok(Box::new(Shared { map: self.map.clone(), prefix: format!("{}{namespace}", self.prefix) }))
///     }
/// }
///
/// let mut store = Shared::default();
/// assert_eq!(store.set_if_absent("owner", b"first")?, None);
/// assert_eq!(store.set_if_absent("owner", b"second")?, Some(b"first".to_vec()));
/// store.abort("rank 1 was started twice")?;
/// assert!(matches!(store.check(), Err(SetupError::RendezvousAborted { .. })));
/// let soon = Instant::now() + Duration::from_secs(5);
/// let err = store.wait("never set", soon, &|| "nobody".into()).unwrap_err();
/// assert!(matches!(err, SetupError::RendezvousAborted { .. })); // abandoned: fails at once
/// # Ok::<(), SetupError>(())
/// ```
pub trait Store: Send + Sync + fmt::Debug {
    /// The store in a few words, for messages: `"rendezvous store at 10.0.0.1:29500"`.
    fn describe(&self) -> String;

    /// This process's rank in the group the store serves, named in errors.
    fn rank(&self) -> usize;

    /// The start-up's deadline, named in timeout errors; each store operation also
    /// returns within it.
    fn timeout(&self) -> Duration;

    /// Sets `key` to `value`.
    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError>;

    /// Sets `key` to `value` unless it is already set: `None` when this call set it,
    /// `Some(value already there)` otherwise. Of several racing callers with different
    /// values, exactly one gets `None`.
    fn set_if_absent(&mut self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>, SetupError>;

    /// `key`'s value if it is set, without waiting.
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError>;

    /// A store whose every key lives under `namespace` inside this one, for a group of
    /// its own, in which this process is rank `rank`.
    fn scoped(&self, namespace: &str, rank: usize) -> Result<Box<dyn Store>, SetupError>;

    /// Waits until `key` is set and returns its value; fails at `deadline` with
    /// [`SetupError::RendezvousTimeout`] saying it waited for `waiting_for()`, and at once
    /// if start-up was abandoned.
    fn wait(
        &mut self,
        key: &str,
        deadline: Instant,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, SetupError> {
        wait_by_polling(self, key, deadline, waiting_for)
    }

    /// Abandons start-up for every rank that uses this store: from now on
    /// [`Store::check`] fails with [`SetupError::RendezvousAborted`] quoting the first
    /// reason given.
    fn abort(&mut self, reason: &str) -> Result<(), SetupError> {
        self.set_if_absent(ABORT_KEY, reason.as_bytes()).map(|_| ())
    }

    /// Fails with [`SetupError::RendezvousAborted`] once some rank has abandoned
    /// start-up ([`Store::abort`]).
    fn check(&mut self) -> Result<(), SetupError> {
        match self.get(ABORT_KEY)? {
            None => Ok(()),
            Some(reason) => Err(SetupError::RendezvousAborted {
                rank: self.rank(),
                reason: String::from_utf8_lossy(&reason).into_owned(),
            }),
        }
    }

    /// The address this host reaches the store from, when the store is reached over IP:
    /// the interface the peers can most likely reach this rank on too.
    fn local_ip(&self) -> Option<IpAddr> {
        None
    }
}

/// [`Store::wait`] by asking: looks at `key` every few milliseconds, then less often (at
/// most every 200 ms), checking each time whether start-up was abandoned.
pub fn wait_by_polling<S: Store + ?Sized>(
    store: &mut S,
    key: &str,
    deadline: Instant,
    waiting_for: &dyn Fn() -> String,
) -> Result<Vec<u8>, SetupError> {
    let mut pause = Duration::from_millis(1);
    loop {
        store.check()?;
        if let Some(value) = store.get(key)? {
            return Ok(value);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SetupError::RendezvousTimeout {
                rank: store.rank(),
                waiting_for: waiting_for(),
                timeout: store.timeout(),
            });
        }
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(MAX_POLL);
    }
}

impl ringccl_transports::SetupStore for dyn Store + '_ {
    type Error = SetupError;

    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
        Store::set(self, key, value)
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError> {
        Store::get(self, key)
    }

    fn wait(
        &mut self,
        key: &str,
        deadline: Instant,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, SetupError> {
        Store::wait(self, key, deadline, waiting_for)
    }
}
