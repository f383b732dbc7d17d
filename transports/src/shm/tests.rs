//! Shared memory with some peers and TCP with the others: ranks played by threads of one
//! process and told they sit on two hosts, with real inboxes and real loopback
//! connections, driven through the [`Transport`] interface the collectives use.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ringccl_collectives::{Readiness, Transport};

use super::inbox::SHM_DIR;
use super::setup::{set_up_as, Group};
use super::test_store::MemoryStore;
use super::ShmTransport;
use crate::{TcpTransport, WatchedStore};

const RING: usize = 4096;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

/// A full mesh of loopback connections among `n` ranks: `mesh[r][p]` is rank r's end of
/// its connection to rank p.
fn mesh(n: usize) -> Vec<Vec<Option<TcpStream>>> {
    let mut mesh: Vec<Vec<Option<TcpStream>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for (a, b) in (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        mesh[a][b] = Some(ours);
        mesh[b][a] = Some(theirs);
    }
    mesh
}

/// One transport per rank, rank r on host `hosts[r]` (every rank must have a local peer,
/// so that each gets shared memory); `None` where `/dev/shm` is missing.
fn transports(hosts: &[&str]) -> Option<Vec<ShmTransport>> {
    if !std::path::Path::new(SHM_DIR).is_dir() {
        eprintln!("skipped: no {SHM_DIR} on this machine");
        return None;
    }
    let n = hosts.len();
    let store = MemoryStore::default();
    let rings: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let mut store = store.clone();
                s.spawn(move || {
                    let group = Group::for_test(rank, n, false);
                    let nobody_gone = |_peer: usize| false;
                    let mut store = WatchedStore::new(&mut store, &nobody_gone, rank, n, "test");
                    set_up_as(&mut store, &group, hosts[rank], RING).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let transports = mesh(n)
        .into_iter()
        .zip(rings)
        .enumerate()
        .map(|(rank, (peers, rings))| {
            let tcp = TcpTransport::new(rank, peers, Duration::from_secs(30)).unwrap();
            ShmTransport::new(rings.expect("every rank has a local peer"), tcp)
        })
        .collect();
    Some(transports)
}

/// Reads exactly `buf.len()` bytes from `peer`, waiting as the executor does.
fn read_all(t: &mut ShmTransport, peer: usize, buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        match t.read_some(peer, &mut [IoSliceMut::new(&mut buf[done..])]) {
            Ok(0) => panic!("rank {peer} closed"),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert_eq!(t.wait(None, Some(peer), soon()).unwrap(), Readiness::Ready);
            }
            Err(e) => panic!("reading from rank {peer}: {e}"),
        }
    }
}

/// Writes all of `bytes` to `peer`, waiting as the executor does.
fn write_all(t: &mut ShmTransport, peer: usize, bytes: &[u8]) {
    let mut done = 0;
    while done < bytes.len() {
        match t.write_some(peer, &[IoSlice::new(&bytes[done..])]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert_eq!(t.wait(Some(peer), None, soon()).unwrap(), Readiness::Ready);
            }
            Err(e) => panic!("writing to rank {peer}: {e}"),
        }
    }
}

fn message(from: usize, to: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 7 + from * 31 + to * 131) as u8)
        .collect()
}

