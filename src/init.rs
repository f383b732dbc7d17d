//! Backend selection: [`init_process_group`] turns a backend name and [`InitOptions`]
//! into a connected [`ProcessGroup`].

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::{
    Backend, Deadline, GroupRunner, HostBackend, HostConfig, HostEngine, HostTransport,
};
use ringccl_observe::flight::MAIN_GROUP;
use ringccl_observe::timeline::TraceFile;
use ringccl_observe::Observers;
use ringccl_rendezvous::store::Store;
use ringccl_rendezvous::{connect_mesh, connect_mesh_through, Mesh, SetupError};
use ringccl_transports::{
    discover_hosts, shm, ControlLink, ShmTransport, TcpTransport, DEFAULT_RING_BYTES,
};

use crate::options::{InitOptions, TransportKind};
use crate::origin::GlooRecipe;
use crate::process_group::same_for_every_peer;
use crate::{Error, ProcessGroup};

/// The backend names [`init_process_group`] accepts (case-insensitive).
pub const BACKENDS: &[&str] = &["gloo", "nccl"];

/// Joins the process group described by `opts` using the backend named `backend`
/// (`"gloo"` or `"nccl"`, case-insensitive).
///
/// Every rank of the group must call this; it returns once this rank is connected to
/// every other rank, or fails within `opts`' deadline with an error that says whom it
/// was waiting for.
///
/// ```
/// // A group of one needs no peers: handy for a quick check.
/// let pg = ringccl::init_process_group("GLOO", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// let mut x = [1.5f32, -2.0];
/// pg.all_reduce(&mut x, ringccl::ReduceOp::Sum)?;
/// assert_eq!(x, [1.5, -2.0]);
///
/// let err = ringccl::init_process_group("mpi", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))
///     .unwrap_err();
/// assert!(err.to_string().contains("gloo, nccl"));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn init_process_group(backend: &str, opts: InitOptions) -> Result<ProcessGroup, Error> {
    crate::logging::init_if_asked();
    let any_thread = opts.any_thread;
    let pg = match backend.trim().to_ascii_lowercase().as_str() {
        "gloo" => start_gloo(opts, None),
        #[cfg(feature = "nccl")]
        "nccl" => start_nccl(opts),
        #[cfg(not(feature = "nccl"))]
        "nccl" => Err(Error::BackendUnavailable {
            backend: "nccl",
            reason: "this build of ringccl was compiled without its `nccl` cargo feature; \
                     rebuild with default features, or use \"gloo\""
                .into(),
        }),
        _ => Err(Error::UnknownBackend {
            name: backend.to_string(),
            valid: BACKENDS,
        }),
    }?;
    Ok(pg.issuing_from_any_thread(any_thread))
}

/// [`init_process_group`] through `store`, a key/value store every rank of the group
/// reaches and someone else hosts (the application's own, or torch's c10d store in the
/// Python package): no store of ringccl's, no second port; `opts.master` is ignored.
/// Each rank passes its own client of the same store, whose keys no other group uses.
/// Supports `"gloo"`.
///
/// ```
/// use std::time::Duration;
/// use ringccl::core::store::{StoreClient, StoreServer};
///
/// // Any `ringccl::Store`; here ringccl's own, hosted apart from the group.
/// let server = StoreServer::start(ringccl::StoreListener::bind("127.0.0.1:0")?)?;
/// let store = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(10))?;
/// let opts = ringccl::InitOptions::new(0, 1, "");
/// let pg = ringccl::init_process_group_with_store("gloo", Box::new(store), opts)?;
/// let mut x = [2.0f32];
/// pg.all_reduce(&mut x, ringccl::ReduceOp::Sum)?;
/// assert_eq!(x, [2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn init_process_group_with_store(
    backend: &str,
    store: Box<dyn Store>,
    mut opts: InitOptions,
) -> Result<ProcessGroup, Error> {
    crate::logging::init_if_asked();
    match backend.trim().to_ascii_lowercase().as_str() {
        "gloo" => {}
        "nccl" => {
            return Err(Error::BackendUnavailable {
                backend: "nccl",
                reason: "a group started through a store of the caller's runs \"gloo\" only; \
                         start \"nccl\" with init_process_group"
                    .into(),
            })
        }
        _ => {
            return Err(Error::UnknownBackend {
                name: backend.to_string(),
                valid: BACKENDS,
            })
        }
    }
    opts.master = store.describe();
    let any_thread = opts.any_thread;
    Ok(start_gloo(opts, Some(store))?.issuing_from_any_thread(any_thread))
}

