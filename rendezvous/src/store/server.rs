//! The store server: a small accept loop on rank 0, one thread per client connection.
//!
//! A connection that has not yet sent a well-formed hello is *pending*
//! ([`PendingConnections`]): at most [`PENDING_PER_SOURCE`] per address and
//! [`PENDING_TOTAL`] in all, the oldest cut off to make room, and each dropped after
//! [`CLIENT_STALL_LIMIT`] of silence. Past its hello a connection counts against
//! [`MAX_CONNECTIONS`] instead, and is never cut off. The
//! server keeps no descriptor of its own for a connection: each is closed by its thread
//! when it ends. Running out of descriptors (`EMFILE`) aborts the store with a reason
//! naming `RLIMIT_NOFILE`, so the ranks already connected learn why at once.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::SetupError;
use tracing::{debug, error, warn};

use super::protocol::{
    encode_response, Hello, Op, ProtocolError, RequestHeader, Status, HELLO_LEN, REQUEST_HEADER_LEN,
};
use super::StoreListener;
use crate::auth::{authenticate, mismatch_reason, AuthToken, Role};
use crate::deadline_io::{read_exact_by, write_all_by};
use crate::fd_limit;
use crate::pending::{Admission, PendingConnections};
use ringccl_transports::poll::{wait_any, Interest};

/// How long a client may take to send its hello, or the rest of a request it started.
const CLIENT_STALL_LIMIT: Duration = Duration::from_secs(10);
/// How often idle threads look at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// Most simultaneous client connections past their hello; more are refused.
const MAX_CONNECTIONS: usize = 4096;
/// Most connections from one address still to send their hello.
const PENDING_PER_SOURCE: usize = 16;
/// Most connections in all still to send their hello.
const PENDING_TOTAL: usize = 64;
/// Most bytes of keys and values held at once.
const MAX_STORED_BYTES: usize = 256 << 20;
/// Stack of a connection's thread (it holds a request and a hello, no more).
const CONNECTION_STACK: usize = 256 << 10;

struct Shared {
    token: Option<AuthToken>,
    stop: AtomicBool,
    data: Mutex<Data>,
    pending: PendingConnections,
    /// Connections past their hello.
    introduced: AtomicUsize,
    /// Connections past their hello that have not yet been told the store was aborted
    /// (answered `Aborted`, or asked for the abort themselves).
    unaware: AtomicUsize,
    /// Why the store ran out of descriptors, once it has.
    exhausted: Mutex<Option<String>>,
    /// Who is told of claims refused under a prefix (see [`StoreServer::on_refused_claim`]).
    claim_watch: Mutex<Option<ClaimWatch>>,
}

/// A set-if-absent refused because its key was already set: a second process claiming
/// what a first one holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedClaim {
    /// The key claimed twice.
    pub key: String,
    /// The value the first claimant stored.
    pub holder: String,
    /// The value the refused claimant offered.
    pub claimant: String,
}

struct ClaimWatch {
    prefix: Vec<u8>,
    notify: Box<dyn Fn(RefusedClaim) + Send + Sync>,
}

