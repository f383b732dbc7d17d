//! Groups whose ranks live in one process, one per thread. Under `"gloo"`: no
//! rendezvous, no sockets, no `/dev/shm` files. The ranks are connected by the shared-memory transport's rings
//! in anonymous memory ([`InProcessTransport`]), each with its own control thread, so
//! they keep every guarantee of a group of processes: deadlines, abort of the whole
//! group, mismatch detection, bit-identical results.

use std::sync::Arc;

use ringccl_collectives::control::{GroupControl, MemoryControlLink};
use ringccl_rendezvous::SetupError;
use ringccl_transports::{InProcessTransport, DEFAULT_RING_BYTES};

use crate::init::{host_backend, host_config};
use crate::observers::observers;
use crate::process_group::same_for_every_peer;
use crate::{Error, InitOptions, ProcessGroup, BACKENDS};

/// What [`ProcessGroup::peer_transport`] says of a rank of the same local group.
const LOCAL: &str = "memory";

/// `n` ranks of one group, living in this process: give each to its own thread. Every
/// rank has the whole [`ProcessGroup`] API, with the default settings (see
/// [`local_groups_with`] for others).
///
/// Under `"gloo"` the ranks are connected in memory, by the rings of the shared-memory
/// transport (one of 1 MiB per ordered pair of ranks, so n² MiB in all, touched as
/// used).
///
/// Under `"nccl"` rank `r` drives GPU `r`: it needs `n` visible GPUs. The `n` NCCL
/// communicators are created together, one per thread through one unique id (what
/// `ncclCommInitAll` does), over a store on a loopback port of this process, which also
/// carries the ranks' liveness and control connections. Each rank's collectives may run
/// on any thread: the engine binds its GPU's context on every call.
///
/// ```
/// use std::thread;
/// use ringccl::ReduceOp;
///
/// let ranks = ringccl::local_groups("gloo", 3)?;
/// let sums: Vec<f32> = thread::scope(|s| {
///     let handles: Vec<_> = ranks
///         .iter()
///         .map(|pg| {
///             s.spawn(move || {
///                 let mut x = [pg.rank() as f32 + 1.0];
///                 pg.all_reduce(&mut x, ReduceOp::Sum).map(|()| x[0])
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()
/// })?;
/// assert_eq!(sums, vec![6.0; 3]);
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn local_groups(backend: &str, n: usize) -> Result<Vec<ProcessGroup>, Error> {
    local_groups_with(backend, n, InitOptions::new(0, n.max(1), "127.0.0.1:0"))
}

/// [`local_groups`] with the settings of `opts` that apply to ranks in one process: the
/// deadline, the algorithms and chunk size, the spin window, the flight recorder. Its rank, world size
/// and addresses are ignored.
///
/// ```
/// use std::time::Duration;
///
/// let opts = ringccl::InitOptions::new(0, 2, "127.0.0.1:0").timeout(Duration::from_secs(5));
/// let ranks = ringccl::local_groups_with("gloo", 2, opts)?;
/// assert_eq!(ranks[1].peer_transport(0), "memory");
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn local_groups_with(
    backend: &str,
    n: usize,
    opts: InitOptions,
) -> Result<Vec<ProcessGroup>, Error> {
    crate::logging::init_if_asked();
    if n == 0 {
        return Err(Error::InvalidArgument(
            "local_groups needs at least one rank (n = 0)".into(),
        ));
    }
    match backend.trim().to_ascii_lowercase().as_str() {
        "gloo" => local_gloo(n, &opts),
        #[cfg(feature = "nccl")]
        "nccl" => local_nccl(n, &opts),
        #[cfg(not(feature = "nccl"))]
        "nccl" => Err(Error::BackendUnavailable {
            backend: "nccl",
            reason: "this build of ringccl was compiled without its `nccl` cargo feature; \
                     rebuild with `--features nccl`, or use \"gloo\""
                .into(),
        }),
        _ => Err(Error::UnknownBackend {
            name: backend.to_string(),
            valid: BACKENDS,
        }),
    }
}

fn local_gloo(n: usize, opts: &InitOptions) -> Result<Vec<ProcessGroup>, Error> {
    let config = host_config(opts)?;
    let flight = opts.flight_config(LOCAL)?;
    let spin = opts.resolved_spin()?;
    let mesh =
        InProcessTransport::mesh(n, DEFAULT_RING_BYTES).map_err(|source| SetupError::Io {
            rank: 0,
            context: format!("mapping the rings of {n} local ranks"),
            source,
        })?;
    let mut backends = Vec::with_capacity(n);
    for (rank, mut transport) in mesh.into_iter().enumerate() {
        transport.set_spin(spin);
        let observers = observers((rank, n), "gloo", flight.clone(), None);
        let backend = host_backend(transport, config.clone(), observers.clone());
        backends.push((backend, observers));
    }
    let controls: Vec<Arc<GroupControl>> = backends
        .iter()
        .map(|(b, _)| Arc::clone(b.control()))
        .collect();
    let links = MemoryControlLink::mesh(&controls).map_err(|source| SetupError::Io {
        rank: 0,
        context: "starting the local ranks' control threads".into(),
        source,
    })?;
    Ok(backends
        .into_iter()
        .zip(links)
        .enumerate()
        .map(|(rank, ((mut backend, observers), link))| {
            backend.keep_control_link(Box::new(link));
            ProcessGroup::observed(Box::new(backend), &observers)
                .reaching_peers_by(same_for_every_peer(rank, n, LOCAL))
                .issuing_from_any_thread(opts.any_thread)
        })
        .collect())
}