/// The `"gloo"` backend: rendezvous (through `store` when the caller brings one, else
/// through ringccl's own on rank 0), then ringccl's host engine over shared memory or
/// TCP, as `opts` and the collective start-up decide.
fn start_gloo(mut opts: InitOptions, store: Option<Box<dyn Store>>) -> Result<ProcessGroup, Error> {
    opts.validate()?;
    let recipe = GlooRecipe {
        config: host_config(&opts)?,
        kind: opts.resolved_transport()?,
        mesh: opts.mesh_settings(None),
        trace: crate::trace::open_trace(&opts)?,
        flight: opts.flight_config("tcp")?,
        spin: opts.resolved_spin()?,
    };
    let deadline = Deadline::after(opts.timeout).at();
    let mesh = match store {
        Some(store) => connect_mesh_through(store, opts.mesh_config())?,
        None => connect_mesh(opts.mesh_config())?,
    };
    let group = opts.group_name.as_deref().unwrap_or(MAIN_GROUP);
    gloo_over_mesh(mesh, Arc::new(recipe), deadline, "collectives", group)
}

/// The host engine's settings from `opts`.
pub(crate) fn host_config(opts: &InitOptions) -> Result<HostConfig, Error> {
    let mut config = HostConfig {
        timeout: opts.timeout,
        all_reduce_algo: opts.resolved_all_reduce_algo()?,
        ..HostConfig::default()
    };
    if let Some(chunk) = opts.chunk_bytes {
        config.chunk_bytes = chunk;
    }
    if let Some(bytes) = opts.small_all_reduce_max_bytes {
        config.small_all_reduce_max_bytes = bytes;
    }
    if let Some(bytes) = opts.mid_all_reduce_max_bytes {
        config.mid_all_reduce_max_bytes = bytes;
    }
    if let Some(bytes) = opts.peer_memory_min_bytes {
        config.peer_memory_min_bytes = bytes;
    }
    Ok(config)
}

/// The rest of a `"gloo"` start-up once `mesh` is connected: shared memory where
/// `recipe` allows it, the connections handed to the transport, the flight recorder (its
/// files named after `group`), the control thread; all by `deadline`, the start-up's.
/// With a trace, the group's calls go on a new row of it called `row`.
pub(crate) fn gloo_over_mesh(
    mut mesh: Mesh,
    recipe: Arc<GlooRecipe>,
    deadline: Instant,
    row: &str,
    group: &str,
) -> Result<ProcessGroup, Error> {
    let (rank, world_size, job) = (mesh.rank(), mesh.world_size(), mesh.job_id());
    // Where every rank runs: from shared-memory set-up, or asked for on its own when
    // TCP is forced, so that a group spanning hosts still gets the hierarchical
    // collectives and waits count only the ranks on this machine.
    mesh.startup_step(match recipe.kind {
        TransportKind::Tcp => "finding which ranks share a host",
        _ => "setting up shared memory",
    });
    let (store, connections) = mesh.store_and_connections();
    let set_up = match recipe.kind {
        TransportKind::Tcp => discover_hosts(store, &*connections.data, rank, world_size, deadline)
            .map(|map| (None, Some(map))),
        // Watching the data connections: a peer that dies in set-up is named at once.
        required => shm::set_up(
            store,
            &*connections.data,
            rank,
            world_size,
            job,
            DEFAULT_RING_BYTES,
            deadline,
            required == TransportKind::SharedMemory,
        )
        .map(|rings| (rings, None)),
    };
    let (rings, host_map) = set_up.map_err(|e| mesh.give_up(e))?;
    let dead_peer = mesh.dead_peer_timeout();
    let (connections, store) = mesh.finish(deadline)?;
    let address = local_address(&connections.data);
    let tcp =
        TcpTransport::new(rank, connections.data, dead_peer).map_err(|source| SetupError::Io {
            rank,
            context: "configuring the connections to the other ranks".into(),
            source,
        })?;
    let control = connections.control;
    let config = recipe.config.clone();
    let observers = |transport| recipe.observers((rank, world_size), group, row, transport);
    let (backend, peers, observers): (Box<dyn Backend>, Vec<&'static str>, _) = match rings {
        Some(rings) => {
            let transport = ShmTransport::new(rings, tcp).with_spin(recipe.spin);
            let peers: Vec<&'static str> = (0..world_size)
                .map(|peer| transport.peer_transport(peer))
                .collect();
            let observers = observers(transport_label(&peers));
            let backend = host_backend(transport, config, observers.clone());
            (
                with_control_link(backend, control, dead_peer)?,
                peers,
                observers,
            )
        }
        None => {
            let peers = same_for_every_peer(rank, world_size, "tcp");
            let tcp = match &host_map {
                Some(map) => tcp.with_hosts(map),
                None => tcp,
            };
            let observers = observers("tcp");
            let backend = host_backend(tcp.with_spin(recipe.spin), config, observers.clone());
            (
                with_control_link(backend, control, dead_peer)?,
                peers,
                observers,
            )
        }
    };
    log_summary(rank, world_size, &recipe, &peers, &address);
    let hold = recipe.trace.as_ref().map(TraceFile::hold);
    Ok(ProcessGroup::observed(backend, &observers)
        .keeping_store(store, recipe)
        .holding_trace(hold)
        .reaching_peers_by(peers))
}

