//! Start-up: rank 0 hosts the store, every rank publishes its listening address, and the
//! ranks connect into a full mesh, each connection opened with a checked handshake. The
//! result is a [`Mesh`], whose [`Mesh::finish`] ends start-up.
//!
//! Start-up is abandoned for everyone, through the store ([`Store::abort`]), when a
//! rank is claimed twice or a rank runs out of file descriptors; every rank asks the
//! store at least every [`ABORT_CHECK`] while it waits, so all learn why within moments.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::{MeshConfig, SetupError};
use tracing::{debug, info, warn};

use crate::auth::{authenticate, AuthToken, Role};
use crate::deadline_io::{deadline_after, read_exact_by, read_some_by, write_all_by};
use crate::fd_limit;
use crate::hello::{Channel, PeerHello, PEER_HELLO_LEN};
use crate::job::{
    addr_key, rank_key, this_process, JobRecord, JOB_KEY, JOB_RECORD_LEN, RANK_KEY_PREFIX,
};
use crate::peer_acceptor::PeerAcceptor;
use crate::startup_watch::{Started, StartupWatch, Waiting};
use crate::store::{resolve, Store, StoreClient, StoreListener, StoreServer};

/// How often a waiting rank asks the store whether start-up was abandoned.
const ABORT_CHECK: Duration = Duration::from_millis(200);
/// Longest single connection attempt to a peer; a rank retries until its deadline.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);

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
    /// Says whom start-up waits for, while it does.
    watch: StartupWatch,
    // Field order matters for drop: close the client before stopping the server.
    store: Box<dyn Store>,
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

    /// Tells the start-up reports which step after the mesh this rank is in (`"setting up
    /// shared memory"`), so that a rank still waiting there says so.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{connect_mesh, MeshConfig, StoreListener};
    /// # let listener = StoreListener::bind("127.0.0.1:0")?;
    /// # let mut config = MeshConfig::new(0, 1, &listener.local_addr()?.to_string(), Duration::from_secs(10));
    /// # config.store_listener = Some(listener);
    /// let mesh = connect_mesh(config)?;
    /// mesh.startup_step("creating the NCCL communicator");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn startup_step(&self, step: &'static str) {
        self.watch.waiting(Waiting::SetUp { step });
    }

    /// The rendezvous store, for start-up steps that follow the mesh.
    pub fn store(&mut self) -> &mut dyn Store {
        &mut *self.store
    }

    /// The store and the connections, for start-up steps that wait on the store while
    /// watching the peers (`ringccl_transports::WatchedStore`): a peer that dies closes
    /// its connections.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ringccl_rendezvous::{connect_mesh, MeshConfig, StoreListener};
    /// # let listener = StoreListener::bind("127.0.0.1:0")?;
    /// # let mut config = MeshConfig::new(0, 1, &listener.local_addr()?.to_string(), Duration::from_secs(10));
    /// # config.store_listener = Some(listener);
    /// let mut mesh = connect_mesh(config)?;
    /// let (store, connections) = mesh.store_and_connections();
    /// store.set("greeting", b"hello")?;
    /// assert!(connections.data[0].is_none()); // none to itself
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store_and_connections(&mut self) -> (&mut dyn Store, &MeshConnections) {
        (&mut *self.store, &self.connections)
    }

    /// What a start-up step after the connections (shared-memory set-up, finding the
    /// hosts) that failed with `error` reports: the reason published in the store when
    /// start-up was abandoned meanwhile (a peer that gave up closes its connections right
    /// after saying why, so the closed connection is usually seen first). On rank 0, which
    /// hosts the store, it then keeps the store up until every rank has heard why.
    pub fn give_up(&mut self, error: SetupError) -> SetupError {
        let error = abandoned_instead(&mut *self.store, error);
        if let Some(server) = &self._server {
            linger_until_heard(server, &error);
        }
        error
    }

    /// Ends start-up on every rank: ranks above 0 tell rank 0 they are done with the
    /// store (one byte on their connection), and rank 0 returns only once all have, so
    /// the store it hosts outlives every start-up reader. Returns the connections, still
    /// blocking, `None` at this rank's own index, and the store, which the group keeps
    /// for its lifetime.
    pub fn finish(mut self, deadline: Instant) -> Result<(MeshConnections, KeptStore), SetupError> {
        let rank = self.rank;
        self.startup_step("waiting for every rank to finish start-up");
        let failed = |peer: usize, e: io::Error| {
            let gone = matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            );
            let context = if gone {
                format!(
                    "finishing start-up: rank {peer} went away (its connection closed); look at \
                     rank {peer}'s own output and exit status, then restart every rank"
                )
            } else {
                format!(
                    "finishing start-up with rank {peer} (telling rank 0 the store is no longer needed)"
                )
            };
            SetupError::Io {
                rank,
                context,
                source: e,
            }
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
        let done = if rank != 0 {
            connection(0).and_then(|c| write_all_by(c, &[1], deadline).map_err(|e| failed(0, e)))
        } else {
            (1..self.world_size).try_for_each(|peer| {
                let mut byte = [0u8; 1];
                read_exact_by(connection(peer)?, &mut byte, deadline).map_err(|e| failed(peer, e))
            })
        };
        if let Err(e) = done {
            let e = abandoned_instead(&mut *self.store, e);
            if let Some(server) = &self._server {
                linger_until_heard(server, &e);
            }
            return Err(e);
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

impl MeshConnections {
    /// No connection yet to any of `world_size` ranks.
    fn unconnected(world_size: usize) -> MeshConnections {
        MeshConnections {
            data: (0..world_size).map(|_| None).collect(),
            control: (0..world_size).map(|_| None).collect(),
        }
    }
}

/// The rendezvous store after start-up: the client and, on rank 0, the server, kept
/// alive for the life of the group (tools may still read what the ranks published).
pub struct KeptStore {
    // Field order matters for drop: close the client before stopping the server.
    _client: Box<dyn Store>,
    _server: Option<StoreServer>,
}

impl KeptStore {
    /// On rank 0, which hosts the store: from now on, calls `notify` with the
    /// [`SetupError::DuplicateRank`] of any process that claims one of this group's ranks
    /// (after start-up, that claim is refused, and the claimant fails alone unless the
    /// running group is stopped too). Returns whether the store is hosted here, and so
    /// watched; on other ranks it does nothing.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use std::thread;
    /// use std::time::{Duration, Instant};
    /// use ringccl_rendezvous::{connect_mesh, MeshConfig, SetupError, StoreListener};
    ///
    /// let listener = StoreListener::bind("127.0.0.1:0")?;
    /// let master = listener.local_addr()?.to_string();
    /// let timeout = Duration::from_secs(10);
    /// let deadline = Instant::now() + timeout;
    /// let rank1 = MeshConfig::new(1, 2, &master, timeout);
    /// let rank1 = thread::spawn(move || connect_mesh(rank1)?.finish(deadline));
    /// let mut config = MeshConfig::new(0, 2, &master, timeout);
    /// config.store_listener = Some(listener);
    /// let (_, store) = connect_mesh(config)?.finish(deadline)?;
    /// let _rank1 = rank1.join().unwrap()?;
    /// let (tx, rx) = mpsc::channel();
    /// assert!(store.on_duplicate_rank(move |e| { let _ = tx.send(e); }));
    /// // A second process started as rank 1 is refused, and rank 0 hears of it.
    /// let err = connect_mesh(MeshConfig::new(1, 2, &master, timeout)).unwrap_err();
    /// assert!(matches!(err, SetupError::DuplicateRank { rank: 1, .. }));
    /// let told = rx.recv_timeout(timeout)?;
    /// assert!(matches!(told, SetupError::DuplicateRank { rank: 1, .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_duplicate_rank(&self, notify: impl Fn(SetupError) + Send + Sync + 'static) -> bool {
        let Some(server) = &self._server else {
            return false;
        };
        server.on_refused_claim(RANK_KEY_PREFIX, move |claim| {
            // Only this layer writes these keys, always as `<prefix><rank>`.
            let rank = claim
                .key
                .strip_prefix(RANK_KEY_PREFIX)
                .map(str::parse::<usize>);
            let Some(Ok(rank)) = rank else {
                return;
            };
            notify(SetupError::DuplicateRank {
                rank,
                first: claim.holder,
                second: claim.claimant,
            });
        });
        true
    }

    /// Connects rank `config.rank` of a new group of `config.world_size` ranks, formed
    /// from ranks of this one, through this same store: every key the new group writes
    /// lives under `namespace`, which every member must pass alike and no other group may
    /// use. The new group gets its own job id, so its connections can never be taken for
    /// this group's. `config.master` only names the store in messages.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use ringccl_rendezvous::{connect_mesh, MeshConfig, StoreListener};
    ///
    /// let listener = StoreListener::bind("127.0.0.1:0")?;
    /// let master = listener.local_addr()?.to_string();
    /// let mut config = MeshConfig::new(0, 1, &master, Duration::from_secs(10));
    /// config.store_listener = Some(listener);
    /// let deadline = Instant::now() + Duration::from_secs(10);
    /// let (_, store) = connect_mesh(config)?.finish(deadline)?;
    /// let sub = MeshConfig::new(0, 1, &master, Duration::from_secs(10));
    /// let (connections, _sub_store) = store.connect_sub_mesh("group/1/", sub)?.finish(deadline)?;
    /// assert!(connections.control[0].is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_sub_mesh(
        &self,
        namespace: &str,
        config: MeshConfig,
    ) -> Result<Mesh, SetupError> {
        connect_mesh_through(self._client.scoped(namespace, config.rank)?, config)
    }
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

/// Connects rank `config.rank` of a group of `config.world_size` through `store`, a store
/// every rank reaches that someone else hosts (torch's c10d store, say): the same
/// start-up as [`connect_mesh`], with no store of ringccl's own. `config.master` only
/// names the store in messages; every rank must use its own client of the same store,
/// and no other group the same keys.
///
/// ```
/// use std::time::{Duration, Instant};
/// use ringccl_rendezvous::store::{StoreClient, StoreServer};
/// use ringccl_rendezvous::{connect_mesh_through, MeshConfig, StoreListener};
///
/// // Any `Store` will do; here ringccl's own, hosted apart from the group.
/// let server = StoreServer::start(StoreListener::bind("127.0.0.1:0")?)?;
/// let timeout = Duration::from_secs(10);
/// let store = StoreClient::connect(&[server.local_addr()], 0, timeout)?;
/// let config = MeshConfig::new(0, 1, "a store of the caller's", timeout);
/// let mesh = connect_mesh_through(Box::new(store), config)?;
/// let (connections, _store) = mesh.finish(Instant::now() + timeout)?;
/// assert!(connections.data[0].is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn connect_mesh_through(
    mut store: Box<dyn Store>,
    config: MeshConfig,
) -> Result<Mesh, SetupError> {
    config.validate()?;
    if config.store_listener.is_some() {
        return Err(SetupError::InvalidArgument(
            "a group formed through an existing store cannot host a store of its own".into(),
        ));
    }
    crate::interface::check_host(config.rank, config.socket_ifname.as_deref())?;
    let deadline = deadline_after(config.timeout);
    let watch = StartupWatch::start(
        config.rank,
        config.world_size,
        &config.master,
        Instant::now(),
        config.startup_report,
        None,
    );
    let mut connections = MeshConnections::unconnected(config.world_size);
    let mut acceptor = None;
    let job_id = join_or_tell(
        &config,
        &mut *store,
        &mut connections,
        &mut acceptor,
        &watch,
        deadline,
    )?;
    Ok(Mesh {
        rank: config.rank,
        world_size: config.world_size,
        job_id,
        dead_peer_timeout: config.dead_peer_timeout,
        connections,
        watch,
        store,
        _server: None,
    })
}