#[derive(Default)]
struct Data {
    map: HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
    /// The first abort's reason; every request is answered with it from then on.
    aborted: Option<Vec<u8>>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; recover the state regardless.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running rendezvous store. Stops when dropped: pending connections are cut off at
/// once, introduced ones are closed by their threads within 100 ms when idle.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Starts serving on `listener`, admitting any client that speaks the protocol.
    ///
    /// ```
    /// use ringccl_rendezvous::store::StoreServer;
    /// use ringccl_rendezvous::StoreListener;
    /// let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// assert_ne!(server.local_addr().port(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(listener: StoreListener) -> Result<StoreServer, SetupError> {
        StoreServer::start_authenticated(listener, None)
    }

    /// Starts serving on `listener`; with a token, only clients that prove they hold it
    /// are served (the others are refused and logged).
    ///
    /// ```
    /// use ringccl_rendezvous::store::StoreServer;
    /// use ringccl_rendezvous::{AuthToken, StoreListener};
    /// let listener = StoreListener::bind("127.0.0.1:0")?;
    /// let server = StoreServer::start_authenticated(listener, AuthToken::new("s3cret"))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_authenticated(
        listener: StoreListener,
        token: Option<AuthToken>,
    ) -> Result<StoreServer, SetupError> {
        let io_err = |context: &str, source| SetupError::Io {
            rank: 0,
            context: format!("starting the rendezvous store: {context}"),
            source,
        };
        let addr = listener
            .inner
            .local_addr()
            .map_err(|e| io_err("local address", e))?;
        listener
            .inner
            .set_nonblocking(true)
            .map_err(|e| io_err("non-blocking listener", e))?;
        let shared = Arc::new(Shared {
            token,
            stop: AtomicBool::new(false),
            data: Mutex::default(),
            pending: PendingConnections::new(
                PENDING_PER_SOURCE,
                PENDING_TOTAL,
                format!("the rendezvous store on {addr}"),
            ),
            introduced: AtomicUsize::new(0),
            unaware: AtomicUsize::new(0),
            exhausted: Mutex::new(None),
            claim_watch: Mutex::new(None),
        });
        let thread_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name("ringccl-store".into())
            .spawn(move || accept_loop(listener.inner, thread_shared))
            .map_err(|e| io_err("spawning the accept thread", e))?;
        Ok(StoreServer {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// From now on, calls `notify` (on the connection's thread) whenever a set-if-absent
    /// of a key starting with `prefix` is refused because the key is already set.
    /// Replaces any earlier watch. Rank 0 uses it to stop a running group when a second
    /// process claims one of its ranks after start-up.
    ///
    /// ```
    /// # use std::sync::mpsc;
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let (tx, rx) = mpsc::channel();
    /// server.on_refused_claim("seat/", move |claim| {
    ///     let _ = tx.send(claim);
    /// });
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// assert!(client.set_if_absent("seat/1", b"first")?.is_none());
    /// assert!(client.set_if_absent("seat/1", b"second")?.is_some());
    /// let claim = rx.recv_timeout(Duration::from_secs(5))?;
    /// assert_eq!((claim.holder.as_str(), claim.claimant.as_str()), ("first", "second"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_refused_claim(
        &self,
        prefix: &str,
        notify: impl Fn(RefusedClaim) + Send + Sync + 'static,
    ) {
        *locked(&self.shared.claim_watch) = Some(ClaimWatch {
            prefix: prefix.as_bytes().to_vec(),
            notify: Box::new(notify),
        });
    }

    /// The address the store listens on.
    ///
    /// ```
    /// # use ringccl_rendezvous::{store::StoreServer, StoreListener};
    /// let listener = StoreListener::bind("127.0.0.1:0")?;
    /// let bound = listener.local_addr()?;
    /// assert_eq!(StoreServer::start(listener)?.local_addr(), bound);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Why the store could not accept a connection for lack of file descriptors
    /// (naming `RLIMIT_NOFILE`), if that has happened.
    ///
    /// ```
    /// # use ringccl_rendezvous::{store::StoreServer, StoreListener};
    /// let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// assert_eq!(server.descriptors_exhausted(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn descriptors_exhausted(&self) -> Option<String> {
        locked(&self.shared.exhausted).clone()
    }
}

/// Which keys a store holds, read in place by the process that hosts it (rank 0's
/// start-up reports count who has joined without a round trip).
#[derive(Clone)]
pub(crate) struct KeyView(Arc<Shared>);

impl KeyView {
    /// Whether `key` is set.
    pub(crate) fn has(&self, key: &str) -> bool {
        locked(&self.0.data).map.contains_key(key.as_bytes())
    }
}

impl fmt::Debug for KeyView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyView").finish_non_exhaustive()
    }
}

impl StoreServer {
    /// A view of the keys this store holds.
    pub(crate) fn key_view(&self) -> KeyView {
        KeyView(Arc::clone(&self.shared))
    }

    /// Once the store has been aborted, waits until every connected client has been told
    /// (answered with the reason, or has asked for the abort itself) or has gone, or until
    /// `until`; returns whether all were told. Rank 0 calls it before it gives up, so that
    /// taking the store away does not hide the reason from ranks still waiting.
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// client.abort("giving up")?;
    /// assert!(server.await_abort_heard(Instant::now() + Duration::from_secs(5)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn await_abort_heard(&self, until: Instant) -> bool {
        loop {
            if self.shared.unaware.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.pending.cut_off_all();
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => admit(stream, peer, &shared),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = wait_any(
                    &[Interest::readable(&listener)],
                    Instant::now() + STOP_CHECK,
                );
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if fd_limit::is_exhaustion(&e) => {
                out_of_descriptors(&shared, &e);
                // The connection stays in the backlog; waiting is all that can be done.
                thread::sleep(STOP_CHECK);
            }
            Err(e) => {
                // Transient (ECONNABORTED, ENOBUFS, ...): back off instead of spinning.
                warn!(error = %e, "store accept failed; backing off");
                thread::sleep(STOP_CHECK);
            }
        }
    }
}

