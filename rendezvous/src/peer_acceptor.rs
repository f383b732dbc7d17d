//! A rank's data listener during start-up: accepts the higher ranks' connections and
//! runs each handshake on its own thread, so a silent or slow stranger delays nobody.
//!
//! Pending connections are bounded per source address and in all
//! ([`PendingConnections`]); the oldest silent one is cut off to make room. The acceptor
//! answers a hello only after checking it and claiming its slot (rank, channel), so a
//! connecting rank that has read the answer knows it was accepted; one cut off before
//! that reads end-of-stream and connects again.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use ringccl_transports::poll::{wait_any, Interest};
use tracing::{debug, warn};

use crate::auth::{authenticate, AuthToken, Role};
use crate::deadline_io::{read_exact_by, write_all_by};
use crate::fd_limit;
use crate::hello::{Channel, HelloError, PeerHello, PEER_HELLO_LEN};
use crate::pending::{Admission, PendingConnections};
use crate::SetupError;

/// How long an accepted connection may take to introduce itself before it is dropped.
const HELLO_LIMIT: Duration = Duration::from_secs(10);
/// Most connections from one address still to introduce themselves.
const PENDING_PER_SOURCE: usize = 16;
/// Most connections in all still to introduce themselves.
const PENDING_TOTAL: usize = 64;
/// Stack of a handshake thread (a hello and a challenge–response).
const HANDSHAKE_STACK: usize = 256 << 10;
/// How long answering a mismatched hello may take (the answer only helps the other side
/// say what differs).
const COURTESY_LIMIT: Duration = Duration::from_millis(500);

/// A higher rank's connection, handshaken.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub(crate) peer: usize,
    pub(crate) channel: Channel,
    pub(crate) stream: TcpStream,
    pub(crate) from: SocketAddr,
}

enum Outcome {
    Accepted(Accepted),
    Rejected {
        from: SocketAddr,
        reason: String,
        cut_off: bool,
    },
}

/// What every handshake thread shares.
struct Handshake {
    me: PeerHello,
    token: Option<AuthToken>,
    deadline: Instant,
    /// Slots (rank, channel) already claimed by a connection that introduced itself.
    claimed: Mutex<HashSet<(usize, Channel)>>,
}

/// The data listener and its handshakes in flight. Dropping it cuts off every
/// connection still handshaking.
#[derive(Debug)]
pub(crate) struct PeerAcceptor {
    rank: usize,
    listener: TcpListener,
    pending: PendingConnections,
    shared: Arc<Handshake>,
    outcomes: Receiver<Outcome>,
    sender: Sender<Outcome>,
    /// Handshake threads write a byte to `wake_tx` after sending their outcome, so that
    /// [`PeerAcceptor::next`] can sleep in `poll` on the listener and `wake_rx` together.
    wake_rx: UnixStream,
    wake_tx: Arc<UnixStream>,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("rank", &self.me.rank)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Accepted(a) => write!(f, "Accepted(rank {})", a.peer),
            Outcome::Rejected { from, reason, .. } => write!(f, "Rejected({from}: {reason})"),
        }
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl PeerAcceptor {
    /// Accepts on `listener` as the rank `me` describes; every handshake ends by
    /// `deadline` at the latest.
    pub(crate) fn new(
        listener: TcpListener,
        me: PeerHello,
        token: Option<AuthToken>,
        deadline: Instant,
    ) -> Result<PeerAcceptor, SetupError> {
        let rank = me.rank as usize;
        let io_error = |context: &str, source: io::Error| {
            fd_limit::or_else(
                rank,
                || format!("opening the data listener ({context})"),
                source,
                |source| SetupError::Io {
                    rank,
                    context: context.to_string(),
                    source,
                },
            )
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| io_error("non-blocking listener", e))?;
        let (wake_rx, wake_tx) =
            UnixStream::pair().map_err(|e| io_error("the acceptor's wake-up socket", e))?;
        wake_rx
            .set_nonblocking(true)
            .and_then(|()| wake_tx.set_nonblocking(true))
            .map_err(|e| io_error("the acceptor's wake-up socket", e))?;
        let what = match listener.local_addr() {
            Ok(addr) => format!("rank {rank}'s data listener on {addr}"),
            Err(_) => format!("rank {rank}'s data listener"),
        };
        let (sender, outcomes) = mpsc::channel();
        Ok(PeerAcceptor {
            rank,
            listener,
            pending: PendingConnections::new(PENDING_PER_SOURCE, PENDING_TOTAL, what),
            shared: Arc::new(Handshake {
                me,
                token,
                deadline,
                claimed: Mutex::default(),
            }),
            outcomes,
            sender,
            wake_rx,
            wake_tx: Arc::new(wake_tx),
        })
    }

    /// The next higher rank's connection to have introduced itself, or `None` once
    /// `until` passes first. Fails only when this process is out of descriptors or
    /// cannot wait.
    pub(crate) fn next(&mut self, until: Instant) -> Result<Option<Accepted>, SetupError> {
        loop {
            self.accept_ready()?;
            while let Ok(outcome) = self.outcomes.try_recv() {
                match outcome {
                    Outcome::Accepted(accepted) => {
                        debug!(rank = self.rank, peer = accepted.peer, channel = ?accepted.channel, from = %accepted.from, "accepted a higher rank");
                        return Ok(Some(accepted));
                    }
                    Outcome::Rejected { from, cut_off, .. } if cut_off => {
                        debug!(rank = self.rank, %from, "a silent connection was cut off");
                    }
                    Outcome::Rejected { from, reason, .. } => {
                        warn!(rank = self.rank, %from, %reason, "rejected a connection to the data listener");
                    }
                }
            }
            let ready = wait_any(
                &[
                    Interest::readable(&self.listener),
                    Interest::readable(&self.wake_rx),
                ],
                until,
            )
            .map_err(|source| SetupError::Io {
                rank: self.rank,
                context: "waiting for peer connections".into(),
                source,
            })?;
            if !ready {
                return Ok(None);
            }
            let mut drain = [0u8; 64];
            while matches!((&self.wake_rx).read(&mut drain), Ok(n) if n > 0) {}
        }
    }

    /// Accepts every connection waiting in the backlog and starts its handshake.
    fn accept_ready(&mut self) -> Result<(), SetupError> {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => self.start_handshake(stream, from)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if fd_limit::is_exhaustion(&e) => {
                    return Err(self.exhausted(&e));
                }
                Err(e) => {
                    // Transient (ECONNABORTED, ENOBUFS, ...): try again shortly.
                    warn!(rank = self.rank, error = %e, "accepting a peer connection failed; retrying");
                    thread::sleep(Duration::from_millis(10));
                    return Ok(());
                }
            }
        }
    }

    fn exhausted(&self, e: &io::Error) -> SetupError {
        fd_limit::exhausted(
            self.rank,
            "accepting connections from higher ranks on the data listener".into(),
            e,
        )
    }

    fn start_handshake(&mut self, stream: TcpStream, from: SocketAddr) -> Result<(), SetupError> {
        let admission = match self.pending.admit(&stream, from.ip()) {
            Ok(admission) => admission,
            Err(e) if fd_limit::is_exhaustion(&e) => return Err(self.exhausted(&e)),
            Err(e) => {
                warn!(rank = self.rank, %from, error = %e, "refused a connection: cannot track it");
                return Ok(());
            }
        };
        let shared = Arc::clone(&self.shared);
        let sender = self.sender.clone();
        let wake = Arc::clone(&self.wake_tx);
        let spawned = thread::Builder::new()
            .name("ringccl-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                let outcome = handshake(stream, from, admission, &shared);
                if sender.send(outcome).is_ok() {
                    // A full wake-up socket already holds a byte: nothing is lost.
                    let _ = (&*wake).write(&[1]);
                }
            });
        if let Err(e) = spawned {
            warn!(rank = self.rank, %from, error = %e, "refused a connection: no thread to handshake it");
        }
        Ok(())
    }
}