/// Creates this rank's connections to every other rank of the group described by `config`.
///
/// Rank 0 starts the rendezvous store (on `config`'s store listener, or by binding the master
/// address). Every rank then connects to the store (retrying until the deadline, since
/// rank 0 may start last), checks that the store serves its attempt of the job, claims its
/// rank (a rank claimed twice fails both claimants), listens on an ephemeral port on the
/// interface it reaches the store through (or the one [`MeshConfig::socket_ifname`]
/// names: a setting that matches none of this host's interfaces fails at once, before
/// the store), publishes that address, connects to every lower rank and accepts every
/// higher one.
///
/// ```
/// use std::time::{Duration, Instant};
/// use ringccl_rendezvous::{connect_mesh, MeshConfig, StoreListener};
///
/// let listener = StoreListener::bind("127.0.0.1:0")?;
/// let mut config = MeshConfig::new(0, 1, &listener.local_addr()?.to_string(), Duration::from_secs(10));
/// config.store_listener = Some(listener);
/// let mesh = connect_mesh(config)?;
/// let (connections, _store) = mesh.finish(Instant::now() + Duration::from_secs(10))?;
/// assert!(connections.data[0].is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn connect_mesh(mut config: MeshConfig) -> Result<Mesh, SetupError> {
    config.validate()?;
    // A `socket_ifname` this host cannot satisfy fails here, before any waiting.
    crate::interface::check_host(config.rank, config.socket_ifname.as_deref())?;
    let rank = config.rank;
    let timeout = config.timeout;
    let own_listener = config.store_listener.take();
    let master = config.master.as_str();
    let deadline = deadline_after(timeout);
    let started = Instant::now();
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
    let claimed = server.as_ref().map(|server| {
        let keys = server.key_view();
        Box::new(move |r: usize| keys.has(&rank_key(r))) as Started
    });
    let watch = StartupWatch::start(
        rank,
        config.world_size,
        master,
        started,
        config.startup_report,
        claimed,
    );
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
    let connected = StoreClient::connect_reporting(
        &store_addrs,
        rank,
        timeout,
        config.auth_token.clone(),
        &|error| {
            watch.waiting(Waiting::Store {
                last_error: Some(error.to_string()),
            })
        },
    );
    let own_store_failure =
        |e: SetupError| match server.as_ref().and_then(StoreServer::descriptors_exhausted) {
            // Rank 0's own store ran out of descriptors: that is the cause, whatever the symptom.
            Some(detail) => SetupError::DescriptorsExhausted {
                rank,
                during: "accepting connections to the rendezvous store it hosts".into(),
                detail,
            },
            None => e,
        };
    let mut store: Box<dyn Store> = Box::new(connected.map_err(own_store_failure)?);
    // Owned here, so that on failure they are closed only after the others were told why.
    let mut connections = MeshConnections::unconnected(config.world_size);
    let mut acceptor = None;
    match join_or_tell(
        &config,
        &mut *store,
        &mut connections,
        &mut acceptor,
        &watch,
        deadline,
    ) {
        Ok(job_id) => Ok(Mesh {
            rank,
            world_size: config.world_size,
            job_id,
            dead_peer_timeout: config.dead_peer_timeout,
            connections,
            watch,
            store,
            _server: server,
        }),
        Err(e) => {
            let e = own_store_failure(e);
            if let Some(server) = &server {
                linger_until_heard(server, &e);
            }
            Err(e)
        }
    }
}

