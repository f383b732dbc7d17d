//! The engine's hook: one span per collective call on its group's row.

use std::time::Instant;

use super::row::Timeline;
use super::span::{CollectiveArgs, PeerBytes, PeerTraffic, Span, SpanArgs};
use crate::schedule::Schedule;
use crate::wire::Algorithm;
use crate::{Deadline, Error, OpDesc};

/// Where an engine puts its calls on the timeline: the row of its group's collectives,
/// and what carries the bytes (`"tcp"`, `"shm"`).
///
/// ```
/// use ringccl_collectives::timeline::{CollectiveTrace, TraceFile};
///
/// let file = TraceFile::to_writer(std::io::sink(), 0)?;
/// let trace = CollectiveTrace::new(file.new_row("collectives"), "tcp");
/// assert_eq!(trace.transport(), "tcp");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct CollectiveTrace {
    row: Timeline,
    transport: &'static str,
}

/// One finished call, as the engine saw it.
pub(crate) struct Call<'a> {
    pub(crate) op: &'a OpDesc,
    pub(crate) algorithm: Option<Algorithm>,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    /// What it exchanged with each peer (the schedule it ran, when it completed).
    pub(crate) traffic: PeerTraffic,
    pub(crate) deadline: Deadline,
    pub(crate) started: Instant,
    pub(crate) result: &'a Result<(), Error>,
}

impl CollectiveTrace {
    /// Calls go on `row`; `transport` names what carries them.
    ///
    /// ```
    /// # use ringccl_collectives::timeline::{CollectiveTrace, TraceFile};
    /// let file = TraceFile::to_writer(std::io::sink(), 0)?;
    /// let trace = CollectiveTrace::new(file.row("collectives"), "shm");
    /// assert_eq!(trace.row().tid(), 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(row: Timeline, transport: &'static str) -> CollectiveTrace {
        CollectiveTrace { row, transport }
    }

    /// The row the calls go on.
    ///
    /// ```
    /// # use ringccl_collectives::timeline::{CollectiveTrace, TraceFile};
    /// let file = TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_eq!(CollectiveTrace::new(file.row("c"), "tcp").row().file().pid(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn row(&self) -> &Timeline {
        &self.row
    }

    /// What carries the calls' bytes.
    ///
    /// ```
    /// # use ringccl_collectives::timeline::{CollectiveTrace, TraceFile};
    /// let file = TraceFile::to_writer(std::io::sink(), 0)?;
    /// assert_eq!(CollectiveTrace::new(file.row("c"), "shm").transport(), "shm");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// Records a call run by a device library (NCCL) for rank `rank` of `world_size`:
    /// `op`, started at `started`, issued with `deadline`, ending now with `result`. The
    /// library chose the schedule, so no bytes per peer are given.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use ringccl_collectives::timeline::{CollectiveTrace, TraceFile};
    /// use ringccl_collectives::{DType, Deadline, OpDesc, ReduceOp};
    ///
    /// let file = TraceFile::to_writer(std::io::sink(), 0)?;
    /// let trace = CollectiveTrace::new(file.new_row("collectives"), "nccl");
    /// let op = OpDesc::all_reduce(1, DType::F32, 1024, ReduceOp::Sum);
    /// let deadline = Deadline::after(Duration::from_secs(5));
    /// trace.record_device_call(&op, 0, 2, deadline, Instant::now(), &Ok(()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn record_device_call(
        &self,
        op: &OpDesc,
        rank: usize,
        world_size: usize,
        deadline: Deadline,
        started: Instant,
        result: &Result<(), Error>,
    ) {
        self.record(Call {
            op,
            algorithm: Some(Algorithm::Device),
            rank,
            world_size,
            traffic: PeerTraffic::default(),
            deadline,
            started,
            result,
        });
    }

    /// Records `call`, which ends now.
    pub(crate) fn record(&self, call: Call<'_>) {
        let end = Instant::now();
        let deadline = call.deadline;
        // The deadline was fixed at issue: issue = deadline - timeout (unknown for the
        // century-long "no deadline", whose instant is capped).
        let issued = deadline.at().checked_sub(deadline.timeout());
        let queued = issued.map_or_else(Default::default, |at| {
            call.started.saturating_duration_since(at)
        });
        let (peers, error) = match call.result {
            Ok(()) => (call.traffic, None),
            Err(e) => (PeerTraffic::default(), Some(e.to_string())),
        };
        let bytes = call.op.count * call.op.dtype.map_or(0, |d| d.size() as u64);
        let args = CollectiveArgs {
            op: *call.op,
            bytes,
            algorithm: call.algorithm,
            transport: self.transport,
            rank: call.rank,
            world_size: call.world_size,
            queued,
            peers,
            error,
        };
        self.row.record(Span::new(
            call.op.kind.name(),
            call.started,
            end,
            SpanArgs::Collective(Box::new(args)),
        ));
    }
}

/// Payload bytes `schedule` exchanges with each peer, in order of first appearance.
pub(super) fn peer_bytes(schedule: &Schedule, elem_size: usize) -> Vec<PeerBytes> {
    let mut peers: Vec<PeerBytes> = Vec::new();
    let sends = schedule.sends.iter().map(|s| (s.peer, s.range.len(), true));
    let recvs = schedule
        .recvs
        .iter()
        .map(|r| (r.peer, r.range.len(), false));
    for (peer, len, sent) in sends.chain(recvs) {
        let i = match peers.iter().position(|p| p.peer == peer) {
            Some(i) => i,
            None => {
                peers.push(PeerBytes {
                    peer,
                    ..PeerBytes::default()
                });
                peers.len() - 1
            }
        };
        let bytes = (len * elem_size) as u64;
        if sent {
            peers[i].sent += bytes;
        } else {
            peers[i].received += bytes;
        }
    }
    peers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::ring_all_reduce;

    #[test]
    fn a_ring_all_reduce_moves_two_thirds_of_the_buffer_each_way_on_three_ranks() {
        // 3 ranks, 300 f32: reduce-scatter and all-gather each pass 2 segments of 100
        // elements to the next rank and take 2 from the previous one.
        let schedule = ring_all_reduce(1, 3, 300, 4, 1 << 20);
        let peers = peer_bytes(&schedule, 4);
        let to_next = peers.iter().find(|p| p.peer == 2).unwrap();
        let from_prev = peers.iter().find(|p| p.peer == 0).unwrap();
        assert_eq!((to_next.sent, to_next.received), (1600, 0));
        assert_eq!((from_prev.sent, from_prev.received), (0, 1600));
        assert_eq!(peers.len(), 2);
    }
}
