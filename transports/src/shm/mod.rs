//! The same-host shared-memory transport.
//!
//! Every rank owns an *inbox*: a file under `/dev/shm` holding one futex "doorbell" word
//! and, for every other rank, a single-producer/single-consumer byte ring that rank writes
//! into. A writer copies into the ring, publishes the new head, then rings the reader's
//! bell; a reader copies out, publishes the new tail, then rings the writer's bell (space
//! was freed). `wait` sleeps on the rank's own bell — no spinning — in slices that also
//! check the peers' TCP connections, which stay open as the liveness channel: a process
//! that dies closes them, and its peers report it instead of waiting for the deadline.
//!
//! The inbox files are unlinked as soon as every rank has mapped every inbox, so nothing
//! is left in `/dev/shm` once the group is up, even if a process is killed later.

mod mapping;

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ringccl_collectives::{Error, Readiness, Transport};

use crate::TcpTransport;
use mapping::{futex_wait, futex_wake, Mapping};

/// Capacity of each ring (one per ordered pair of ranks).
pub const DEFAULT_RING_BYTES: usize = 1 << 20;
const HEADER: usize = 4096;
const BELL: usize = 0;
const HEAD: usize = 0;
const TAIL: usize = 64;
/// How often a sleeping rank looks at its peers' liveness.
const LIVENESS_SLICE: Duration = Duration::from_millis(50);

/// Ranks connected through shared memory (all on one host), with the TCP mesh kept as
/// the liveness channel.
pub struct ShmTransport {
    tcp: TcpTransport,
    ring_bytes: usize,
    /// `inboxes[r]`: rank r's inbox (this rank's own included).
    inboxes: Vec<Mapping>,
    gone: Vec<bool>,
}

fn inbox_len(world_size: usize, ring_bytes: usize) -> usize {
    HEADER + world_size * (HEADER + ring_bytes)
}

fn ring_offset(sender: usize, ring_bytes: usize) -> usize {
    HEADER + sender * (HEADER + ring_bytes)
}

fn inbox_path(job_id: u64, rank: usize) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ringccl-{job_id:016x}-{rank}"))
}

/// This machine's identity: ranks with equal identities share memory.
fn host_identity() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    format!(
        "{}/{}",
        read("/proc/sys/kernel/hostname").trim(),
        read("/proc/sys/kernel/random/boot_id").trim()
    )
}

impl ShmTransport {
    /// Moves a connected TCP mesh onto shared memory. Every rank must call this; all must
    /// be on the same host. Fails within `timeout`.
    pub fn attach(
        tcp: TcpTransport,
        ring_bytes: usize,
        timeout: Duration,
    ) -> Result<ShmTransport, Error> {
        match ShmTransport::negotiate(tcp, ring_bytes, timeout, true)? {
            Ok(shm) => Ok(shm),
            // `required` turns every reason to fall back into an error.
            Err(_) => Err(Error::InvalidArgument(
                "shared memory could not be set up".into(),
            )),
        }
    }

    /// Moves the mesh onto shared memory when every rank is on this host and every rank
    /// manages to set it up; otherwise every rank keeps TCP (the decision is collective:
    /// all ranks see the same published outcomes). Every rank must call this.
    pub fn attach_if_possible(
        tcp: TcpTransport,
        ring_bytes: usize,
        timeout: Duration,
    ) -> Result<Result<ShmTransport, TcpTransport>, Error> {
        ShmTransport::negotiate(tcp, ring_bytes, timeout, false)
    }

    /// Publishes this rank's outcome of a set-up step and learns everyone's: `Ok(true)`
    /// when every rank succeeded.
    fn agree(
        store: &mut crate::store::StoreClient,
        step: &str,
        rank: usize,
        n: usize,
        ok: bool,
        deadline: Instant,
    ) -> Result<bool, Error> {
        store.set(
            &format!("ringccl/shm/{step}/{rank}"),
            if ok { b"1" } else { b"0" },
        )?;
        let mut all = true;
        for peer in 0..n {
            let outcome = store.wait(&format!("ringccl/shm/{step}/{peer}"), deadline, &|| {
                format!("rank {peer} to finish setting up shared memory ({step})")
            })?;
            all &= outcome == b"1";
        }
        Ok(all)
    }