/// How long rank 0 keeps an aborted store up for the ranks still to hear why.
const ABORT_LINGER: Duration = Duration::from_secs(3);

/// On rank 0, when start-up was abandoned for everyone, keeps the store up until every
/// connected rank has heard why (at most [`ABORT_LINGER`]): taking it away at once would
/// leave them "connection closed" instead of the reason.
fn linger_until_heard(server: &StoreServer, error: &SetupError) {
    let abandoned = matches!(
        error,
        SetupError::RendezvousAborted { .. }
            | SetupError::DuplicateRank { .. }
            | SetupError::DescriptorsExhausted { .. }
    );
    if abandoned && !server.await_abort_heard(Instant::now() + ABORT_LINGER) {
        debug!("some ranks had not heard why start-up was abandoned when rank 0 gave up");
    }
}

/// [`join`], and what its failure means for the others: a rank out of descriptors tells
/// them through the store (they would otherwise wait for it until their deadline; the
/// abort needs no new descriptor), this rank's own refusals stand, and any other error
/// gives way to a reason published meanwhile. The connections and the listener stay
/// with the caller, so that they close only after the others were told why.
fn join_or_tell(
    config: &MeshConfig,
    store: &mut dyn Store,
    connections: &mut MeshConnections,
    acceptor: &mut Option<PeerAcceptor>,
    watch: &StartupWatch,
    deadline: Instant,
) -> Result<u64, SetupError> {
    join(config, store, connections, acceptor, watch, deadline).map_err(|e| match e {
        SetupError::DescriptorsExhausted { .. } | SetupError::WorldSizeMismatch { .. } => {
            let _ = store.abort(&e.to_string());
            e
        }
        // A handshake that fails on a peer's answer (another world size or job) is this
        // job's problem too: the others hear of it now rather than at their deadline.
        SetupError::Handshake { .. } => {
            let e = abandoned_instead(store, e);
            if !matches!(e, SetupError::RendezvousAborted { .. }) {
                let _ = store.abort(&e.to_string());
            }
            e
        }
        own @ (SetupError::DuplicateRank { .. }
        | SetupError::RendezvousAborted { .. }
        | SetupError::AttemptMismatch { .. }) => own,
        other => abandoned_instead(store, other),
    })
}

