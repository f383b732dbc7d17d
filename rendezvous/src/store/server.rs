//! The store server: a small accept loop on rank 0, one thread per client connection.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::SetupError;
use tracing::warn;

use super::protocol::{
    encode_response, Hello, Op, ProtocolError, RequestHeader, Status, HELLO_LEN, REQUEST_HEADER_LEN,
};
use super::StoreListener;
use crate::auth::{authenticate, mismatch_reason, AuthToken, Role};
use crate::deadline_io::{read_exact_by, write_all_by};
use ringccl_transports::poll::{wait_any, Interest};

/// How long a client may take to send its hello, or the rest of a request it started.
const CLIENT_STALL_LIMIT: Duration = Duration::from_secs(10);
/// How often idle threads look at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// Most simultaneous client connections; more are refused.
const MAX_CONNECTIONS: usize = 4096;
/// Most bytes of keys and values held at once.
const MAX_STORED_BYTES: usize = 256 << 20;

#[derive(Default)]
struct Shared {
    token: Option<AuthToken>,
    stop: AtomicBool,
    data: Mutex<Data>,
    connections: Mutex<Vec<TcpStream>>,
}

#[derive(Default)]
struct Data {
    map: HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
}

/// A running rendezvous store. Stops (closing every client connection) when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Starts serving on `listener`, admitting any client that speaks the protocol.
    pub fn start(listener: StoreListener) -> Result<StoreServer, SetupError> {
        StoreServer::start_authenticated(listener, None)
    }

    /// Starts serving on `listener`; with a token, only clients that prove they hold it
    /// are served (the others are refused and logged).
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
            ..Shared::default()
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

    /// The address the store listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Ok(conns) = self.shared.connections.lock() {
            for conn in conns.iter() {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
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
            Ok((stream, peer)) => {
                let admitted = shared.connections.lock().ok().and_then(|mut conns| {
                    conns.retain(|c| c.peer_addr().is_ok());
                    if conns.len() >= MAX_CONNECTIONS {
                        return None;
                    }
                    let clone = stream.try_clone().ok()?;
                    conns.push(clone);
                    Some(())
                });
                if admitted.is_none() {
                    warn!(
                        %peer,
                        limit = MAX_CONNECTIONS,
                        "store refused a connection: too many connections"
                    );
                    continue;
                }
                let conn_shared = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name("ringccl-store-conn".into())
                    .spawn(move || serve_client(stream, peer, conn_shared));
                if let Err(e) = spawned {
                    warn!(%peer, error = %e, "store cannot serve a connection: no thread");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = wait_any(
                    &[Interest::readable(&listener)],
                    Instant::now() + STOP_CHECK,
                );
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Transient (EMFILE, ECONNABORTED, ...): back off instead of spinning.
                warn!(error = %e, "store accept failed; backing off");
                thread::sleep(STOP_CHECK);
            }
        }
    }
}

enum ClientError {
    Io(io::Error),
    Protocol(ProtocolError),
    Auth(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Protocol(e) => write!(f, "{e}"),
            ClientError::Auth(reason) => f.write_str(reason),
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

fn serve_client(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    match serve(&stream, &shared) {
        Ok(()) => {}
        Err(ClientError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {}
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

fn serve(stream: &TcpStream, shared: &Shared) -> Result<(), ClientError> {
    let mut hello = [0u8; HELLO_LEN];
    read_exact_by(stream, &mut hello, Instant::now() + CLIENT_STALL_LIMIT)?;
    let theirs = Hello::decode(&hello)?;
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
        let (status, body) = apply(shared, request.op, key, value);
        let response = encode_response(status, &body);
        write_all_by(stream, &response, Instant::now() + CLIENT_STALL_LIMIT)?;
    }
}

fn apply(shared: &Shared, op: Op, key: Vec<u8>, value: Vec<u8>) -> (Status, Vec<u8>) {
    let Ok(mut data) = shared.data.lock() else {
        return (Status::Refused, b"store state poisoned".to_vec());
    };
    match op {
        Op::Get => match data.map.get(&key) {
            Some(v) => (Status::Ok, v.clone()),
            None => (Status::NotFound, Vec::new()),
        },
        Op::Set => {
            let old = data.map.get(&key).map_or(0, |v| key.len() + v.len());
            let new_total = data.bytes - old + key.len() + value.len();
            if new_total > MAX_STORED_BYTES {
                return (Status::Refused, b"store is full".to_vec());
            }
            data.bytes = new_total;
            data.map.insert(key, value);
            (Status::Ok, Vec::new())
        }
    }
}
