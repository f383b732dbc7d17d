//! Connections that have not introduced themselves yet, on a listener that strangers can
//! reach (the store's port, a rank's data listener).
//!
//! Each one is handshaken on its own thread, so a silent one delays nobody; this registry
//! bounds how many can wait at once: at most `per_source` from one address and `total` in
//! all. To make room for a newcomer, the oldest pending connection from the same address
//! (or, once the total is reached, from the address with the most) is cut off: shut down,
//! so its thread stops at once and closes it. A real rank introduces itself within a round
//! trip, so only connections that stay silent are ever old enough to be cut off (and a
//! real one that is cut off all the same reconnects). The registry holds a duplicate of
//! each pending connection, to cut it off, and closes it when the connection introduces
//! itself, ends or is cut off: nothing is kept for a connection that has gone.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing::{debug, warn};

/// Most sources remembered for "already warned about": the log stays bounded.
const MAX_WARNED_SOURCES: usize = 1024;

/// The pending connections of one listener, and their limits.
#[derive(Debug)]
pub(crate) struct PendingConnections {
    registry: Arc<Mutex<Registry>>,
    per_source: usize,
    total: usize,
    /// What the listener is, for the log ("the rendezvous store", "rank 2's data listener").
    what: String,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    /// Oldest first.
    entries: Vec<Entry>,
    warned: HashSet<IpAddr>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    source: IpAddr,
    /// A duplicate of the connection, to shut it down from here.
    handle: TcpStream,
}

/// One pending connection's place in the registry. Dropping it (or [`Admission::introduced`])
/// removes the connection from the registry, so it can no longer be cut off.
#[derive(Debug)]
pub(crate) struct Admission {
    id: u64,
    registry: Arc<Mutex<Registry>>,
}

fn locked(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    // Nothing panics while holding the lock; recover the state regardless.
    registry
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl PendingConnections {
    /// A registry allowing `per_source` pending connections from one address and `total`
    /// in all (both at least 1); `what` names the listener in the log.
    pub(crate) fn new(per_source: usize, total: usize, what: String) -> PendingConnections {
        PendingConnections {
            registry: Arc::new(Mutex::new(Registry::default())),
            per_source: per_source.max(1),
            total: total.max(1),
            what,
        }
    }

    /// Registers `stream`, accepted from `source`, cutting off older pending connections to
    /// stay within the limits. Fails only when the stream cannot be duplicated (out of
    /// descriptors); the caller then drops it.
    pub(crate) fn admit(&self, stream: &TcpStream, source: IpAddr) -> io::Result<Admission> {
        let handle = stream.try_clone()?;
        let mut registry = locked(&self.registry);
        let from_source = registry
            .entries
            .iter()
            .filter(|e| e.source == source)
            .count();
        let victim_source = if from_source >= self.per_source {
            Some(source)
        } else if registry.entries.len() >= self.total {
            registry.busiest_source()
        } else {
            None
        };
        if let Some(victim_source) = victim_source {
            if let Some(at) = registry
                .entries
                .iter()
                .position(|e| e.source == victim_source)
            {
                let victim = registry.entries.remove(at);
                let _ = victim.handle.shutdown(Shutdown::Both);
                let first_time = registry.warned.len() < MAX_WARNED_SOURCES
                    && registry.warned.insert(victim_source);
                if first_time {
                    warn!(
                        listener = %self.what,
                        source = %victim_source,
                        per_source = self.per_source,
                        total = self.total,
                        "too many connections waiting to introduce themselves: cutting off the oldest silent one (further ones from this address are logged at debug level)"
                    );
                } else {
                    debug!(listener = %self.what, source = %victim_source, "cut off a silent connection");
                }
            }
        }
        let id = registry.next_id;
        registry.next_id += 1;
        registry.entries.push(Entry { id, source, handle });
        Ok(Admission {
            id,
            registry: Arc::clone(&self.registry),
        })
    }

    /// Cuts off every pending connection (the listener is closing).
    pub(crate) fn cut_off_all(&self) {
        let entries = std::mem::take(&mut locked(&self.registry).entries);
        for entry in entries {
            let _ = entry.handle.shutdown(Shutdown::Both);
        }
    }

    /// How many connections are pending.
    #[cfg(test)]
    fn len(&self) -> usize {
        locked(&self.registry).entries.len()
    }
}

impl Registry {
    fn busiest_source(&self) -> Option<IpAddr> {
        let mut best: Option<(IpAddr, usize)> = None;
        for entry in &self.entries {
            let count = self
                .entries
                .iter()
                .filter(|e| e.source == entry.source)
                .count();
            if best.is_none_or(|(_, most)| count > most) {
                best = Some((entry.source, count));
            }
        }
        best.map(|(source, _)| source)
    }
}

impl Admission {
    /// The connection introduced itself: from now on it cannot be cut off.
    pub(crate) fn introduced(self) {}

    /// Whether the connection was cut off to make room (or because the listener closed).
    pub(crate) fn was_cut_off(&self) -> bool {
        !locked(&self.registry)
            .entries
            .iter()
            .any(|e| e.id == self.id)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut registry = locked(&self.registry);
        if let Some(at) = registry.entries.iter().position(|e| e.id == self.id) {
            registry.entries.remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{Ipv4Addr, TcpListener};

    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    #[test]
    fn the_oldest_from_a_crowded_source_is_cut_off() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let pending = PendingConnections::new(2, 10, "test".into());
        let here = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (_c1, mut s1) = pair(&listener);
        let first = pending.admit(&s1, here).unwrap();
        let (_c2, s2) = pair(&listener);
        let second = pending.admit(&s2, here).unwrap();
        let (_c3, s3) = pair(&listener);
        let third = pending.admit(&s3, here).unwrap();
        assert!(first.was_cut_off());
        assert!(!second.was_cut_off() && !third.was_cut_off());
        assert_eq!(pending.len(), 2);
        // The cut-off connection reads end-of-stream at once.
        let mut byte = [0u8; 1];
        assert_eq!(s1.read(&mut byte).unwrap(), 0);
        // Introduced or dropped admissions leave the registry.
        second.introduced();
        drop(third);
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn a_full_registry_cuts_off_the_busiest_source() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let pending = PendingConnections::new(10, 3, "test".into());
        let crowd = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let conns: Vec<_> = (0..4).map(|_| pair(&listener)).collect();
        let a = pending.admit(&conns[0].1, other).unwrap();
        let b = pending.admit(&conns[1].1, crowd).unwrap();
        let c = pending.admit(&conns[2].1, crowd).unwrap();
        let d = pending.admit(&conns[3].1, other).unwrap();
        assert!(b.was_cut_off(), "the busiest source's oldest goes first");
        assert!(!a.was_cut_off() && !c.was_cut_off() && !d.was_cut_off());
        pending.cut_off_all();
        assert!(a.was_cut_off() && c.was_cut_off() && d.was_cut_off());
    }
}