    fn negotiate(
        tcp: TcpTransport,
        ring_bytes: usize,
        timeout: Duration,
        required: bool,
    ) -> Result<Result<ShmTransport, TcpTransport>, Error> {
        let deadline = Instant::now() + timeout;
        let mut outcome = ShmTransport::decide(tcp, ring_bytes, deadline, required)?;
        // Nobody reads the store after this point: rank 0 may stop hosting it.
        let tcp = match &mut outcome {
            Ok(shm) => &mut shm.tcp,
            Err(tcp) => tcp,
        };
        let rank = tcp.rank();
        tcp.release_store(deadline).map_err(|source| Error::Io {
            rank,
            context: "finishing start-up (telling rank 0 the store is no longer needed)".into(),
            source,
        })?;
        Ok(outcome)
    }

    fn decide(
        mut tcp: TcpTransport,
        ring_bytes: usize,
        deadline: Instant,
        required: bool,
    ) -> Result<Result<ShmTransport, TcpTransport>, Error> {
        let (rank, n, job) = (tcp.rank(), tcp.world_size(), tcp.job_id);
        let fail = |what: String| -> Error {
            Error::InvalidArgument(format!(
                "rank {rank}: shared-memory transport: {what}; use RINGCCL_TRANSPORT=tcp"
            ))
        };
        let Some(store) = tcp.store.as_mut() else {
            return Err(fail("the rendezvous store is gone".into()));
        };
        // 1. Every rank on this host?
        let me = host_identity();
        store.set(&format!("ringccl/host/{rank}"), me.as_bytes())?;
        for peer in 0..n {
            let theirs = store.wait(&format!("ringccl/host/{peer}"), deadline, &|| {
                format!("rank {peer} to report its host")
            })?;
            if theirs != me.as_bytes() {
                if required {
                    return Err(fail(format!(
                        "it needs every rank on one host, but rank {peer} runs on {:?} and this rank on {me:?}",
                        String::from_utf8_lossy(&theirs)
                    )));
                }
                return Ok(Err(tcp));
            }
        }
        // 2. Create this rank's inbox.
        let len = inbox_len(n, ring_bytes);
        let own_path = inbox_path(job, rank);
        let unlink_own = || {
            let _ = std::fs::remove_file(&own_path);
        };
        let created = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&own_path)
            .and_then(|file| {
                file.set_len(len as u64)?;
                Mapping::new(&file, len)
            });
        let own_error = created
            .as_ref()
            .err()
            .map(|e| format!("creating {}: {e}", own_path.display()));
        if !ShmTransport::agree(store, "created", rank, n, created.is_ok(), deadline)? {
            unlink_own();
            return match (required, own_error) {
                (true, Some(e)) => Err(fail(e)),
                (true, None) => Err(fail("another rank could not create its inbox".into())),
                (false, _) => Ok(Err(tcp)),
            };
        }
        // 3. Map every other rank's inbox.
        let mut own = created.ok();
        let mut inboxes = Vec::with_capacity(n);
        let mut map_error = None;
        for peer in 0..n {
            if peer == rank {
                inboxes.extend(own.take());
                continue;
            }
            let path = inbox_path(job, peer);
            let mapped = File::options()
                .read(true)
                .write(true)
                .open(&path)
                .and_then(|file| {
                    let actual = file.metadata()?.len();
                    if actual != len as u64 {
                        return Err(io::Error::other(format!(
                            "it has {actual} bytes, expected {len} (same ringccl version everywhere?)"
                        )));
                    }
                    Mapping::new(&file, len)
                });
            match mapped {
                Ok(mapping) => inboxes.push(mapping),
                Err(e) => {
                    map_error = Some(format!("mapping {}: {e}", path.display()));
                    break;
                }
            }
        }
        let all_mapped =
            ShmTransport::agree(store, "mapped", rank, n, map_error.is_none(), deadline);
        unlink_own();
        if !all_mapped? {
            return match (required, map_error) {
                (true, Some(e)) => Err(fail(e)),
                (true, None) => Err(fail("another rank could not map the inboxes".into())),
                (false, _) => Ok(Err(tcp)),
            };
        }
        Ok(Ok(ShmTransport {
            tcp,
            ring_bytes,
            inboxes,
            gone: vec![false; n],
        }))
    }

    fn bell(&self, rank: usize) -> &std::sync::atomic::AtomicU32 {
        self.inboxes[rank].atomic_u32(BELL)
    }

    fn ring_bell(&self, rank: usize) {
        let bell = self.bell(rank);
        bell.fetch_add(1, Ordering::Release);
        futex_wake(bell);
    }

    /// (head, tail) of the ring `sender → receiver`.
    fn counters(
        &self,
        sender: usize,
        receiver: usize,
    ) -> (&std::sync::atomic::AtomicU64, &std::sync::atomic::AtomicU64) {
        let inbox = &self.inboxes[receiver];
        let ring = ring_offset(sender, self.ring_bytes);
        (inbox.atomic_u64(ring + HEAD), inbox.atomic_u64(ring + TAIL))
    }

    fn used(&self, sender: usize, receiver: usize) -> usize {
        let (head, tail) = self.counters(sender, receiver);
        let used = head
            .load(Ordering::Acquire)
            .wrapping_sub(tail.load(Ordering::Acquire));
        (used as usize).min(self.ring_bytes)
    }

    fn check_peer(&self, peer: usize) -> io::Result<()> {
        if peer >= self.inboxes.len() || peer == self.tcp.rank() {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("no ring to rank {peer}"),
            ));
        }
        Ok(())
    }
}