/// What a group whose ranks are reached by `peers` runs on, in one word: `"shm"`,
/// `"tcp"`, or `"shm+tcp"` when it is some of each.
fn transport_label(peers: &[&'static str]) -> &'static str {
    let uses = |kind: &'static str| peers.contains(&kind);
    match (uses("shm"), uses("tcp")) {
        (true, true) => "shm+tcp",
        (true, false) => "shm",
        _ => "tcp",
    }
}

/// The address this rank's connections to its peers leave from, for the log.
fn local_address(data: &[Option<TcpStream>]) -> String {
    data.iter()
        .flatten()
        .find_map(|c| c.local_addr().ok())
        .map_or_else(
            || "none (a group of one)".to_string(),
            |a| a.ip().to_string(),
        )
}

/// The `"gloo"` backend over `transport`, watched by `observers`.
pub(crate) fn host_backend<T: HostTransport>(
    transport: T,
    config: HostConfig,
    observers: Arc<Observers>,
) -> HostBackend<T> {
    let (rank, world_size, timeout) = (transport.rank(), transport.world_size(), config.timeout);
    let engine = HostEngine::new(transport, config);
    let mut backend = GroupRunner::with_engine("gloo", rank, world_size, timeout, engine);
    backend.attach_hooks(observers);
    backend
}

/// `RINGCCL_DEBUG=info`: what this rank's group runs on, in one line, with how it
/// reaches each rank (`peers`, by rank).
fn log_summary(
    rank: usize,
    world_size: usize,
    recipe: &GlooRecipe,
    peers: &[&'static str],
    address: &str,
) {
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    let transport = transport_label(peers);
    let config = &recipe.config;
    tracing::info!(
        rank,
        world_size,
        backend = "gloo",
        transport,
        peers = %peers.join(","),
        address = %address,
        all_reduce = ?config.all_reduce_algo,
        recursive_doubling_up_to = config.small_all_reduce_max_bytes,
        halving_doubling_up_to = config.mid_all_reduce_max_bytes,
        tree_broadcast_up_to = config.tree_broadcast_max_bytes,
        chunk_bytes = config.chunk_bytes,
        timeout = ?config.timeout,
        auth = recipe.mesh.auth_token.is_some(),
        "process group ready"
    );
}

/// Starts the group's control thread over the mesh's control connections, so an abort
/// here reaches every peer and a peer's reaches this rank.
fn with_control_link<T: HostTransport + 'static>(
    mut backend: HostBackend<T>,
    connections: Vec<Option<TcpStream>>,
    dead_peer: Duration,
) -> Result<Box<dyn Backend>, Error> {
    let rank = backend.rank();
    let link = ControlLink::start(rank, connections, dead_peer, Arc::clone(backend.control()))
        .map_err(|source| SetupError::Io {
            rank,
            context: "starting the control thread".into(),
            source,
        })?;
    backend.keep_control_link(Box::new(link));
    Ok(Box::new(backend))
}

/// The `"nccl"` backend: NCCL's communicator on this rank's GPU, joined through the same
/// rendezvous.
#[cfg(feature = "nccl")]
fn start_nccl(mut opts: InitOptions) -> Result<ProcessGroup, Error> {
    opts.validate()?;
    let trace = crate::trace::open_trace(&opts)?;
    let mesh = opts.mesh_config();
    let observers = crate::observers::observers(
        (mesh.rank, mesh.world_size),
        "nccl",
        opts.flight_config("nccl")?,
        trace.as_ref().map(|file| (file, "collectives")),
    );
    let mut config = ringccl_nccl::NcclConfig::new(mesh);
    config.device = opts.device;
    config.local_rank = opts.local_rank;
    config.hooks = observers.clone();
    let hold = trace.as_ref().map(TraceFile::hold);
    let nccl = Arc::new(ringccl_nccl::NcclBackend::connect(config)?);
    Ok(ProcessGroup::from_nccl(nccl, &observers).holding_trace(hold))
}
