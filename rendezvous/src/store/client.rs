//! The store client every rank (rank 0 included) uses during rendezvous.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::SetupError;

use super::protocol::{
    encode_request, Hello, Op, ResponseHeader, Status, HELLO_LEN, MAX_KEY_LEN, MAX_VALUE_LEN,
    RESPONSE_HEADER_LEN,
};
use crate::auth::{authenticate, mismatch_reason, AuthToken, Role};
use crate::deadline_io::{deadline_after, read_exact_by, write_all_by};
use crate::fd_limit;

/// Why a connection attempt's greeting did not succeed.
enum Greeting {
    /// No answer, or the connection closed: try again.
    Unanswered(String),
    /// The store answered and refused: final.
    Failed(SetupError),
}

/// Longest single connection attempt; a rank retries until its deadline.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_millis(200);

/// A connection to the rendezvous store.
pub struct StoreClient {
    stream: TcpStream,
    addr: SocketAddr,
    rank: usize,
    timeout: Duration,
    token: Option<AuthToken>,
    /// Prefix of every key this client reads or writes (empty for the job's own client).
    namespace: String,
}

impl StoreClient {
    /// Connects to the store at one of `addrs`, retrying (the store may not be up yet)
    /// until `timeout` has passed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringccl_rendezvous::store::{StoreClient, StoreServer};
    /// use ringccl_rendezvous::StoreListener;
    /// let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect(
        addrs: &[SocketAddr],
        rank: usize,
        timeout: Duration,
    ) -> Result<StoreClient, SetupError> {
        StoreClient::connect_authenticated(addrs, rank, timeout, None)
    }

    /// [`StoreClient::connect`], proving to the store that this rank holds `token`
    /// (and checking that the store holds it too).
    ///
    /// A connection the store closes or leaves unanswered before its hello (a store
    /// crowded by strangers cuts off the oldest silent connections; a store out of file
    /// descriptors cannot accept) is retried like a refused one, until `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringccl_rendezvous::store::{StoreClient, StoreServer};
    /// use ringccl_rendezvous::{AuthToken, StoreListener};
    /// let token = AuthToken::new("s3cret");
    /// let listener = StoreListener::bind("127.0.0.1:0")?;
    /// let server = StoreServer::start_authenticated(listener, token.clone())?;
    /// let addrs = [server.local_addr()];
    /// let client = StoreClient::connect_authenticated(&addrs, 0, Duration::from_secs(10), token)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_authenticated(
        addrs: &[SocketAddr],
        rank: usize,
        timeout: Duration,
        token: Option<AuthToken>,
    ) -> Result<StoreClient, SetupError> {
        StoreClient::connect_reporting(addrs, rank, timeout, token, &|_| {})
    }

    /// [`StoreClient::connect_authenticated`], telling `failed` each failed attempt's error.
    pub(crate) fn connect_reporting(
        addrs: &[SocketAddr],
        rank: usize,
        timeout: Duration,
        token: Option<AuthToken>,
        failed: &dyn Fn(&str),
    ) -> Result<StoreClient, SetupError> {
        let deadline = deadline_after(timeout);
        let mut backoff = Duration::from_millis(5);
        let mut last_error = String::from("no attempt made");
        // The address whose last connection was accepted but left unanswered, if any.
        let mut silent = None;
        loop {
            for &addr in addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match TcpStream::connect_timeout(&addr, left.min(CONNECT_ATTEMPT)) {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        let mut client = StoreClient {
                            stream,
                            addr,
                            rank,
                            timeout,
                            token: token.clone(),
                            namespace: String::new(),
                        };
                        let attempt = deadline.min(Instant::now() + CONNECT_ATTEMPT);
                        match client.hello(attempt) {
                            Ok(()) => return Ok(client),
                            Err(Greeting::Failed(e)) => return Err(e),
                            Err(Greeting::Unanswered(why)) => {
                                silent = Some(addr);
                                last_error = format!("{addr}: {why}");
                                failed(&last_error);
                            }
                        }
                    }
                    Err(e) if fd_limit::is_exhaustion(&e) => {
                        return Err(fd_limit::exhausted(
                            rank,
                            format!("connecting to the rendezvous store at {addr}"),
                            &e,
                        ));
                    }
                    Err(e) => {
                        silent = None;
                        last_error = format!("{addr}: {e}");
                        failed(&last_error);
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if let (true, Some(addr)) = (left.is_zero(), silent) {
                // Something accepts connections there but does not answer as a store.
                return Err(SetupError::RendezvousTimeout {
                    rank,
                    waiting_for: format!(
                        "the rendezvous store at {addr} to answer ({last_error}; is something other than rank 0 listening there?)"
                    ),
                    timeout,
                });
            }
            if left.is_zero() {
                return Err(SetupError::StoreUnreachable {
                    rank,
                    addr: addrs
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" or "),
                    timeout,
                    last_error,
                });
            }
            thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn hello(&mut self, deadline: Instant) -> Result<(), Greeting> {
        let mut reply = [0u8; HELLO_LEN];
        let ours = self.token.is_some();
        write_all_by(&self.stream, &Hello::current(ours).encode(), deadline)
            .and_then(|()| read_exact_by(&self.stream, &mut reply, deadline))
            .map_err(|e| {
                Greeting::Unanswered(if e.kind() == io::ErrorKind::TimedOut {
                    "the connection was accepted but the hello went unanswered \
                     (if rank 0 is there, is it overloaded or out of file descriptors: see its RLIMIT_NOFILE?)"
                        .to_string()
                } else {
                    format!("the store closed the connection before answering its hello ({e})")
                })
            })?;
        let handshake = |reason: String| {
            Greeting::Failed(SetupError::Handshake {
                rank: self.rank,
                peer: format!("rendezvous store at {}", self.addr),
                reason,
            })
        };
        let theirs = Hello::decode(&reply).map_err(|e| handshake(e.to_string()))?;
        if let Some(reason) = mismatch_reason(ours, theirs.authenticated) {
            return Err(handshake(reason));
        }
        if let Some(token) = &self.token {
            authenticate(&self.stream, token, Role::Initiator, deadline).map_err(handshake)?;
        }
        Ok(())
    }

    /// A second connection to the same store, for `rank` of a sub-group, whose keys all
    /// live under `namespace` (appended to this client's own): several groups can
    /// rendezvous through one store without seeing each other's keys. An abort is still
    /// seen by every client of the store.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// # let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut job = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// let mut group = job.scoped("group/1/", 0)?;
    /// group.set("ready", b"1")?;
    /// assert_eq!(job.get("ready")?, None);
    /// assert_eq!(job.get("group/1/ready")?, Some(b"1".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scoped(&self, namespace: &str, rank: usize) -> Result<StoreClient, SetupError> {
        let mut client = StoreClient::connect_authenticated(
            &[self.addr],
            rank,
            self.timeout,
            self.token.clone(),
        )?;
        client.namespace = format!("{}{namespace}", self.namespace);
        Ok(client)
    }

    /// `key` inside this client's namespace.
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.namespace)
    }

    /// The local address of the connection: the interface this host uses to reach the
    /// store, and so the one its peers can most likely reach it on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Sets `key` to `value`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// # let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// client.set("greeting", b"hello")?;
    /// assert_eq!(client.get("greeting")?, Some(b"hello".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
        let key = &self.key(key);
        match self.request(Op::Set, key, value)? {
            (Status::Ok, _) => Ok(()),
            (status, body) => Err(self.unexpected(key, status, &body)),
        }
    }

    /// Sets `key` to `value` unless it is already set: `None` when this call set it,
    /// `Some(value already there)` otherwise. Exactly one of several racing callers
    /// gets `None`, so a key can be claimed once.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// # let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// assert_eq!(client.set_if_absent("owner", b"first")?, None);
    /// assert_eq!(client.set_if_absent("owner", b"second")?, Some(b"first".to_vec()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_if_absent(
        &mut self,
        key: &str,
        value: &[u8],
    ) -> Result<Option<Vec<u8>>, SetupError> {
        let key = &self.key(key);
        match self.request(Op::SetIfAbsent, key, value)? {
            (Status::Ok, _) => Ok(None),
            (Status::Exists, existing) => Ok(Some(existing)),
            (status, body) => Err(self.unexpected(key, status, &body)),
        }
    }

    /// Fetches `key`, if it exists.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// # let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// assert_eq!(client.get("never set")?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError> {
        let key = &self.key(key);
        match self.request(Op::Get, key, &[])? {
            (Status::Ok, value) => Ok(Some(value)),
            (Status::NotFound, _) => Ok(None),
            (status, body) => Err(self.unexpected(key, status, &body)),
        }
    }

    /// Abandons start-up for every rank: from now on every request to the store is
    /// answered with [`SetupError::RendezvousAborted`] quoting `reason` (the first
    /// reason given, if another process aborted first).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, SetupError, StoreListener};
    /// # let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// client.abort("rank 1 was started twice")?;
    /// let err = client.get("anything").unwrap_err();
    /// assert!(matches!(err, SetupError::RendezvousAborted { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn abort(&mut self, reason: &str) -> Result<(), SetupError> {
        let reason = &reason.as_bytes()[..reason.len().min(MAX_VALUE_LEN)];
        match self.request(Op::Abort, "", reason)? {
            (Status::Ok | Status::Aborted, _) => Ok(()),
            (status, body) => Err(self.unexpected("", status, &body)),
        }
    }

    /// Fails with [`SetupError::RendezvousAborted`] if some process has abandoned
    /// start-up (see [`StoreClient::abort`]); one round trip.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// # let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// assert!(client.check().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&mut self) -> Result<(), SetupError> {
        // An empty key is never set: the answer is "not found" unless the store was aborted.
        self.get("").map(|_| ())
    }

    /// Waits until `key` exists and returns its value; `waiting_for` describes, for the
    /// timeout error, who was supposed to set it. Fails at once if start-up was aborted.
    ///
    /// ```
    /// # use std::time::{Duration, Instant};
    /// # use ringccl_rendezvous::{store::{StoreClient, StoreServer}, StoreListener};
    /// # let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
    /// let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
    /// client.set("ready", b"1")?;
    /// let deadline = Instant::now() + Duration::from_secs(5);
    /// assert_eq!(client.wait("ready", deadline, &|| "the setter".into())?, b"1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait(
        &mut self,
        key: &str,
        deadline: Instant,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, SetupError> {
        let mut backoff = Duration::from_millis(1);
        loop {
            if let Some(value) = self.get(key)? {
                return Ok(value);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SetupError::RendezvousTimeout {
                    rank: self.rank,
                    waiting_for: waiting_for(),
                    timeout: self.timeout,
                });
            }
            thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn request(
        &mut self,
        op: Op,
        key: &str,
        value: &[u8],
    ) -> Result<(Status, Vec<u8>), SetupError> {
        if key.len() > MAX_KEY_LEN || value.len() > MAX_VALUE_LEN {
            return Err(SetupError::InvalidArgument(format!(
                "store key of {} bytes / value of {} bytes exceeds the limits ({MAX_KEY_LEN} / {MAX_VALUE_LEN})",
                key.len(),
                value.len()
            )));
        }
        let deadline = deadline_after(self.timeout);
        let message = encode_request(op, key.as_bytes(), value);
        let mut header = [0u8; RESPONSE_HEADER_LEN];
        write_all_by(&self.stream, &message, deadline)
            .and_then(|()| read_exact_by(&self.stream, &mut header, deadline))
            .map_err(|e| self.io_error("talking to the rendezvous store", e))?;
        let response = ResponseHeader::decode(&header).map_err(|e| SetupError::Handshake {
            rank: self.rank,
            peer: format!("rendezvous store at {}", self.addr),
            reason: e.to_string(),
        })?;
        let mut body = vec![0u8; response.value_len];
        read_exact_by(&self.stream, &mut body, deadline)
            .map_err(|e| self.io_error("reading from the rendezvous store", e))?;
        Ok((response.status, body))
    }

    fn io_error(&self, what: &str, source: io::Error) -> SetupError {
        if source.kind() == io::ErrorKind::TimedOut {
            return SetupError::RendezvousTimeout {
                rank: self.rank,
                waiting_for: format!(
                    "the rendezvous store at {} to answer (is something other than rank 0 listening there?)",
                    self.addr
                ),
                timeout: self.timeout,
            };
        }
        SetupError::Io {
            rank: self.rank,
            context: format!("{what} at {} (did rank 0 exit or fail?)", self.addr),
            source,
        }
    }

    /// The error for an answer that is not the one the operation expects: an aborted
    /// store, a refusal, or a status that makes no sense for the request.
    fn unexpected(&self, key: &str, status: Status, body: &[u8]) -> SetupError {
        let text = String::from_utf8_lossy(body).into_owned();
        match status {
            Status::Aborted => SetupError::RendezvousAborted {
                rank: self.rank,
                reason: text,
            },
            Status::Refused => SetupError::Io {
                rank: self.rank,
                context: format!("the rendezvous store at {} refused key {key:?}", self.addr),
                source: io::Error::other(text),
            },
            other => SetupError::Handshake {
                rank: self.rank,
                peer: format!("rendezvous store at {}", self.addr),
                reason: format!("answered {other:?} to a request on key {key:?}"),
            },
        }
    }
}

impl fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreClient")
            .field("addr", &self.addr)
            .field("rank", &self.rank)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl super::Store for StoreClient {
    fn describe(&self) -> String {
        format!("rendezvous store at {}", self.addr)
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
        StoreClient::set(self, key, value)
    }

    fn set_if_absent(&mut self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>, SetupError> {
        StoreClient::set_if_absent(self, key, value)
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError> {
        StoreClient::get(self, key)
    }

    fn scoped(&self, namespace: &str, rank: usize) -> Result<Box<dyn super::Store>, SetupError> {
        Ok(Box::new(StoreClient::scoped(self, namespace, rank)?))
    }

    fn wait(
        &mut self,
        key: &str,
        deadline: Instant,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, SetupError> {
        StoreClient::wait(self, key, deadline, waiting_for)
    }

    fn abort(&mut self, reason: &str) -> Result<(), SetupError> {
        StoreClient::abort(self, reason)
    }

    fn check(&mut self) -> Result<(), SetupError> {
        StoreClient::check(self)
    }

    fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.local_addr().ok().map(|a| a.ip())
    }
}