impl Transport for ShmTransport {
    fn rank(&self) -> usize {
        self.tcp.rank()
    }

    fn world_size(&self) -> usize {
        self.tcp.world_size()
    }

    fn write_some(&mut self, peer: usize, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.check_peer(peer)?;
        if self.gone[peer] {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer's process is gone",
            ));
        }
        let me = self.rank();
        let cap = self.ring_bytes;
        let free = cap - self.used(me, peer);
        if free == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let (head, _) = self.counters(me, peer);
        let start = head.load(Ordering::Relaxed);
        let data = ring_offset(me, cap) + HEADER;
        let inbox = &self.inboxes[peer];
        let mut written = 0usize;
        for buf in bufs {
            let mut src: &[u8] = buf;
            while !src.is_empty() && written < free {
                let at = (start as usize + written) % cap;
                let n = src.len().min(free - written).min(cap - at);
                inbox.write(data + at, &src[..n]);
                src = &src[n..];
                written += n;
            }
        }
        head.store(start.wrapping_add(written as u64), Ordering::Release);
        self.ring_bell(peer);
        Ok(written)
    }

    fn read_some(&mut self, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.check_peer(peer)?;
        let me = self.rank();
        let cap = self.ring_bytes;
        let available = self.used(peer, me);
        if available == 0 {
            if self.gone[peer] {
                return Ok(0); // the peer's process is gone: end of stream
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let (_, tail) = self.counters(peer, me);
        let start = tail.load(Ordering::Relaxed);
        let data = ring_offset(peer, cap) + HEADER;
        let inbox = &self.inboxes[me];
        let mut read = 0usize;
        for buf in bufs.iter_mut() {
            let mut dst: &mut [u8] = buf;
            while !dst.is_empty() && read < available {
                let at = (start as usize + read) % cap;
                let n = dst.len().min(available - read).min(cap - at);
                let (now, rest) = dst.split_at_mut(n);
                inbox.read(data + at, now);
                dst = rest;
                read += n;
            }
        }
        tail.store(start.wrapping_add(read as u64), Ordering::Release);
        self.ring_bell(peer);
        Ok(read)
    }

    fn failed_peers(&mut self) -> Vec<usize> {
        self.tcp.failed_peers()
    }

    fn wait(
        &mut self,
        writable: Option<usize>,
        readable: Option<usize>,
        deadline: Instant,
    ) -> io::Result<Readiness> {
        let me = self.rank();
        loop {
            let seen = self.bell(me).load(Ordering::Acquire);
            let can_read = readable.is_some_and(|p| self.used(p, me) > 0);
            let can_write = writable.is_some_and(|p| self.used(me, p) < self.ring_bytes);
            if can_read || can_write {
                return Ok(Readiness::Ready);
            }
            for peer in [readable, writable].into_iter().flatten() {
                if !self.gone[peer] && self.tcp.peer_gone(peer) {
                    self.gone[peer] = true;
                }
                if self.gone[peer] {
                    return Ok(Readiness::Ready); // the next read or write reports it
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Readiness::TimedOut);
            }
            futex_wait(self.bell(me), seen, (deadline - now).min(LIVENESS_SLICE));
        }
    }
}

impl fmt::Debug for ShmTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmTransport")
            .field("rank", &self.tcp.rank())
            .field("world_size", &self.tcp.world_size())
            .field("ring_bytes", &self.ring_bytes)
            .finish_non_exhaustive()
    }
}
