//! An in-memory rendezvous store for the shared-memory set-up's tests, shared by threads
//! that play the ranks of one job.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::ShmUnavailable;
use crate::SetupStore;

/// An in-memory store shared by threads (or by a test playing a hostile rank).
#[derive(Clone, Default)]
pub(crate) struct MemoryStore(Arc<(Mutex<Keys>, Condvar)>);

type Keys = HashMap<String, Vec<u8>>;

#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
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