/// Serves `stream` on its own thread, unless the store is at its connection limit.
fn admit(stream: TcpStream, peer: SocketAddr, shared: &Arc<Shared>) {
    if shared.introduced.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
        warn!(
            %peer,
            limit = MAX_CONNECTIONS,
            "store refused a connection: too many connections"
        );
        return;
    }
    let admission = match shared.pending.admit(&stream, peer.ip()) {
        Ok(admission) => admission,
        Err(e) if fd_limit::is_exhaustion(&e) => return out_of_descriptors(shared, &e),
        Err(e) => {
            warn!(%peer, error = %e, "store refused a connection: cannot track it");
            return;
        }
    };
    let conn_shared = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name("ringccl-store-conn".into())
        .stack_size(CONNECTION_STACK)
        .spawn(move || serve_client(stream, peer, admission, conn_shared));
    if let Err(e) = spawned {
        warn!(%peer, error = %e, "store cannot serve a connection: no thread");
    }
}

/// Records that the store ran out of descriptors and aborts it with the reason, so the
/// ranks already connected learn why; logged loudly once.
fn out_of_descriptors(shared: &Shared, e: &io::Error) {
    let mut exhausted = locked(&shared.exhausted);
    if exhausted.is_some() {
        debug!(error = %e, "store accept still failing: out of file descriptors");
        return;
    }
    let detail = fd_limit::explain(e);
    error!(%detail, "rank 0's rendezvous store cannot accept connections: out of file descriptors");
    let reason = format!(
        "rank 0 ran out of file descriptors while accepting connections to the rendezvous store: {detail}"
    );
    let mut data = locked(&shared.data);
    data.aborted.get_or_insert_with(|| reason.into_bytes());
    *exhausted = Some(detail);
}

enum ClientError {
    Io(io::Error),
    Protocol(ProtocolError),
    Auth(String),
    /// Cut off while still silent, to make room for others.
    CutOff,
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Protocol(e) => write!(f, "{e}"),
            ClientError::Auth(reason) => f.write_str(reason),
            ClientError::CutOff => f.write_str("cut off while silent, to make room"),
        }
    }
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> ClientError {
        ClientError::Io(e)
    }
}

impl From<ProtocolError> for ClientError {
    fn from(e: ProtocolError) -> ClientError {
        ClientError::Protocol(e)
    }
}

/// Counts a connection among the introduced ones, and among those not yet told of an
/// abort, while it lives.
struct Introduced<'a> {
    shared: &'a Shared,
    told: bool,
}

