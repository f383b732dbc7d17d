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
}

impl StoreClient {
    /// Connects to the store at one of `addrs`, retrying (the store may not be up yet)
    /// until `timeout` has passed.
    pub fn connect(
        addrs: &[SocketAddr],
        rank: usize,
        timeout: Duration,
    ) -> Result<StoreClient, SetupError> {
        StoreClient::connect_authenticated(addrs, rank, timeout, None)
    }

    /// [`StoreClient::connect`], proving to the store that this rank holds `token`
    /// (and checking that the store holds it too).
    pub fn connect_authenticated(
        addrs: &[SocketAddr],
        rank: usize,
        timeout: Duration,
        token: Option<AuthToken>,
    ) -> Result<StoreClient, SetupError> {
        let deadline = deadline_after(timeout);
        let mut backoff = Duration::from_millis(5);
        let mut last_error = String::from("no attempt made");
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
                        };
                        return client.hello(deadline).map(|()| client);
                    }
                    Err(e) => last_error = format!("{addr}: {e}"),
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
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

    fn hello(&mut self, deadline: Instant) -> Result<(), SetupError> {
        let mut reply = [0u8; HELLO_LEN];
        let ours = self.token.is_some();
        write_all_by(&self.stream, &Hello::current(ours).encode(), deadline)
            .and_then(|()| read_exact_by(&self.stream, &mut reply, deadline))
            .map_err(|e| self.io_error("greeting the store", e))?;
        let handshake = |reason: String| SetupError::Handshake {
            rank: self.rank,
            peer: format!("rendezvous store at {}", self.addr),
            reason,
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

    /// The local address of the connection: the interface this host uses to reach the
    /// store, and so the one its peers can most likely reach it on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
        match self.request(Op::Set, key, value)? {
            (Status::Ok, _) => Ok(()),
            (_, reason) => Err(self.refused(key, &reason)),
        }
    }

    /// Fetches `key`, if it exists.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, SetupError> {
        match self.request(Op::Get, key, &[])? {
            (Status::Ok, value) => Ok(Some(value)),
            (Status::NotFound, _) => Ok(None),
            (Status::Refused, reason) => Err(self.refused(key, &reason)),
        }
    }

    /// Waits until `key` exists and returns its value; `waiting_for` describes, for the
    /// timeout error, who was supposed to set it.
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

    fn refused(&self, key: &str, reason: &[u8]) -> SetupError {
        SetupError::Io {
            rank: self.rank,
            context: format!("the rendezvous store at {} refused key {key:?}", self.addr),
            source: io::Error::other(String::from_utf8_lossy(reason).into_owned()),
        }
    }
}

impl fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreClient")
            .field("addr", &self.addr)
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl ringccl_transports::SetupStore for StoreClient {
    type Error = SetupError;

    fn set(&mut self, key: &str, value: &[u8]) -> Result<(), SetupError> {
        StoreClient::set(self, key, value)
    }

    fn wait(
        &mut self,
        key: &str,
        deadline: Instant,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, SetupError> {
        StoreClient::wait(self, key, deadline, waiting_for)
    }
}
