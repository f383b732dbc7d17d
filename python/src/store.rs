//! Start-up through torch's c10d store: [`ringccl::Store`] over the Python store object
//! torch hands a backend (a `PrefixStore` over the job's `TCPStore`, `FileStore` or
//! `HashStore`), so a torch job has one rendezvous, torch's.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use ringccl::{SetupError, Store};

/// torch's store seen by ringccl's start-up; every call attaches to the interpreter for
/// the one store operation it makes.
pub(crate) struct TorchStore {
    store: Py<PyAny>,
    /// Prefix of every key (the namespaces of groups formed through this one).
    prefix: String,
    rank: usize,
    timeout: Duration,
    /// How the store is named in messages, e.g. `torch's TCPStore at 10.0.0.1:29500`.
    name: String,
    /// The address this host reaches the store from, when it is a TCP store.
    local_ip: Option<IpAddr>,
}

impl TorchStore {
    pub(crate) fn new(
        store: Py<PyAny>,
        rank: usize,
        timeout: Duration,
        name: String,
        local_ip: Option<IpAddr>,
    ) -> TorchStore {
        TorchStore {
            store,
            prefix: String::new(),
            rank,
            timeout,
            name,
            local_ip,
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// A failed store operation as ringccl's start-up error.
    fn failed(&self, what: &str, key: &str, error: PyErr) -> SetupError {
        SetupError::Io {
            rank: self.rank,
            context: format!("{what} key {key:?} in {} (did rank 0 exit?)", self.name),
            source: io::Error::other(error.to_string()),
        }
    }

    /// Runs `op` on the store object with the interpreter attached.
    fn call<R>(
        &self,
        what: &str,
        key: &str,
        op: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<R>,
    ) -> Result<R, SetupError> {
        Python::attach(|py| op(self.store.bind(py))).map_err(|e| self.failed(what, key, e))
    }
}

impl Store for TorchStore {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
        let key = self.key(key);
        self.call("setting", &key, |store| {
            let value = PyBytes::new(store.py(), value);
            store.call_method1("set", (key.as_str(), value)).map(drop)
        })
    }

    fn set_if_absent(&mut self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>, SetupError> {
        let key = self.key(key);
        // compare_set with an empty expected value sets an absent key and returns what
        // the key holds afterwards: our value when we set it.
        let now: Vec<u8> = self.call("claiming", &key, |store| {
            let py = store.py();
            let (empty, value) = (PyBytes::new(py, b""), PyBytes::new(py, value));
            store
                .call_method1("compare_set", (key.as_str(), empty, value))?
                .extract()
        })?;
        Ok((now != value).then_some(now))
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError> {
        let key = self.key(key);
        self.call("reading", &key, |store| {
            // torch's `get` waits for an absent key; `check` answers at once.
            if !store
                .call_method1("check", (vec![key.as_str()],))?
                .extract::<bool>()?
            {
                return Ok(None);
            }
            store
                .call_method1("get", (key.as_str(),))?
                .extract()
                .map(Some)
        })
    }

    fn scoped(&self, namespace: &str, rank: usize) -> Result<Box<dyn Store>, SetupError> {
        Ok(Box::new(TorchStore {
            store: Python::attach(|py| self.store.clone_ref(py)),
            prefix: self.key(namespace),
            rank,
            timeout: self.timeout,
            name: self.name.clone(),
            local_ip: self.local_ip,
        }))
    }

    fn local_ip(&self) -> Option<IpAddr> {
        self.local_ip
    }
}

impl fmt::Debug for TorchStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TorchStore")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}