impl<'a> Introduced<'a> {
    fn new(shared: &'a Shared) -> Introduced<'a> {
        shared.introduced.fetch_add(1, Ordering::SeqCst);
        shared.unaware.fetch_add(1, Ordering::SeqCst);
        Introduced {
            shared,
            told: false,
        }
    }

    /// This client now knows the store was aborted.
    fn told(&mut self) {
        if !self.told {
            self.told = true;
            self.shared.unaware.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Introduced<'_> {
    fn drop(&mut self) {
        self.told();
        self.shared.introduced.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve_client(stream: TcpStream, peer: SocketAddr, admission: Admission, shared: Arc<Shared>) {
    match serve(&stream, admission, &shared) {
        Ok(()) => {}
        Err(ClientError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {}
        Err(ClientError::CutOff) => {}
        Err(e @ ClientError::Protocol(_)) => {
            warn!(%peer, error = %e, "store rejected a connection: bad request");
        }
        Err(ClientError::Auth(reason)) => {
            warn!(%peer, %reason, "store refused a connection: authentication failed");
        }
        Err(ClientError::Io(e)) if !shared.stop.load(Ordering::SeqCst) => {
            warn!(%peer, error = %e, "store dropped a connection");
        }
        Err(_) => {}
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Reads a pending connection's hello; `CutOff` if the registry cut it off meanwhile.
/// Another version's hello is answered with ours before the error, so that the client
/// can say what differs too.
fn read_hello(stream: &TcpStream, admission: &Admission, ours: bool) -> Result<Hello, ClientError> {
    let mut hello = [0u8; HELLO_LEN];
    read_exact_by(stream, &mut hello, Instant::now() + CLIENT_STALL_LIMIT).map_err(|e| {
        if admission.was_cut_off() {
            ClientError::CutOff
        } else {
            e.into()
        }
    })?;
    Ok(Hello::decode(&hello).inspect_err(|e| {
        if matches!(e, ProtocolError::Version(_)) {
            let _ = write_all_by(
                stream,
                &Hello::current(ours).encode(),
                Instant::now() + STOP_CHECK,
            );
        }
    })?)
}

/// Answers the client's hello and, with a token, runs the challenge–response.
fn answer_hello(stream: &TcpStream, theirs: Hello, shared: &Shared) -> Result<(), ClientError> {
    let ours = shared.token.is_some();
    write_all_by(
        stream,
        &Hello::current(ours).encode(),
        Instant::now() + CLIENT_STALL_LIMIT,
    )?;
    if let Some(reason) = mismatch_reason(ours, theirs.authenticated) {
        return Err(ClientError::Auth(reason));
    }
    if let Some(token) = &shared.token {
        authenticate(
            stream,
            token,
            Role::Acceptor,
            Instant::now() + CLIENT_STALL_LIMIT,
        )
        .map_err(ClientError::Auth)?;
    }
    Ok(())
}

fn serve(stream: &TcpStream, admission: Admission, shared: &Shared) -> Result<(), ClientError> {
    let theirs = read_hello(stream, &admission, shared.token.is_some())?;
    // A well-formed hello ends the time during which the connection may be cut off: a
    // client that has read our answer must be able to count on the connection.
    admission.introduced();
    let mut introduced = Introduced::new(shared);
    answer_hello(stream, theirs, shared)?;
    let mut header = [0u8; REQUEST_HEADER_LEN];
    loop {
        // Wait for the first byte of the next request without a deadline on idleness,
        // but wake up regularly to honour the stop flag.
        stream.set_read_timeout(Some(STOP_CHECK))?;
        match (&*stream).read(&mut header[..1]) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if shared.stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let deadline = Instant::now() + CLIENT_STALL_LIMIT;
        read_exact_by(stream, &mut header[1..], deadline)?;
        let request = RequestHeader::decode(&header)?;
        // Lengths are bounded by the protocol limits, so these allocations are too.
        let mut key = vec![0u8; request.key_len];
        read_exact_by(stream, &mut key, deadline)?;
        let mut value = vec![0u8; request.value_len];
        read_exact_by(stream, &mut value, deadline)?;
        let op = request.op;
        // Kept only for a watched claim, which is rare: most requests copy nothing.
        let watched =
            (op == Op::SetIfAbsent && watches(shared, &key)).then(|| (key.clone(), value.clone()));
        let (status, body) = apply(shared, op, key, value);
        if let (Status::Exists, Some((key, claimant))) = (status, watched) {
            tell_refused_claim(shared, &key, &body, &claimant);
        }
        let response = encode_response(status, &body);
        write_all_by(stream, &response, Instant::now() + CLIENT_STALL_LIMIT)?;
        if status == Status::Aborted || op == Op::Abort {
            introduced.told();
        }
    }
}

/// Whether a refused claim of `key` is to be told.
fn watches(shared: &Shared, key: &[u8]) -> bool {
    locked(&shared.claim_watch)
        .as_ref()
        .is_some_and(|watch| key.starts_with(&watch.prefix))
}

fn tell_refused_claim(shared: &Shared, key: &[u8], holder: &[u8], claimant: &[u8]) {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let claim = RefusedClaim {
        key: text(key),
        holder: text(holder),
        claimant: text(claimant),
    };
    warn!(key = %claim.key, holder = %claim.holder, claimant = %claim.claimant, "a claim in the store was refused: the key is held");
    if let Some(watch) = locked(&shared.claim_watch).as_ref() {
        (watch.notify)(claim);
    }
}

fn apply(shared: &Shared, op: Op, key: Vec<u8>, value: Vec<u8>) -> (Status, Vec<u8>) {
    let mut data = locked(&shared.data);
    if let Some(reason) = &data.aborted {
        return (Status::Aborted, reason.clone());
    }
    match op {
        Op::Get => match data.map.get(&key) {
            Some(v) => (Status::Ok, v.clone()),
            None => (Status::NotFound, Vec::new()),
        },
        Op::SetIfAbsent if data.map.contains_key(&key) => {
            let existing = data.map.get(&key).cloned().unwrap_or_default();
            (Status::Exists, existing)
        }
        Op::Set | Op::SetIfAbsent => {
            let old = data.map.get(&key).map_or(0, |v| key.len() + v.len());
            let new_total = data.bytes - old + key.len() + value.len();
            if new_total > MAX_STORED_BYTES {
                return (Status::Refused, b"store is full".to_vec());
            }
            data.bytes = new_total;
            data.map.insert(key, value);
            (Status::Ok, Vec::new())
        }
        Op::Abort => {
            data.aborted = Some(value);
            (Status::Ok, Vec::new())
        }
    }
}
