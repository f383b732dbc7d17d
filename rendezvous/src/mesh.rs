//! Start-up: rank 0 hosts the store, every rank publishes its listening address, and the
//! ranks connect into a full mesh, each connection opened with a checked handshake. The
//! result is a [`Mesh`], whose [`Mesh::finish`] ends start-up.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::{MeshConfig, SetupError};
use ringccl_transports::poll::{wait_any, Interest};
use tracing::{debug, info, warn};

use crate::auth::{authenticate, AuthToken, Role};
use crate::deadline_io::{deadline_after, read_exact_by, write_all_by};
use crate::hello::{Channel, PeerHello, PEER_HELLO_LEN};
use crate::store::{resolve, StoreClient, StoreListener, StoreServer};

const JOB_KEY: &str = "ringccl/job";
/// How long an accepted stranger may take to introduce itself before it is dropped.
const HELLO_LIMIT: Duration = Duration::from_secs(10);

fn addr_key(rank: usize) -> String {
    format!("ringccl/addr/{rank}")
}

fn fresh_job_id() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// This rank's handshaken connections to every other rank, and the rendezvous store that
/// start-up steps after the mesh (shared-memory set-up, the NCCL unique id) still read.
///
/// Start-up ends with [`Mesh::finish`], on every rank: it hands the connections over and
/// lets rank 0 stop hosting the store once nobody reads it any more.
pub struct Mesh {
    rank: usize,
    world_size: usize,
    job_id: u64,
    dead_peer_timeout: Duration,
    /// The blocking connections to every rank (`None` for this rank).
    connections: MeshConnections,
    // Field order matters for drop: close the client before stopping the server.
    store: StoreClient,
    _server: Option<StoreServer>,
}

impl Mesh {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This job's random id (every rank of one job sees the same).
    pub fn job_id(&self) -> u64 {
        self.job_id
    }

    /// How long a silent peer host may take before its connection is declared dead
    /// (`InitOptions::dead_peer_timeout`), for whoever configures the connections.
    pub fn dead_peer_timeout(&self) -> Duration {
        self.dead_peer_timeout
    }

    /// The rendezvous store, for start-up steps that follow the mesh.
    pub fn store(&mut self) -> &mut StoreClient {
        &mut self.store
    }

    /// Ends start-up on every rank: ranks above 0 tell rank 0 they are done with the
    /// store (one byte on their connection), and rank 0 returns only once all have, so
    /// the store it hosts outlives every start-up reader. Returns the connections, still
    /// blocking, `None` at this rank's own index, and the store, which the group keeps
    /// for its lifetime.
    pub fn finish(self, deadline: Instant) -> Result<(MeshConnections, KeptStore), SetupError> {
        let rank = self.rank;
        let failed = |peer: usize, e: io::Error| SetupError::Io {
            rank,
            context: format!(
                "finishing start-up with rank {peer} (telling rank 0 the store is no longer needed)"
            ),
            source: e,
        };
        let connection = |peer: usize| {
            self.connections
                .data
                .get(peer)
                .and_then(Option::as_ref)
                .ok_or_else(|| {
                    failed(
                        peer,
                        io::Error::new(io::ErrorKind::NotConnected, "no connection"),
                    )
                })
        };
        if rank != 0 {
            write_all_by(connection(0)?, &[1], deadline).map_err(|e| failed(0, e))?;
        } else {
            for peer in 1..self.world_size {
                let mut byte = [0u8; 1];
                read_exact_by(connection(peer)?, &mut byte, deadline)
                    .map_err(|e| failed(peer, e))?;
            }
        }
        let store = KeptStore {
            _client: self.store,
            _server: self._server,
        };
        Ok((self.connections, store))
    }
}

/// A rank's two connections to every other rank, indexed by rank (`None` at its own).
#[derive(Debug)]
pub struct MeshConnections {
    /// The collectives' frames (under shared memory or NCCL: an idle liveness channel).
    pub data: Vec<Option<TcpStream>>,
    /// Control messages: abort notices and questions between blocked ranks, read at all
    /// times by the group's control thread.
    pub control: Vec<Option<TcpStream>>,
}

/// The rendezvous store after start-up: the client and, on rank 0, the server, kept
/// alive for the life of the group (tools may still read what the ranks published).
pub struct KeptStore {
    // Field order matters for drop: close the client before stopping the server.
    _client: StoreClient,
    _server: Option<StoreServer>,
}

