//! The barrier in shared memory: every rank publishes the number of the latest barrier it
//! has arrived at, in memory that every rank of the group maps, and waits until every
//! other rank's number has reached its own. One store and a wake-up check to arrive, one
//! load per rank to look; no frame, no forwarding, so the rank that arrives last releases
//! everyone at once. Where the ranks take turns on the cores, that saves the round trips
//! through ranks that are not running which the barriers of messages wait on.
//!
//! A transport offers it ([`Transport::memory_barrier`](crate::Transport::memory_barrier))
//! only when it shares memory with every rank of the group, which every rank of the group
//! knows alike: either every rank runs this barrier or none does.
//!
//! Errors stay what the barriers of messages give:
//! - a rank that does not arrive is named at the deadline ([`Error::Timeout`]), and the
//!   control plane's checks see this rank blocked on it meanwhile (a peer in another call
//!   numbered like this one is named as a mismatch by the sentinel);
//! - a frame that arrives instead comes from a rank in another call: its header names
//!   that call ([`Error::CollectiveMismatch`]);
//! - a rank whose connection is gone before it arrived is named ([`Error::PeerLost`]).

use std::io::{self, IoSliceMut};
use std::time::Instant;

use crate::control::{Activity, RETRY_EVERY};
use crate::flight::FlightRecorder;
use crate::transport::{Readiness, Transport};
use crate::wire::{same_call, Algorithm, FrameHeader, FRAME_HEADER_LEN};
use crate::{Error, OpDesc};

/// Where a wait for the other ranks' arrival ended ([`MemoryBarrier::wait_all_arrived`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Every rank has arrived.
    All,
    /// The time given passed first; this rank is the first (in rank order) still missing.
    Missing(usize),
    /// Bytes arrived from this rank instead: it runs another call.
    Frame(usize),
    /// This rank's connection is gone, and it had not arrived.
    Gone(usize),
}

/// A barrier in memory that every rank of the group shares with this one (see the module
/// documentation). Barriers are numbered by the group's collective counter, the same on
/// every rank, and only grow.
pub trait MemoryBarrier {
    /// Publishes that this rank has arrived at barrier `seq`, and wakes the ranks that
    /// sleep waiting for arrivals.
    fn arrive(&mut self, seq: u64);

    /// The first rank (in rank order) that has not arrived at barrier `seq`, at a glance;
    /// `None` once every rank has.
    fn first_missing(&self, seq: u64) -> Option<usize>;

    /// Waits until every rank has arrived at barrier `seq`, a frame from a peer arrives
    /// instead, a peer that has not arrived is gone, or `until` passes.
    fn wait_all_arrived(&mut self, seq: u64, until: Instant) -> io::Result<Arrivals>;
}

/// Where a call that follows no schedule records the rank it waits for.
#[derive(Clone, Copy)]
pub(crate) struct Observers<'a> {
    pub(crate) activity: Option<&'a Activity>,
    pub(crate) flight: Option<&'a FlightRecorder>,
}

impl Observers<'_> {
    pub(crate) fn blocked_on(&self, peer: usize) {
        if let Some(activity) = self.activity {
            activity.blocked_on(peer, 0);
        }
        if let Some(flight) = self.flight {
            flight.blocked_on(peer);
        }
    }
}

/// Runs barrier `op` through `transport`'s memory barrier until `deadline` (its timeout
/// `timeout`, for messages). Waits in slices of at most [`RETRY_EVERY`], recording the
/// rank it waits for after each, as the executor does, so that a peer that asks is told
/// what this rank waits for.
pub(crate) fn run<T: Transport + ?Sized>(
    transport: &mut T,
    op: &OpDesc,
    (deadline, timeout): (Instant, std::time::Duration),
    observers: Observers<'_>,
) -> Result<(), Error> {
    let rank = transport.rank();
    let io_error = |e: io::Error| Error::Io {
        rank,
        context: format!("waiting in {op}"),
        source: e,
    };
    let Some(barrier) = transport.memory_barrier() else {
        return Err(Error::InvalidArgument(format!(
            "rank {rank}: {op}: no memory shared with every rank for a barrier in memory"
        )));
    };
    barrier.arrive(op.seq);
    let Some(first) = barrier.first_missing(op.seq) else {
        return Ok(());
    };
    observers.blocked_on(first);
    let outcome = loop {
        let until = Instant::now()
            .checked_add(RETRY_EVERY)
            .map_or(deadline, |retry| retry.min(deadline));
        match barrier.wait_all_arrived(op.seq, until).map_err(io_error)? {
            Arrivals::Missing(peer) => {
                if until >= deadline {
                    return Err(Error::Timeout {
                        rank,
                        peer,
                        op: *op,
                        moved: 0,
                        expected: 0,
                        timeout,
                        gone: Vec::new(),
                    });
                }
                observers.blocked_on(peer);
            }
            done => break done,
        }
    };
    match outcome {
        Arrivals::All => Ok(()),
        Arrivals::Frame(peer) => Err(frame_instead(transport, op, peer, deadline)),
        Arrivals::Gone(peer) => Err(Error::PeerLost {
            rank: peer,
            observer: rank,
            op: *op,
            reason: match transport.peer_host(peer) {
                Some(host) => format!(
                    "its connection closed before it reached the barrier; rank {peer} ran on {host}"
                ),
                None => "its connection closed before it reached the barrier".into(),
            },
            gone: Vec::new(),
        }),
        Arrivals::Missing(_) => unreachable_missing(rank, op),
    }
}

/// The loop above only breaks on the other outcomes.
fn unreachable_missing(rank: usize, op: &OpDesc) -> Result<(), Error> {
    Err(Error::InvalidArgument(format!(
        "rank {rank}: {op}: the barrier in memory stopped waiting with a rank missing"
    )))
}

/// The error for a frame from `peer` that arrived while this rank waited in barrier `op`:
/// its header names the call `peer` is in.
fn frame_instead<T: Transport + ?Sized>(
    transport: &mut T,
    op: &OpDesc,
    peer: usize,
    deadline: Instant,
) -> Error {
    let rank = transport.rank();
    let protocol = |reason: String| Error::Protocol {
        rank,
        peer,
        op: *op,
        reason,
    };
    let mut raw = [0u8; FRAME_HEADER_LEN];
    let mut got = 0;
    while got < FRAME_HEADER_LEN {
        let mut iov = [IoSliceMut::new(&mut raw[got..])];
        match transport.read_some(peer, &mut iov) {
            Ok(0) => return protocol("its connection closed in the middle of a frame".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match transport.wait(None, Some(peer), deadline) {
                    Ok(Readiness::Ready) => {}
                    Ok(Readiness::TimedOut) => {
                        return protocol("it sent part of a frame and then nothing".into())
                    }
                    Err(e) => return protocol(format!("reading its frame: {e}")),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return protocol(format!("reading its frame: {e}")),
        }
    }
    let header = match FrameHeader::decode(&raw) {
        Ok(header) => header,
        Err(e) => return protocol(e.to_string()),
    };
    match same_call(
        rank,
        peer,
        (*op, Algorithm::SharedCounters),
        (header.op, header.algorithm),
    ) {
        Err(error) => error,
        Ok(()) => protocol("it sent a frame in a barrier that sends none".into()),
    }
}