impl Drop for PeerAcceptor {
    fn drop(&mut self) {
        self.pending.cut_off_all();
    }
}

/// The acceptor's side of one handshake: read and check the hello, claim the slot,
/// answer, then (with a token) the challenge–response.
fn handshake(
    stream: TcpStream,
    from: SocketAddr,
    admission: Admission,
    shared: &Handshake,
) -> Outcome {
    let me = &shared.me;
    let deadline = shared.deadline.min(Instant::now() + HELLO_LIMIT);
    let rejected = |reason: String, admission: &Admission| Outcome::Rejected {
        from,
        reason,
        cut_off: admission.was_cut_off(),
    };
    let ready = stream
        .set_nonblocking(false)
        .map_err(|e| format!("blocking mode: {e}"));
    if let Err(reason) = ready {
        return rejected(reason, &admission);
    }
    let mut raw = [0u8; PEER_HELLO_LEN];
    if let Err(e) = read_exact_by(&stream, &mut raw, deadline) {
        return rejected(format!("reading hello: {e}"), &admission);
    }
    let theirs = match PeerHello::decode_checked(&raw, me) {
        Ok(theirs) => theirs,
        Err(e) => {
            if !matches!(e, HelloError::BadMagic | HelloError::Truncated { .. }) {
                // A ringccl rank of another job, version or setting: answer, so that it
                // can say what differs too.
                let _ = write_all_by(&stream, &me.encode(), Instant::now() + COURTESY_LIMIT);
            }
            return rejected(e.to_string(), &admission);
        }
    };
    let peer = theirs.rank as usize;
    let slot = (peer, theirs.channel);
    if peer <= me.rank as usize || !locked(&shared.claimed).insert(slot) {
        return rejected(
            format!(
                "it says it is rank {peer} ({:?} channel), but only ranks above {} connect here and each once per channel",
                theirs.channel, me.rank
            ),
            &admission,
        );
    }
    admission.introduced();
    let answer = PeerHello {
        channel: theirs.channel,
        ..*me
    };
    let answered = write_all_by(&stream, &answer.encode(), deadline)
        .map_err(|e| format!("sending hello: {e}"))
        .and_then(|()| match &shared.token {
            Some(token) => authenticate(&stream, token, Role::Acceptor, deadline)
                .map_err(|e| format!("authentication failed: {e}")),
            None => Ok(()),
        });
    match answered {
        Ok(()) => Outcome::Accepted(Accepted {
            peer,
            channel: theirs.channel,
            stream,
            from,
        }),
        Err(reason) => {
            locked(&shared.claimed).remove(&slot);
            Outcome::Rejected {
                from,
                reason,
                cut_off: false,
            }
        }
    }
}