impl fmt::Debug for KeptStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptStore")
            .field("hosted_here", &self._server.is_some())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mesh")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("job_id", &format_args!("{:016x}", self.job_id))
            .finish_non_exhaustive()
    }
}

/// Creates this rank's connections to every other rank of the group described by `config`.
///
/// Rank 0 starts the rendezvous store (on `config`'s store listener, or by binding the master
/// address). Every rank then connects to the store (retrying until the deadline, since
/// rank 0 may start last), listens on an ephemeral port on the interface it reaches the
/// store through, publishes that address, connects to every lower rank and accepts every
/// higher one.
pub fn connect_mesh(mut config: MeshConfig) -> Result<Mesh, SetupError> {
    config.validate()?;
    let MeshConfig {
        rank,
        world_size,
        timeout,
        dead_peer_timeout: dead_peer,
        ..
    } = config;
    let own_listener = config.store_listener.take();
    let master = config.master.as_str();
    let deadline = deadline_after(timeout);
    let server = if rank == 0 {
        let listener = match own_listener {
            Some(listener) => listener,
            None => StoreListener::bind(master)?,
        };
        Some(StoreServer::start_authenticated(
            listener,
            config.auth_token.clone(),
        )?)
    } else {
        None
    };
    let store_addrs = match &server {
        // Rank 0 talks to its own store at the address it really bound.
        Some(server) => vec![server.local_addr()],
        None => resolve(master).map_err(|e| SetupError::StoreUnreachable {
            rank,
            addr: master.to_string(),
            timeout,
            last_error: format!("cannot resolve: {e}"),
        })?,
    };
    let token = config.auth_token.clone();
    let mut store = StoreClient::connect_authenticated(&store_addrs, rank, timeout, token.clone())?;
    let job_id = if rank == 0 {
        let id = fresh_job_id();
        store.set(JOB_KEY, &id.to_le_bytes())?;
        id
    } else {
        let raw = store.wait(JOB_KEY, deadline, &|| "rank 0 to start the job".into())?;
        let bytes: [u8; 8] = raw
            .as_slice()
            .try_into()
            .map_err(|_| SetupError::Handshake {
                rank,
                peer: "rendezvous store".into(),
                reason: format!("job id has {} bytes, expected 8", raw.len()),
            })?;
        u64::from_le_bytes(bytes)
    };
    let me = PeerHello {
        job_id,
        world_size: world_size as u32,
        rank: rank as u32,
        authenticated: token.is_some(),
        channel: Channel::Data,
    };
    let io_error = |context: String, source: io::Error| SetupError::Io {
        rank,
        context,
        source,
    };

    // Listen on the interface this host reaches the store through: the one its peers
    // can most likely reach it on too.
    let local_ip = store
        .local_addr()
        .map_err(|e| io_error("local address of the store connection".into(), e))?
        .ip();
    let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
        .map_err(|e| io_error(format!("listening on {local_ip}"), e))?;
    let listen_addr = listener
        .local_addr()
        .map_err(|e| io_error("local address of the data listener".into(), e))?;
    store.set(&addr_key(rank), listen_addr.to_string().as_bytes())?;
    debug!(rank, %listen_addr, "listening for the higher ranks' connections");

    // Fetch every lower rank's address before connecting to any: once rank 0 has all
    // its connections, nobody needs its store any more.
    let mut lower_addrs = Vec::with_capacity(rank);
    for peer in 0..rank {
        let raw = store.wait(&addr_key(peer), deadline, &|| {
            format!("rank {peer} to publish its address (is rank {peer} running?)")
        })?;
        let addr: SocketAddr =
            String::from_utf8_lossy(&raw)
                .parse()
                .map_err(|_| SetupError::Handshake {
                    rank,
                    peer: format!("rank {peer}"),
                    reason: "published an unreadable address".into(),
                })?;
        lower_addrs.push(addr);
    }
    let mut data: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    let mut control: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    for (peer, addr) in lower_addrs.into_iter().enumerate() {
        for channel in [Channel::Data, Channel::Control] {
            let stream = connect_peer(rank, peer, addr, deadline, timeout)?;
            let hello = PeerHello { channel, ..me };
            let theirs = introduce(&stream, &hello, token.as_ref(), Role::Initiator, deadline)
                .map_err(|e| SetupError::Handshake {
                    rank,
                    peer: format!("rank {peer} at {addr}"),
                    reason: e,
                })?;
            // The acceptor answers before it has read which channel this is, so only
            // the initiator's hello names the channel.
            if theirs.rank as usize != peer {
                return Err(SetupError::Handshake {
                    rank,
                    peer: format!("rank {peer} at {addr}"),
                    reason: format!("it says it is rank {}", theirs.rank),
                });
            }
            match channel {
                Channel::Data => data[peer] = Some(stream),
                Channel::Control => control[peer] = Some(stream),
            }
        }
        debug!(rank, peer, %addr, "connected to a lower rank");
    }

    listener
        .set_nonblocking(true)
        .map_err(|e| io_error("non-blocking listener".into(), e))?;
    let missing = |data: &[Option<TcpStream>], control: &[Option<TcpStream>]| -> Vec<usize> {
        (rank + 1..world_size)
            .filter(|&p| data[p].is_none() || control[p].is_none())
            .collect()
    };
    while !missing(&data, &control).is_empty() {
        let (stream, from) = match listener.accept() {
            Ok(pair) => pair,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let ready = wait_any(&[Interest::readable(&listener)], deadline)
                    .map_err(|e| io_error("waiting for peer connections".into(), e))?;
                if !ready {
                    let missing: Vec<String> = missing(&data, &control)
                        .into_iter()
                        .map(|p| p.to_string())
                        .collect();
                    return Err(SetupError::RendezvousTimeout {
                        rank,
                        waiting_for: format!("connections from rank(s) {}", missing.join(", ")),
                        timeout,
                    });
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!(rank, error = %e, "accepting a peer connection failed; retrying");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let hello_deadline = deadline.min(Instant::now() + HELLO_LIMIT);
        let accepted = stream
            .set_nonblocking(false)
            .map_err(|e| e.to_string())
            .and_then(|()| introduce(&stream, &me, token.as_ref(), Role::Acceptor, hello_deadline))
            .and_then(|theirs| {
                let peer = theirs.rank as usize;
                let slot = match theirs.channel {
                    Channel::Data => &data,
                    Channel::Control => &control,
                };
                if peer <= rank || slot[peer].is_some() {
                    Err(format!(
                        "it says it is rank {peer} ({:?} channel), but only ranks above {rank} connect here and each once per channel",
                        theirs.channel
                    ))
                } else {
                    Ok((peer, theirs.channel))
                }
            });
        match accepted {
            Ok((peer, channel)) => {
                match channel {
                    Channel::Data => data[peer] = Some(stream),
                    Channel::Control => control[peer] = Some(stream),
                }
                debug!(rank, peer, ?channel, %from, "accepted a higher rank");
            }
            Err(reason) => {
                warn!(rank, %from, %reason, "rejected a connection to the data listener")
            }
        }
    }
    info!(rank, world_size, job_id, "TCP mesh connected");
    Ok(Mesh {
        rank,
        world_size,
        job_id,
        dead_peer_timeout: dead_peer,
        connections: MeshConnections { data, control },
        store,
        _server: server,
    })
}

fn connect_peer(
    rank: usize,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, SetupError> {
    let mut backoff = Duration::from_millis(2);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SetupError::RendezvousTimeout {
                rank,
                waiting_for: format!("a connection to rank {peer} at {addr}"),
                timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(stream) => return Ok(stream),
            Err(_) => {
                thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

/// Sends our hello and reads and checks theirs.
/// Then, with a token, runs the challenge–response as `role`.
fn introduce(
    stream: &TcpStream,
    me: &PeerHello,
    token: Option<&AuthToken>,
    role: Role,
    deadline: Instant,
) -> Result<PeerHello, String> {
    write_all_by(stream, &me.encode(), deadline).map_err(|e| format!("sending hello: {e}"))?;
    let mut raw = [0u8; PEER_HELLO_LEN];
    read_exact_by(stream, &mut raw, deadline).map_err(|e| format!("reading hello: {e}"))?;
    let theirs = PeerHello::decode_checked(&raw, me).map_err(|e| e.to_string())?;
    if let Some(token) = token {
        authenticate(stream, token, role, deadline)
            .map_err(|e| format!("authentication failed: {e}"))?;
    }
    Ok(theirs)
}