/// `n` NCCL ranks in this process, rank `r` on GPU `r`, joined together.
#[cfg(feature = "nccl")]
fn local_nccl(n: usize, opts: &InitOptions) -> Result<Vec<ProcessGroup>, Error> {
    use crate::StoreListener;

    let visible = ringccl_nccl::NcclBackend::probe()?;
    if visible < n {
        return Err(Error::BackendUnavailable {
            backend: "nccl",
            reason: format!(
                "{n} local ranks need {n} GPUs, one each, but {visible} are visible \
                 (after CUDA_VISIBLE_DEVICES); ask for at most {visible}, or use \"gloo\""
            ),
        });
    }
    let listener = StoreListener::bind("127.0.0.1:0")?;
    let master = listener
        .local_addr()
        .map_err(|source| SetupError::Io {
            rank: 0,
            context: "reading the local NCCL ranks' store address".into(),
            source,
        })?
        .to_string();
    // Rank 0 serves the store.
    let mut per_rank = vec![opts.for_local_rank(0, n, &master).store_listener(listener)];
    per_rank.extend((1..n).map(|rank| opts.for_local_rank(rank, n, &master)));
    // Every rank joins on its own thread, as NCCL needs all of them in the init at once.
    let joined: Vec<Result<ProcessGroup, Error>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_rank
            .into_iter()
            .map(|rank_opts| scope.spawn(move || crate::init_process_group("nccl", rank_opts)))
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, handle)| {
                handle.join().unwrap_or_else(|_| {
                    Err(Error::InvalidArgument(format!(
                        "local NCCL rank {rank}'s start-up thread panicked"
                    )))
                })
            })
            .collect()
    });
    // One rank's failure makes the others fail too (a lost peer, a timeout): report
    // the first error that is not such a consequence.
    let consequence = |e: &Error| matches!(e, Error::PeerLost { .. } | Error::Timeout { .. });
    let cause = joined
        .iter()
        .position(|r| r.as_ref().is_err_and(|e| !consequence(e)));
    match cause {
        Some(i) => match joined.into_iter().nth(i) {
            Some(Err(e)) => Err(e),
            _ => Err(Error::InvalidArgument(
                "a local NCCL rank failed to start".into(),
            )),
        },
        None => joined.into_iter().collect(),
    }
}

/// How [`run_local_ranks`] failed: the first rank, in rank order, whose body returned an
/// error or panicked.
#[derive(Debug)]
pub enum LocalRankFailure<E> {
    /// Rank `rank`'s body returned `error`.
    Failed {
        /// The rank.
        rank: usize,
        /// What its body returned.
        error: E,
    },
    /// Rank `rank`'s body panicked with `message`.
    Panicked {
        /// The rank.
        rank: usize,
        /// The panic's message, when it was a string.
        message: String,
    },
}

impl<E: std::fmt::Display> std::fmt::Display for LocalRankFailure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalRankFailure::Failed { rank, error } => write!(f, "rank {rank}: {error}"),
            LocalRankFailure::Panicked { rank, message } => {
                write!(f, "rank {rank}'s thread panicked: {message}")
            }
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for LocalRankFailure<E> {}

/// Runs `body` on every rank of `ranks` (from [`local_groups`]), each on its own thread,
/// and returns what each returned, in rank order; or the first failure in rank order.
/// Each thread owns its rank, so a rank whose body fails or panics drops its group and
/// the others fail at once, not at their deadline.
///
/// ```
/// use ringccl::ReduceOp;
///
/// let ranks = ringccl::local_groups("gloo", 3)?;
/// let sums = ringccl::run_local_ranks(ranks, |pg| {
///     let mut x = [pg.rank() as i64];
///     pg.all_reduce(&mut x, ReduceOp::Sum).map(|()| x[0])
/// })?;
/// assert_eq!(sums, vec![3, 3, 3]);
///
/// let ranks = ringccl::local_groups("gloo", 2)?;
/// let failed = ringccl::run_local_ranks(ranks, |pg| match pg.rank() {
///     1 => Err("no data"),
///     _ => Ok(()),
/// });
/// assert_eq!(failed.unwrap_err().to_string(), "rank 1: no data");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_local_ranks<R: Send, E: Send>(
    ranks: Vec<ProcessGroup>,
    body: impl Fn(ProcessGroup) -> Result<R, E> + Sync,
) -> Result<Vec<R>, LocalRankFailure<E>> {
    let body = &body;
    let outcomes: Vec<std::thread::Result<Result<R, E>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|pg| scope.spawn(move || body(pg)))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut values = Vec::with_capacity(outcomes.len());
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(Ok(value)) => values.push(value),
            Ok(Err(error)) => return Err(LocalRankFailure::Failed { rank, error }),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(not a string)".into());
                return Err(LocalRankFailure::Panicked { rank, message });
            }
        }
    }
    Ok(values)
}
