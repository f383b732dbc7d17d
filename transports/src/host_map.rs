//! Where every rank runs: each rank publishes its host identity in the rendezvous store
//! and reads everyone's. Shared-memory set-up starts from it (ranks of one host are the
//! candidates), and a TCP-only group learns from it where its host boundaries are, for
//! the topology-aware collectives.

use std::time::Instant;

use crate::{PeerWatch, SetupStore, WatchedStore};

/// This machine's identity, as far as sharing memory goes: ranks with equal identities
/// share a host. The PID namespace is part of it, because peers open each other's
/// inboxes through `/proc/<pid>/fd`.
pub(crate) fn host_identity() -> String {
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

/// Every rank's host, as every rank sees it alike.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMap {
    /// `hosts[r]`: rank `r`'s host, as a label (the lowest rank with the same identity).
    pub hosts: Vec<usize>,
    /// `names[r]`: the host name rank `r` reported (for messages).
    pub names: Vec<String>,
    /// `identities[r]`: the whole identity rank `r` reported.
    pub(crate) identities: Vec<String>,
}

impl HostMap {
    /// The ranks on `rank`'s host, in order (`rank` included).
    pub(crate) fn ranks_with(&self, rank: usize) -> Vec<usize> {
        let host = self.hosts.get(rank).copied();
        (0..self.hosts.len())
            .filter(|&peer| Some(self.hosts[peer]) == host)
            .collect()
    }

    /// How many ranks run on `rank`'s machine: those that share its kernel (its boot id),
    /// whatever their host name or namespaces. They share its cores, which is what a
    /// wait's spin-or-yield choice needs to know.
    pub fn ranks_on_machine_of(&self, rank: usize) -> usize {
        let machine = |identity: &str| identity.split('/').nth(1).map(str::to_owned);
        let mine = self.identities.get(rank).and_then(|i| machine(i));
        self.identities
            .iter()
            .filter(|identity| machine(identity) == mine)
            .count()
    }

    /// `peer`'s host for messages: its name and, when known, its address.
    pub(crate) fn describe(&self, peer: usize, address: Option<String>) -> Option<String> {
        let name = self.names.get(peer).filter(|n| !n.is_empty());
        match (name, address) {
            (Some(name), Some(address)) => Some(format!("host {name} ({address})")),
            (Some(name), None) => Some(format!("host {name}")),
            (None, address) => address,
        }
    }

    /// The first rank not on `rank`'s host, with its identity.
    pub(crate) fn first_elsewhere(&self, rank: usize) -> Option<(usize, &str)> {
        let host = self.hosts.get(rank).copied();
        (0..self.hosts.len())
            .find(|&peer| Some(self.hosts[peer]) != host)
            .map(|peer| (peer, self.identities[peer].as_str()))
    }
}

/// Publishes this rank's identity `me` under `ringccl/host/<rank>` and reads every
/// rank's, by the store's deadline; a peer that goes away meanwhile is named at once.
pub(crate) fn exchange<S: SetupStore + ?Sized, W: PeerWatch + ?Sized>(
    store: &mut WatchedStore<'_, S, W>,
    rank: usize,
    n: usize,
    me: &str,
    deadline: Instant,
) -> Result<HostMap, S::Error> {
    store.set(&format!("ringccl/host/{rank}"), me.as_bytes())?;
    let mut identities: Vec<String> = Vec::with_capacity(n);
    let mut hosts = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    for peer in 0..n {
        let theirs = store.wait_for(peer, &format!("ringccl/host/{peer}"), deadline, &|| {
            format!("rank {peer} to report its host")
        })?;
        let theirs = String::from_utf8_lossy(&theirs).into_owned();
        hosts.push(identities.iter().position(|i| *i == theirs).unwrap_or(peer));
        // The identity starts with the host name (see `host_identity`).
        names.push(theirs.split('/').next().unwrap_or_default().to_string());
        identities.push(theirs);
    }
    Ok(HostMap {
        hosts,
        names,
        identities,
    })
}

/// Where every rank of the `n` runs, found collectively (every rank must call it): each
/// publishes its host identity in the store and reads the others'. A group that uses
/// TCP only calls this to learn its host boundaries; shared-memory set-up does the same
/// as its first step. `peers` tells whether a peer's process has gone away, as in
/// [`shm::set_up`](crate::shm::set_up).
///
/// ```
/// # use std::collections::HashMap;
/// # use std::time::{Duration, Instant};
/// # use ringccl_transports::{discover_hosts, shm, PeerGone, SetupStore};
/// # #[derive(Debug, thiserror::Error)]
/// # enum Failed {
/// #     #[error(transparent)]
/// #     Shm(#[from] shm::ShmUnavailable),
/// #     #[error(transparent)]
/// #     Gone(#[from] PeerGone),
/// #     #[error("nobody published {0}")]
/// #     Missing(String),
/// # }
/// # /// A store for a group of one (ringccl passes its rendezvous store).
/// # #[derive(Default)]
/// # struct OneRank(HashMap<String, Vec<u8>>);
/// # impl SetupStore for OneRank {
/// #     type Error = Failed;
/// #     fn set(&mut self, key: &str, value: &[u8]) -> Result<(), Failed> {
/// #         self.0.insert(key.into(), value.into());
/// #         Ok(())
/// #     }
/// #     fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, Failed> {
/// #         Ok(self.0.get(key).cloned())
/// #     }
/// #     fn wait(&mut self, key: &str, _: Instant, what: &dyn Fn() -> String)
/// #         -> Result<Vec<u8>, Failed> {
/// #         self.0.get(key).cloned().ok_or_else(|| Failed::Missing(what()))
/// #     }
/// # }
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let no_peers = |_peer: usize| false;
/// let map = discover_hosts(&mut OneRank::default(), &no_peers, 0, 1, deadline)?;
/// assert_eq!(map.hosts, vec![0]);
/// # Ok::<(), Failed>(())
/// ```
pub fn discover_hosts<S: SetupStore + ?Sized, W: PeerWatch + ?Sized>(
    store: &mut S,
    peers: &W,
    rank: usize,
    n: usize,
    deadline: Instant,
) -> Result<HostMap, S::Error> {
    let store = &mut WatchedStore::new(store, peers, rank, n, "finding every rank's host");
    exchange(store, rank, n, &host_identity(), deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_of_one_identity_share_a_label_and_the_first_stranger_is_named() {
        let map = HostMap {
            hosts: vec![0, 1, 0, 3],
            names: vec!["a".into(), "b".into(), "a".into(), "c".into()],
            identities: vec![
                "a/1/x".into(),
                "b/1/x".into(),
                "a/1/x".into(),
                "c/1/x".into(),
            ],
        };
        assert_eq!(map.ranks_with(2), vec![0, 2]);
        assert_eq!(map.ranks_with(3), vec![3]);
        assert_eq!(map.first_elsewhere(0), Some((1, "b/1/x")));
        assert_eq!(map.first_elsewhere(1), Some((0, "a/1/x")));
        assert_eq!(map.ranks_on_machine_of(0), 4, "one boot id: one machine");
        assert_eq!(
            map.describe(3, Some("10.0.0.3".into())).as_deref(),
            Some("host c (10.0.0.3)")
        );
        assert_eq!(
            map.describe(7, Some("10.0.0.7".into())).as_deref(),
            Some("10.0.0.7")
        );
    }
}