#[test]
fn ranks_share_memory_inside_a_host_and_use_tcp_across() {
    let Some(transports) = transports(&["a", "a", "b", "b"]) else {
        return;
    };
    let kinds: Vec<Vec<&str>> = transports
        .iter()
        .map(|t| (0..4).map(|p| t.peer_transport(p)).collect())
        .collect();
    assert_eq!(kinds[0], ["self", "shm", "tcp", "tcp"]);
    assert_eq!(kinds[1], ["shm", "self", "tcp", "tcp"]);
    assert_eq!(kinds[2], ["tcp", "tcp", "self", "shm"]);
    assert_eq!(kinds[3], ["tcp", "tcp", "shm", "self"]);
    // Every rank sends every other a message larger than a ring, and reads theirs.
    let len = 3 * RING + 123;
    std::thread::scope(|s| {
        for (me, mut t) in transports.into_iter().enumerate() {
            s.spawn(move || {
                for step in 1..4 {
                    let to = (me + step) % 4;
                    let from = (me + 4 - step) % 4;
                    let outgoing = message(me, to, len);
                    let mut incoming = vec![0u8; len];
                    // Both directions at once, so neither waits for the other's read.
                    let (mut sent, mut got) = (0, 0);
                    while sent < len || got < len {
                        if sent < len {
                            match t.write_some(to, &[IoSlice::new(&outgoing[sent..])]) {
                                Ok(n) => sent += n,
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                                Err(e) => panic!("{me} -> {to}: {e}"),
                            }
                        }
                        if got < len {
                            match t.read_some(from, &mut [IoSliceMut::new(&mut incoming[got..])]) {
                                Ok(0) => panic!("{from} closed"),
                                Ok(n) => got += n,
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                                Err(e) => panic!("{me} <- {from}: {e}"),
                            }
                        }
                        let writable = (sent < len).then_some(to);
                        let readable = (got < len).then_some(from);
                        if writable.is_some() || readable.is_some() {
                            let waited = t.wait(writable, readable, soon()).unwrap();
                            assert_eq!(waited, Readiness::Ready, "rank {me}, step {step}");
                        }
                    }
                    assert!(
                        incoming == message(from, me, len),
                        "{from} -> {me} arrived wrong"
                    );
                }
            });
        }
    });
}

/// Fills the connection from `t` to `peer` until a write would block.
fn fill(t: &mut ShmTransport, peer: usize) -> usize {
    let chunk = vec![0u8; 1 << 16];
    let mut filled = 0;
    loop {
        match t.write_some(peer, &[IoSlice::new(&chunk)]) {
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return filled,
            Err(e) => panic!("{e}"),
        }
    }
}

/// Rank 0 waits to write to rank 2 (another host, its connection full) and to read from
/// rank 1 (its host): it sleeps in `poll(2)`, and must wake as soon as either comes,
/// not at the end of its sleep's slice. Rank 1's write wakes it through a byte on their
/// connection; rank 2's read, through the connection itself.
#[test]
fn a_rank_waiting_on_both_kinds_of_peer_wakes_as_soon_as_either_is_ready() {
    let Some(mut transports) = transports(&["a", "a", "b", "b"]) else {
        return;
    };
    let t3 = transports.pop().unwrap();
    let mut t2 = transports.pop().unwrap();
    let mut t1 = transports.pop().unwrap();
    let mut t0 = transports.pop().unwrap();
    // How long after it was ready the wait returned, by what readied it.
    let (mut by_local, mut by_remote) = (Vec::new(), Vec::new());
    for round in 0..12 {
        let filled = fill(&mut t0, 2);
        let local = round % 2 == 0;
        let delay = Duration::from_millis(30);
        let woken = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let outcome = t0.wait(Some(2), Some(1), soon()).unwrap();
                (outcome, Instant::now())
            });
            std::thread::sleep(delay);
            let readied = Instant::now();
            if local {
                write_all(&mut t1, 0, b"x");
            } else {
                let mut drained = vec![0u8; filled];
                read_all(&mut t2, 0, &mut drained);
            }
            let (outcome, woke) = waiter.join().unwrap();
            assert_eq!(outcome, Readiness::Ready);
            woke.saturating_duration_since(readied)
        });
        if local {
            by_local.push(woken);
        } else {
            by_remote.push(woken);
        }
        // Back to a quiet state: what rank 1 sent read, rank 2's connection drained.
        if local {
            let mut byte = [0u8; 1];
            read_all(&mut t0, 1, &mut byte);
            let mut drained = vec![0u8; filled];
            read_all(&mut t2, 0, &mut drained);
        }
    }
    for (what, mut late) in [("rank 1's write", by_local), ("rank 2's read", by_remote)] {
        late.sort();
        let median = late[late.len() / 2];
        // Sleeping to the end of the slice (50 ms) would make it about 20 ms.
        assert!(
            median < Duration::from_millis(8),
            "woken {median:?} after {what} (median of {late:?})"
        );
    }
    drop(t3);
}
