//! The group runner: the one place that numbers calls, checks their arguments, keeps
//! the broken state and diagnoses failures, for every backend.

use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::{Deadline, Engine, Request, Sequence};
use crate::{Backend, BufferMut, BufferRef, Error, ReduceOp};

/// After a peer failure, how long to wait for other failing connections to show, so the
/// error can name the rank really at fault when this one was only blocked behind
/// another. Device engines also use it to tell a peer that exited from one that is
/// merely finishing.
pub const PEER_FAILURE_GRACE: Duration = Duration::from_secs(2);

struct RunState<E> {
    engine: E,
    /// The group's collective counter.
    seq: u64,
    /// Point-to-point message counters, per peer, for each direction.
    sent_to: Vec<u64>,
    received_from: Vec<u64>,
    /// The first error that broke the group.
    broken: Option<String>,
}

/// A [`Backend`] made of an [`Engine`] and the rules every backend shares: calls run one
/// at a time in issue order, each numbered (collectives by one counter, point-to-point
/// messages per direction of each pair), each checked with the same message for the same
/// misuse, each bounded by the deadline it was issued with. An error that leaves the
/// connections in an unknown state breaks the group: the engine is aborted and every
/// later call fails at once with [`Error::GroupBroken`].
pub struct GroupRunner<E> {
    name: &'static str,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    state: Mutex<RunState<E>>,
}

impl<E: Engine> GroupRunner<E> {
    /// Wraps `engine`, rank `rank` of `world_size`, whose calls default to `timeout`.
    pub fn with_engine(
        name: &'static str,
        rank: usize,
        world_size: usize,
        timeout: Duration,
        engine: E,
    ) -> GroupRunner<E> {
        GroupRunner {
            name,
            rank,
            world_size,
            timeout,
            state: Mutex::new(RunState {
                engine,
                seq: 0,
                sent_to: vec![0; world_size],
                received_from: vec![0; world_size],
                broken: None,
            }),
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, RunState<E>>, Error> {
        self.state.lock().map_err(|_| Error::GroupBroken {
            rank: self.rank,
            cause: "a thread panicked while running a collective on this group".into(),
        })
    }

    /// Runs one call: takes its number from `sequence`'s counter and hands it, with the
    /// engine, to `body`. The escape hatch for calls that are not a [`Request`] (an
    /// engine's own buffer types, such as device memory); everything else goes through
    /// [`Backend`]'s methods.
    pub fn run<R>(
        &self,
        sequence: Sequence,
        deadline: Deadline,
        body: impl FnOnce(&mut E, u64) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut state = self.lock()?;
        if let Some(cause) = &state.broken {
            return Err(Error::GroupBroken {
                rank: self.rank,
                cause: cause.clone(),
            });
        }
        let counter = match sequence {
            Sequence::Collective => Some(&mut state.seq),
            Sequence::SentTo(peer) => state.sent_to.get_mut(peer),
            Sequence::ReceivedFrom(peer) => state.received_from.get_mut(peer),
        };
        let Some(counter) = counter else {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {sequence:?} names no rank of a group of {}",
                self.rank, self.world_size
            )));
        };
        *counter += 1;
        let seq = *counter;
        let result =
            body(&mut state.engine, seq).map_err(|e| self.diagnose(&mut state, e, deadline));
        if let Err(e) = &result {
            if e.breaks_group() {
                state.broken = Some(e.to_string());
                state.engine.abort();
            }
        }
        result
    }

    /// Runs a [`Request`]: checks it, numbers it, executes it.
    fn submit(&self, request: Request<'_>, deadline: Deadline) -> Result<(), Error> {
        request.validate(self.rank, self.world_size)?;
        self.run(request.sequence(), deadline, |engine, seq| {
            let op = request.describe(seq);
            engine.execute(&op, request, deadline)
        })
    }

    /// Names every rank whose connection is gone: when this rank was only blocked behind
    /// a healthy peer, that is where the failure really is.
    fn diagnose(&self, state: &mut RunState<E>, mut error: Error, deadline: Deadline) -> Error {
        let (Error::Timeout { peer, gone, .. }
        | Error::PeerLost {
            rank: peer, gone, ..
        }) = &mut error
        else {
            return error;
        };
        let named = *peer;
        // Other failures may be seconds behind (a cut link is noticed by keepalive):
        // give them a moment to show.
        let until = Instant::now() + PEER_FAILURE_GRACE.min(deadline.timeout());
        loop {
            let others: Vec<usize> = state
                .engine
                .failed_peers()
                .into_iter()
                .filter(|&p| p != named && p != self.rank)
                .collect();
            if !others.is_empty() || Instant::now() >= until {
                gone.extend(others);
                return error;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl<E: Engine> Backend for GroupRunner<E> {
    fn name(&self) -> &str {
        self.name
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_reduce(
        &self,
        buf: BufferMut<'_>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::AllReduce { buf, op }, deadline)
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize, deadline: Deadline) -> Result<(), Error> {
        self.submit(Request::Broadcast { buf, root }, deadline)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), Error> {
        self.submit(Request::Barrier, deadline)
    }

    fn reduce(
        &self,
        buf: BufferMut<'_>,
        op: ReduceOp,
        root: usize,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::Reduce { buf, op, root }, deadline)
    }

    fn all_gather(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::AllGather { input, output }, deadline)
    }

    fn reduce_scatter(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::ReduceScatter { input, output, op }, deadline)
    }

    fn all_to_all(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::AllToAll { input, output }, deadline)
    }

    fn send(
        &self,
        buf: BufferRef<'_>,
        dst: usize,
        tag: u32,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(
            Request::Send {
                buf,
                peer: dst,
                tag,
            },
            deadline,
        )
    }

    fn recv(
        &self,
        buf: BufferMut<'_>,
        src: usize,
        tag: u32,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(
            Request::Recv {
                buf,
                peer: src,
                tag,
            },
            deadline,
        )
    }
}

impl<E: fmt::Debug> fmt::Debug for GroupRunner<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("GroupRunner");
        s.field("name", &self.name)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("timeout", &self.timeout);
        match self.state.try_lock() {
            Ok(state) => s.field("engine", &state.engine),
            Err(_) => s.field("engine", &"<running a call>"),
        };
        s.finish_non_exhaustive()
    }
}
