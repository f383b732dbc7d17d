//! The engine's hook: one span per collective call on its group's row.

use std::time::Instant;

use super::row::Timeline;
use super::span::{CollectiveArgs, PeerBytes, PeerTraffic, Span, SpanArgs};
use ringccl_collectives::schedule::Schedule;
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::{Deadline, Error, OpDesc};

/// Where an engine puts its calls on the timeline: the row of its group's collectives,
/// and what carries the bytes (`"tcp"`, `"shm"`).
///
/// ```
/// use ringccl_observe::timeline::{CollectiveTrace, TraceFile};
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

/// A call in progress, opened on the timeline by [`CollectiveTrace::start`]: should it
/// never end (it hangs until the process is killed), the file still shows it, as an
/// unfinished span. Dropping it closes the opening (a call that ends, or unwinds).
#[derive(Debug)]
pub(crate) struct Started {
    row: Timeline,
    id: u64,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.row.close_open(self.id);
    }
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
    /// Its opening by [`CollectiveTrace::start`], if it was opened.
    pub(crate) opened: Option<Started>,
}

impl CollectiveTrace {
    /// Calls go on `row`; `transport` names what carries them.
    ///
    /// ```
    /// # use ringccl_observe::timeline::{CollectiveTrace, TraceFile};
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
    /// # use ringccl_observe::timeline::{CollectiveTrace, TraceFile};
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
    /// # use ringccl_observe::timeline::{CollectiveTrace, TraceFile};
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
    /// use ringccl_observe::timeline::{CollectiveTrace, TraceFile};
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
            opened: None,
        });
    }

    /// Opens the call `op`, run by `algorithm` for rank `rank` of `world_size`, started
    /// at `started` and issued with `deadline`, on the timeline: if it has not ended
    /// after [`UNFINISHED_AFTER`](super::buffer::UNFINISHED_AFTER), the file shows it as
    /// an unfinished span (and keeps extending it), so that a call that hangs until the
    /// process is killed is still seen. [`CollectiveTrace::record`] closes it.
    pub(crate) fn start(
        &self,
        op: &OpDesc,
        algorithm: Option<Algorithm>,
        (rank, world_size): (usize, usize),
        deadline: Deadline,
        started: Instant,
    ) -> Started {
        let args = self.args(
            op,
            algorithm,
            (rank, world_size),
            deadline,
            started,
            (PeerTraffic::default(), None),
        );
        let id = self.row.open(Span::new(
            op.kind.name(),
            started,
            started,
            SpanArgs::Collective(Box::new(args)),
        ));
        Started {
            row: self.row.clone(),
            id,
        }
    }

    fn args(
        &self,
        op: &OpDesc,
        algorithm: Option<Algorithm>,
        (rank, world_size): (usize, usize),
        deadline: Deadline,
        started: Instant,
        (peers, error): (PeerTraffic, Option<String>),
    ) -> CollectiveArgs {
        // The deadline was fixed at issue: issue = deadline - timeout (unknown for the
        // century-long "no deadline", whose instant is capped).
        let issued = deadline.at().checked_sub(deadline.timeout());
        let queued =
            issued.map_or_else(Default::default, |at| started.saturating_duration_since(at));
        let bytes = op.count * op.dtype.map_or(0, |d| d.size() as u64);
        CollectiveArgs {
            op: *op,
            bytes,
            algorithm,
            transport: self.transport,
            rank,
            world_size,
            queued,
            peers,
            error,
        }
    }

    /// Records `call`, which ends now (and closes its opening, if it was opened).
    pub(crate) fn record(&self, call: Call<'_>) {
        let end = Instant::now();
        drop(call.opened);
        let outcome = match call.result {
            Ok(()) => (call.traffic, None),
            Err(e) => (PeerTraffic::default(), Some(e.to_string())),
        };
        let args = self.args(
            call.op,
            call.algorithm,
            (call.rank, call.world_size),
            call.deadline,
            call.started,
            outcome,
        );
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
    use ringccl_collectives::schedule::ring_all_reduce;

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