/// `error`, unless start-up was abandoned meanwhile: then the reason published in the
/// store, which is the cause (a rank that gave up closes its connections right after
/// publishing why, so its peers usually see the closed connection first).
fn abandoned_instead(store: &mut dyn Store, error: SetupError) -> SetupError {
    match store.check() {
        Err(aborted @ SetupError::RendezvousAborted { .. }) => aborted,
        _ => error,
    }
}

/// Everything after the store connection: the job record, the rank's claim, its address,
/// the connections to lower ranks and from higher ones. The connections and the data
/// listener live in the caller's `connections` and `acceptor`, so that on failure they
/// stay open until the others have been told why.
fn join(
    config: &MeshConfig,
    store: &mut dyn Store,
    connections: &mut MeshConnections,
    acceptor: &mut Option<PeerAcceptor>,
    watch: &StartupWatch,
    deadline: Instant,
) -> Result<u64, SetupError> {
    let MeshConfig {
        rank,
        world_size,
        timeout,
        attempt,
        ..
    } = *config;
    let token = config.auth_token.as_ref();
    let missing = |data: &[Option<TcpStream>], control: &[Option<TcpStream>]| -> Vec<usize> {
        (rank + 1..world_size)
            .filter(|&p| data[p].is_none() || control[p].is_none())
            .collect()
    };
    watch.waiting(match rank {
        0 => Waiting::Joins {
            missing: (1..world_size).collect(),
        },
        _ => Waiting::JobRecord,
    });
    let job = job_record(config, store, deadline)?;
    claim_rank(rank, store)?;
    let me = PeerHello {
        job_id: job.job_id,
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

    // Listen on the interface this host reaches the store through (the one its peers
    // can most likely reach it on too), or on the one `socket_ifname` names.
    let store_ip = match store.local_ip() {
        Some(ip) => ip,
        None => {
            if config.socket_ifname.is_none() {
                warn!(
                    rank,
                    store = %store.describe(),
                    "the store is not reached over IP: listening for peers on the loopback \
                     interface; set RINGCCL_SOCKET_IFNAME when the ranks span hosts"
                );
            }
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        }
    };
    let local_ip = crate::interface::listen_ip(rank, config.socket_ifname.as_deref(), store_ip)?;
    let listener = TcpListener::bind(SocketAddr::new(local_ip, 0)).map_err(|e| {
        fd_limit::or_else(
            rank,
            || "opening the data listener".into(),
            e,
            |e| io_error(format!("listening on {local_ip}"), e),
        )
    })?;
    let listen_addr = listener
        .local_addr()
        .map_err(|e| io_error("local address of the data listener".into(), e))?;
    let acceptor = acceptor.insert(PeerAcceptor::new(
        listener,
        me,
        config.auth_token.clone(),
        deadline,
    )?);
    if let Some(first) = store.set_if_absent(&addr_key(rank), listen_addr.to_string().as_bytes())? {
        return Err(duplicate(
            store,
            rank,
            format!(
                "the process listening on {}",
                String::from_utf8_lossy(&first)
            ),
        ));
    }
    debug!(rank, %listen_addr, attempt, "listening for the higher ranks' connections");

    // Fetch every lower rank's address before connecting to any: once rank 0 has all
    // its connections, nobody needs its store any more.
    let mut lower_addrs = Vec::with_capacity(rank);
    for peer in 0..rank {
        watch.waiting(Waiting::Address { peer });
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
    let MeshConnections { data, control } = connections;
    for (peer, addr) in lower_addrs.into_iter().enumerate() {
        watch.waiting(Waiting::Accept { peer });
        for channel in [Channel::Data, Channel::Control] {
            let hello = PeerHello { channel, ..me };
            let stream = connect_lower(&hello, peer, addr, token, deadline, timeout, store)?;
            match channel {
                Channel::Data => data[peer] = Some(stream),
                Channel::Control => control[peer] = Some(stream),
            }
        }
        debug!(rank, peer, %addr, "connected to a lower rank");
    }

    watch.waiting(Waiting::Joins {
        missing: missing(data, control),
    });
    let mut next_check = Instant::now() + ABORT_CHECK;
    while !missing(data, control).is_empty() {
        if Instant::now() >= next_check {
            store.check()?;
            next_check = Instant::now() + ABORT_CHECK;
        }
        if Instant::now() >= deadline {
            let missing: Vec<String> = missing(data, control)
                .into_iter()
                .map(|p| p.to_string())
                .collect();
            return Err(SetupError::RendezvousTimeout {
                rank,
                waiting_for: format!("connections from rank(s) {}", missing.join(", ")),
                timeout,
            });
        }
        if let Some(accepted) = acceptor.next(deadline.min(next_check))? {
            match accepted.channel {
                Channel::Data => data[accepted.peer] = Some(accepted.stream),
                Channel::Control => control[accepted.peer] = Some(accepted.stream),
            }
            watch.waiting(Waiting::Joins {
                missing: missing(data, control),
            });
        }
    }
    info!(
        rank,
        world_size,
        job_id = job.job_id,
        attempt,
        "every rank joined (connected over TCP; the data transport is chosen next)"
    );
    Ok(job.job_id)
}

/// Rank 0 writes the job's record (once); every other rank reads it and checks that the
/// store serves its own attempt of the job.
fn job_record(
    config: &MeshConfig,
    store: &mut dyn Store,
    deadline: Instant,
) -> Result<JobRecord, SetupError> {
    let rank = config.rank;
    let store_name = || config.master.clone();
    if rank == 0 {
        let job = JobRecord::fresh(config.attempt, config.world_size);
        return match store.set_if_absent(JOB_KEY, &job.encode())? {
            None => Ok(job),
            Some(_) => Err(SetupError::Handshake {
                rank,
                peer: format!("rendezvous store at {}", store_name()),
                reason: "the job's record was already written before rank 0 wrote it: another process writes to this rank's own store".into(),
            }),
        };
    }
    let raw = store.wait(JOB_KEY, deadline, &|| "rank 0 to start the job".into())?;
    let job = JobRecord::decode(&raw).ok_or_else(|| SetupError::Handshake {
        rank,
        peer: format!("rendezvous store at {}", store_name()),
        reason: format!(
            "the job's record has {} bytes, expected {JOB_RECORD_LEN}",
            raw.len()
        ),
    })?;
    if job.attempt != config.attempt {
        return Err(SetupError::AttemptMismatch {
            rank,
            ours: config.attempt,
            theirs: job.attempt,
            addr: store_name(),
        });
    }
    if job.world_size as usize != config.world_size {
        return Err(SetupError::WorldSizeMismatch {
            rank,
            ours: config.world_size,
            theirs: job.world_size as usize,
            addr: store_name(),
        });
    }
    Ok(job)
}

/// Claims `rank` in the store under this process's name. The second claimant abandons
/// start-up for everyone, naming both.
fn claim_rank(rank: usize, store: &mut dyn Store) -> Result<(), SetupError> {
    let me = this_process();
    match store.set_if_absent(&rank_key(rank), me.as_bytes())? {
        None => Ok(()),
        Some(first) => Err(duplicate(
            store,
            rank,
            String::from_utf8_lossy(&first).into_owned(),
        )),
    }
}

/// The error of the second process to claim `rank` (after `first`), once it has told
/// everyone through the store.
fn duplicate(store: &mut dyn Store, rank: usize, first: String) -> SetupError {
    let error = SetupError::DuplicateRank {
        rank,
        first,
        second: this_process(),
    };
    warn!(%error, "abandoning start-up");
    let _ = store.abort(&error.to_string());
    error
}

/// Connects to the lower rank `peer` at `addr` and introduces this rank on the channel
/// `me` names. A connection closed before the peer answered (cut off among strangers, or
/// refused) is tried again until the deadline; a peer that answers with a mismatch is
/// final.
fn connect_lower(
    me: &PeerHello,
    peer: usize,
    addr: SocketAddr,
    token: Option<&AuthToken>,
    deadline: Instant,
    timeout: Duration,
    store: &mut dyn Store,
) -> Result<TcpStream, SetupError> {
    let rank = me.rank as usize;
    let channel = me.channel;
    let handshake = |reason: String| SetupError::Handshake {
        rank,
        peer: format!("rank {peer} at {addr}"),
        reason,
    };
    let mut backoff = Duration::from_millis(2);
    let mut last_error = String::from("no attempt made");
    let mut next_check = Instant::now() + ABORT_CHECK;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SetupError::RendezvousTimeout {
                rank,
                waiting_for: format!(
                    "rank {peer} at {addr} to accept this rank's {channel:?} connection (last attempt: {last_error})"
                ),
                timeout,
            });
        }
        if Instant::now() >= next_check {
            store.check()?;
            next_check = Instant::now() + ABORT_CHECK;
        }
        let stream = match TcpStream::connect_timeout(&addr, left.min(CONNECT_ATTEMPT)) {
            Ok(stream) => stream,
            Err(e) if fd_limit::is_exhaustion(&e) => {
                return Err(fd_limit::exhausted(
                    rank,
                    format!("connecting to rank {peer} at {addr}"),
                    &e,
                ));
            }
            Err(e) => {
                last_error = e.to_string();
                thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
                continue;
            }
        };
        let mut raw = [0u8; PEER_HELLO_LEN];
        let exchanged = match write_all_by(&stream, &me.encode(), deadline) {
            Ok(()) => read_answer(&stream, &mut raw, deadline, store)?,
            Err(e) => Err(e),
        };
        match exchanged {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(SetupError::RendezvousTimeout {
                    rank,
                    waiting_for: format!("rank {peer} at {addr} to answer this rank's hello"),
                    timeout,
                });
            }
            Err(e) => {
                last_error = format!("the connection closed before rank {peer} answered ({e})");
                thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
                continue;
            }
        }
        let theirs = PeerHello::decode_checked(&raw, me).map_err(|e| handshake(e.to_string()))?;
        if theirs.rank as usize != peer || theirs.channel != channel {
            return Err(handshake(format!(
                "it says it is rank {} on the {:?} channel, expected rank {peer} on the {channel:?} channel",
                theirs.rank, theirs.channel
            )));
        }
        if let Some(token) = token {
            authenticate(&stream, token, Role::Initiator, deadline)
                .map_err(|e| handshake(format!("authentication failed: {e}")))?;
        }
        return Ok(stream);
    }
}

/// Reads a lower rank's answer to this rank's hello by `deadline`, asking the store every
/// [`ABORT_CHECK`] meanwhile whether start-up was abandoned (a rank that ran out of
/// descriptors never accepts, and says so only through the store). The outer error is
/// the abandonment; the inner one the connection's.
fn read_answer(
    stream: &TcpStream,
    raw: &mut [u8],
    deadline: Instant,
    store: &mut dyn Store,
) -> Result<io::Result<()>, SetupError> {
    let mut done = 0;
    while done < raw.len() {
        let slice_end = deadline.min(Instant::now() + ABORT_CHECK);
        match read_some_by(stream, &mut raw[done..], slice_end) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                if Instant::now() >= deadline {
                    return Ok(Err(e));
                }
                store.check()?;
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(()))
}
