//! How a process finds its group: rank, world size, the master's address, the deadline,
//! and the settings of the collectives. The environment is read in [`env`] only.

pub(crate) mod env;
mod slurm;
mod transport_kind;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ringccl_collectives::wire::MAX_FRAME_PAYLOAD;
use ringccl_collectives::AllReduceAlgo;
use ringccl_observe::flight::{
    FlightConfig, DEFAULT_FLIGHT_ENTRIES, MAIN_GROUP, MAX_FLIGHT_ENTRIES,
};
use ringccl_rendezvous::{AuthToken, MeshConfig, StoreListener, DEFAULT_STARTUP_REPORT};
use ringccl_transports::shm::{DEFAULT_SPIN, MAX_SPIN};

use crate::Error;
pub use transport_kind::TransportKind;

/// Default deadline of rendezvous and of every collective: 30 minutes, as PyTorch's gloo.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Default of [`InitOptions::dead_peer_timeout`].
pub const DEFAULT_DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to create a process group.
///
/// Set it with the builder methods; read it through the fields, which carry the same
/// names (`opts.timeout` is the value, `opts.timeout(d)` sets it).
///
/// ```
/// use std::time::Duration;
/// use ringccl::InitOptions;
///
/// let opts = InitOptions::new(0, 4, "10.0.0.1:29500").timeout(Duration::from_secs(60));
/// assert_eq!(opts.rank, 0);
/// assert_eq!(opts.world_size, 4);
/// assert_eq!(opts.master, "10.0.0.1:29500");
/// assert_eq!(opts.timeout, Duration::from_secs(60));
/// ```
#[derive(Debug)]
pub struct InitOptions {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank 0's store, `"host:port"`.
    pub master: String,
    /// This process's rank on its node, if known (picks a GPU).
    pub local_rank: Option<usize>,
    /// Deadline of rendezvous and of each collective.
    pub timeout: Duration,
    /// Largest chunk the pipelined algorithms put in one frame, if overridden.
    pub chunk_bytes: Option<usize>,
    /// The all-reduce algorithm chosen in code; `None` defers to `RINGCCL_ALGO`, then auto.
    pub all_reduce_algo: Option<AllReduceAlgo>,
    /// Largest all-reduce that auto runs with recursive doubling, if overridden.
    pub small_all_reduce_max_bytes: Option<usize>,
    /// Largest all-reduce that auto runs with halving-doubling (four ranks or more), if
    /// overridden.
    pub mid_all_reduce_max_bytes: Option<usize>,
    /// Smallest all-reduce that ranks of one process run through each other's buffers
    /// under auto, if overridden.
    pub peer_memory_min_bytes: Option<usize>,
    /// The transport chosen in code; `None` defers to `RINGCCL_TRANSPORT`, then auto.
    pub transport: Option<TransportKind>,
    /// The CUDA device override of the `"nccl"` backend.
    pub device: Option<usize>,
    /// The shared secret, when authentication is on.
    pub auth_token: Option<AuthToken>,
    /// How long a silent peer host may stay silent before its connections count as failed.
    pub dead_peer_timeout: Duration,
    /// Which attempt of a restarted job this process belongs to (0 for the first).
    pub attempt: u32,
    /// How long a rank waits at start-up before it prints whom it waits for (then every
    /// twice that); 30 s by default, `RINGCCL_STARTUP_REPORT` from the environment.
    pub startup_report: Duration,
    /// Where the flight recorder writes its dumps and progress beacons; `None` defers to
    /// `RINGCCL_FLIGHT_DIR`, then writes nothing.
    pub flight_dir: Option<PathBuf>,
    /// How many calls the flight recorder keeps per group; `None` defers to
    /// `RINGCCL_FLIGHT_ENTRIES`, then 2000.
    pub flight_entries: Option<usize>,
    /// Where this rank writes its Chrome trace (the timeline); `None` defers to
    /// `RINGCCL_TRACE`, then no trace.
    pub trace_dir: Option<PathBuf>,
    /// How long a wait spins before it sleeps (both transports); `None` defers to
    /// `RINGCCL_SPIN_US`, then 50 µs.
    pub spin: Option<Duration>,
    /// Which network interfaces this rank listens on for its peers, in NCCL's syntax
    /// (`eth0`, `ib0,eth1`, `^lo,docker`, `=eth0`); `None` defers to
    /// `RINGCCL_SOCKET_IFNAME`, then the interface that reaches the rendezvous store.
    pub socket_ifname: Option<String>,
    /// Calls issued from several threads are queued in issue order, as gloo queues them,
    /// instead of refused ([`InitOptions::issue_from_any_thread`]).
    pub any_thread: bool,
    /// The group's name in its flight recorder's files (`rank-<rank>.<name>.json`);
    /// `None`: the main group's (`rank-<rank>.json`). See [`InitOptions::group_name`].
    pub group_name: Option<String>,
    store_listener: Option<StoreListener>,
}

impl InitOptions {
    /// Options for rank `rank` of `world_size`, with rank 0's store at `master`
    /// (`"host:port"`, IPv6 hosts in brackets: `"[fe80::1]:29500"`).
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(1, 2, "[fe80::1]:29500");
    /// assert_eq!(opts.local_rank, None);
    /// ```
    pub fn new(rank: usize, world_size: usize, master: &str) -> InitOptions {
        InitOptions {
            rank,
            world_size,
            master: master.to_string(),
            local_rank: None,
            timeout: DEFAULT_TIMEOUT,
            store_listener: None,
            chunk_bytes: None,
            all_reduce_algo: None,
            small_all_reduce_max_bytes: None,
            mid_all_reduce_max_bytes: None,
            peer_memory_min_bytes: None,
            transport: None,
            device: None,
            auth_token: None,
            dead_peer_timeout: DEFAULT_DEAD_PEER_TIMEOUT,
            attempt: 0,
            startup_report: DEFAULT_STARTUP_REPORT,
            flight_dir: None,
            flight_entries: None,
            trace_dir: None,
            spin: None,
            socket_ifname: None,
            any_thread: false,
            group_name: None,
        }
    }

    /// Reads the launcher's variables: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or
    /// Slurm's and OpenMPI's equivalents) and, if set, LOCAL_RANK,
    /// TORCHELASTIC_RESTART_COUNT, RINGCCL_TIMEOUT, RINGCCL_DEAD_PEER_TIMEOUT,
    /// RINGCCL_STARTUP_REPORT (seconds) and RINGCCL_AUTH_TOKEN. (RINGCCL_ALGO,
    /// RINGCCL_TRANSPORT, RINGCCL_TRACE and RINGCCL_SOCKET_IFNAME are read when the group
    /// starts, for whatever the code left unset.) A missing or
    /// malformed variable is an error that names it.
    ///
    /// ```no_run
    /// let opts = ringccl::InitOptions::from_env()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn from_env() -> Result<InitOptions, Error> {
        InitOptions::from_vars(env::process_env)
    }

    /// Like [`InitOptions::from_env`], reading variables through `lookup` instead of the
    /// process environment.
    ///
    /// ```
    /// use ringccl::InitOptions;
    /// let vars = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "::1"), ("MASTER_PORT", "29500")];
    /// let opts = InitOptions::from_vars(|k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string()))?;
    /// assert_eq!(opts.master, "[::1]:29500");
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<InitOptions, Error> {
        env::options_from(lookup)
    }

    /// Whether a launcher made this process one rank of a group: `RANK` is set (ringrun,
    /// torchrun), or OpenMPI's `OMPI_COMM_WORLD_RANK` (mpirun), or Slurm's
    /// `SLURM_PROCID` inside a job step (srun; a batch script, which runs outside any
    /// step, is not a rank). A program that can also start its own ranks, as
    /// `ringccl-bench` does, asks this first.
    ///
    /// ```no_run
    /// if ringccl::InitOptions::launched_as_rank() {
    ///     let opts = ringccl::InitOptions::from_env()?;
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn launched_as_rank() -> bool {
        InitOptions::launched_as_rank_in(env::process_env)
    }

    /// [`InitOptions::launched_as_rank`], reading variables through `lookup`.
    ///
    /// ```
    /// use ringccl::InitOptions;
    /// let srun = [("SLURM_PROCID", "3"), ("SLURM_NTASKS", "4"), ("SLURM_STEP_ID", "0")];
    /// assert!(InitOptions::launched_as_rank_in(|k| srun.iter().find(|v| v.0 == k).map(|v| v.1.into())));
    /// let sbatch = [("SLURM_PROCID", "0")];
    /// assert!(!InitOptions::launched_as_rank_in(|k| sbatch.iter().find(|v| v.0 == k).map(|v| v.1.into())));
    /// ```
    pub fn launched_as_rank_in(lookup: impl Fn(&str) -> Option<String>) -> bool {
        env::launched_as_rank(lookup)
    }

    /// Sets the deadline of rendezvous and of each collective (default 30 minutes).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").timeout(Duration::from_secs(9));
    /// assert_eq!(opts.timeout, Duration::from_secs(9));
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> InitOptions {
        self.timeout = timeout;
        self
    }

    /// Sets how long a rank waits at start-up before it prints, by itself, which ranks
    /// have joined and whom it still waits for (then every twice that; default 30 s).
    /// Zero is taken as one millisecond.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let opts = ringccl::InitOptions::new(0, 2, "h:1").startup_report(Duration::from_secs(5));
    /// assert_eq!(opts.startup_report, Duration::from_secs(5));
    /// ```
    pub fn startup_report(mut self, after: Duration) -> InitOptions {
        self.startup_report = after.max(Duration::from_millis(1));
        self
    }

    /// Sets this process's rank on its node (used to pick a GPU).
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(3, 4, "h:1").local_rank(1);
    /// assert_eq!(opts.local_rank, Some(1));
    /// ```
    pub fn local_rank(mut self, local_rank: usize) -> InitOptions {
        self.local_rank = Some(local_rank);
        self
    }

    /// Hands rank 0 an already bound store listener instead of binding the master address
    /// itself (for example one bound to port 0, whose real port was passed to the others).
    ///
    /// ```
    /// let listener = ringccl::StoreListener::bind("127.0.0.1:0")?;
    /// let addr = listener.local_addr()?.to_string();
    /// let opts = ringccl::InitOptions::new(0, 2, &addr).store_listener(listener);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn store_listener(mut self, listener: StoreListener) -> InitOptions {
        self.store_listener = Some(listener);
        self
    }

    /// Sets the largest chunk the pipelined algorithms put in one frame. Every rank must
    /// use the same value. Mostly for benchmarks and tests.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").chunk_bytes(1 << 20);
    /// assert_eq!(opts.chunk_bytes, Some(1 << 20));
    /// ```
    pub fn chunk_bytes(mut self, bytes: usize) -> InitOptions {
        self.chunk_bytes = Some(bytes);
        self
    }

    /// Forces an all-reduce algorithm (default [`AllReduceAlgo::Auto`]; the
    /// `RINGCCL_ALGO` environment variable applies when this is not called). Every rank
    /// must use the same setting.
    ///
    /// ```
    /// use ringccl::{AllReduceAlgo, InitOptions};
    /// let opts = InitOptions::new(0, 1, "h:1").all_reduce_algo(AllReduceAlgo::Ring);
    /// assert_eq!(opts.all_reduce_algo, Some(AllReduceAlgo::Ring));
    /// ```
    pub fn all_reduce_algo(mut self, algo: AllReduceAlgo) -> InitOptions {
        self.all_reduce_algo = Some(algo);
        self
    }

    /// Sets the largest all-reduce that [`AllReduceAlgo::Auto`] runs with recursive
    /// doubling (default 32 KiB). Every rank must use the same value.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").small_all_reduce_max_bytes(4096);
    /// assert_eq!(opts.small_all_reduce_max_bytes, Some(4096));
    /// ```
    pub fn small_all_reduce_max_bytes(mut self, bytes: usize) -> InitOptions {
        self.small_all_reduce_max_bytes = Some(bytes);
        self
    }

    /// Sets the largest all-reduce that [`AllReduceAlgo::Auto`] runs with
    /// halving-doubling when the group has four ranks or more (default 4 MiB; the ring
    /// above). Every rank must use the same value.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").mid_all_reduce_max_bytes(1 << 20);
    /// assert_eq!(opts.mid_all_reduce_max_bytes, Some(1 << 20));
    /// ```
    pub fn mid_all_reduce_max_bytes(mut self, bytes: usize) -> InitOptions {
        self.mid_all_reduce_max_bytes = Some(bytes);
        self
    }

    /// Sets the smallest all-reduce that [`AllReduceAlgo::Auto`] runs through the other
    /// ranks' buffers when the ranks share this process ([`crate::local_groups`];
    /// default 1 MiB). Every rank must use the same value.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").peer_memory_min_bytes(4 << 20);
    /// assert_eq!(opts.peer_memory_min_bytes, Some(4 << 20));
    /// ```
    pub fn peer_memory_min_bytes(mut self, bytes: usize) -> InitOptions {
        self.peer_memory_min_bytes = Some(bytes);
        self
    }

    /// Chooses the transport (default [`TransportKind::Auto`]; the
    /// `RINGCCL_TRANSPORT=auto|tcp|shm` environment variable applies when this is not
    /// called). Every rank must use the same one.
    ///
    /// ```
    /// use ringccl::{InitOptions, TransportKind};
    /// let opts = InitOptions::new(0, 1, "h:1").transport(TransportKind::Tcp);
    /// assert_eq!(opts.transport, Some(TransportKind::Tcp));
    /// ```
    pub fn transport(mut self, kind: TransportKind) -> InitOptions {
        self.transport = Some(kind);
        self
    }

    /// Pins the `"nccl"` backend to CUDA device `ordinal` (as numbered after
    /// `CUDA_VISIBLE_DEVICES`). Without it, rank `r` uses device
    /// `(LOCAL_RANK or r) % device_count`.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").device(2);
    /// assert_eq!(opts.device, Some(2));
    /// ```
    pub fn device(mut self, ordinal: usize) -> InitOptions {
        self.device = Some(ordinal);
        self
    }

    /// Requires every connection of the job (to the rendezvous store and between ranks)
    /// to prove, by an HMAC-SHA256 challenge–response, that it holds `secret`; others are
    /// refused and logged. Every rank must use the same secret (the `RINGCCL_AUTH_TOKEN`
    /// environment variable sets it too). An empty secret leaves authentication off.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").auth_token("s3cret");
    /// assert!(opts.auth_token.is_some());
    /// ```
    pub fn auth_token(mut self, secret: impl AsRef<[u8]>) -> InitOptions {
        self.auth_token = AuthToken::new(secret);
        self
    }

    /// How long a peer's host may stay silent at the TCP level (unanswered keepalive
    /// probes, unacknowledged data) before its connections count as failed (default
    /// 5 s, at least 1 s; `RINGCCL_DEAD_PEER_TIMEOUT` in seconds). Slow but alive peers
    /// still answer at the TCP level, so this only bounds how fast a vanished host is
    /// noticed; raise it on networks with long outages that should be ridden out.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").dead_peer_timeout(Duration::ZERO);
    /// assert_eq!(opts.dead_peer_timeout, Duration::from_secs(1));
    /// ```
    pub fn dead_peer_timeout(mut self, timeout: Duration) -> InitOptions {
        self.dead_peer_timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// Sets which attempt of a restarted job this process belongs to (default 0;
    /// `ringrun --max-restarts` and `torchrun` set `TORCHELASTIC_RESTART_COUNT`, which
    /// [`InitOptions::from_env`] reads). A process of one attempt cannot join another:
    /// a rank left over from before a restart gets an error naming both attempts.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").attempt(2);
    /// assert_eq!(opts.attempt, 2);
    /// ```
    pub fn attempt(mut self, attempt: u32) -> InitOptions {
        self.attempt = attempt;
        self
    }

    /// Makes the flight recorder write its files to `dir` (created if missing): each
    /// group's dump (`rank-<rank>.json`, written when the group breaks, when a call times
    /// out, and on `SIGUSR1`) and its progress beacon (`rank-<rank>.beacon`). Setting it
    /// also makes the process answer `SIGUSR1` with the dumps instead of exiting. The
    /// `RINGCCL_FLIGHT_DIR` environment variable applies when this is not called.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").flight_dir("/tmp/flight");
    /// assert_eq!(opts.flight_dir.as_deref(), Some(std::path::Path::new("/tmp/flight")));
    /// ```
    pub fn flight_dir(mut self, dir: impl Into<PathBuf>) -> InitOptions {
        self.flight_dir = Some(dir.into());
        self
    }

    /// How many of its last calls each group's flight recorder keeps (default 2000, at
    /// most 100000, about 400 bytes each; `RINGCCL_FLIGHT_ENTRIES` applies when this is
    /// not called).
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").flight_entries(500);
    /// assert_eq!(opts.flight_entries, Some(500));
    /// assert!(ringccl::InitOptions::new(0, 1, "h:1").flight_entries(0).validate().is_err());
    /// ```
    pub fn flight_entries(mut self, entries: usize) -> InitOptions {
        self.flight_entries = Some(entries);
        self
    }

    /// Makes this rank write a Chrome trace of its collectives (one span per call, with
    /// its op number, kind, size, algorithm and transport) to `dir/rank-<rank>.json`,
    /// creating `dir`; Perfetto (ui.perfetto.dev) and chrome://tracing open it, and
    /// `ringrun --trace DIR` merges the ranks' files into `DIR/trace.json`. Without this
    /// call, the `RINGCCL_TRACE` environment variable names the directory (unset or empty:
    /// no trace). Tracing off costs one branch per call.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").trace_dir("/tmp/trace");
    /// assert_eq!(opts.trace_dir.as_deref(), Some(std::path::Path::new("/tmp/trace")));
    /// ```
    pub fn trace_dir(mut self, dir: impl AsRef<Path>) -> InitOptions {
        self.trace_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Sets how long a wait spins (a busy core) before it sleeps: over shared memory it
    /// watches the rings, then sleeps on the futex; over TCP it busy-polls the sockets,
    /// then sleeps in `poll(2)`. At most 10 ms, 50 µs by default, zero to sleep at once.
    /// Spinning saves a wake-up (a context switch) per hop of each small message; when
    /// the ranks outnumber the host's cores, they yield the core between looks instead.
    /// Without this call, `RINGCCL_SPIN_US` (microseconds) applies.
    ///
    /// ```
    /// use std::time::Duration;
    /// let opts = ringccl::InitOptions::new(0, 1, "h:1").spin(Duration::from_micros(20));
    /// assert_eq!(opts.spin, Some(Duration::from_micros(20)));
    /// assert!(ringccl::InitOptions::new(0, 1, "h:1").spin(Duration::from_secs(1)).validate().is_err());
    /// ```
    pub fn spin(mut self, window: Duration) -> InitOptions {
        self.spin = Some(window);
        self
    }

    /// Chooses the network interface this rank listens on for its peers (and publishes
    /// to them), for hosts with several (a management network beside a fast one, docker
    /// bridges), in the syntax of `NCCL_SOCKET_IFNAME`: `"eth"` (any interface whose
    /// name starts with eth), `"ib0,eth1"` (a list of such prefixes), `"^lo,docker"` (all
    /// but these), `"=eth0"` (exact names; `"^=…"` excludes exact names). Of the matching
    /// interfaces, the first one with an address of the family (IPv4 or IPv6) the rank
    /// reaches the rendezvous store over is taken, else the first of the other family
    /// (with a warning); a setting that matches nothing fails start-up with an error
    /// naming this host's interfaces. Without this call, `RINGCCL_SOCKET_IFNAME` applies;
    /// without either, the rank listens on the interface that reaches the store.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 2, "10.0.0.1:29500").socket_ifname("^lo,docker");
    /// assert_eq!(opts.socket_ifname.as_deref(), Some("^lo,docker"));
    /// assert!(opts.validate().is_ok());
    /// // `^` and `=` may only open the list.
    /// assert!(ringccl::InitOptions::new(0, 2, "h:1").socket_ifname("eth0,^lo").validate().is_err());
    /// ```
    pub fn socket_ifname(mut self, spec: impl Into<String>) -> InitOptions {
        self.socket_ifname = Some(spec.into());
        self
    }

    /// Lets any thread issue calls while another thread's are still pending: each call
    /// is queued behind every call issued before it on this rank, whatever thread issued
    /// it (gloo's rule, which `torch.distributed` relies on: DDP all-reduces from the
    /// autograd thread). By default such a call is refused with
    /// [`Error::ConcurrentUse`](crate::Error::ConcurrentUse), since threads racing to
    /// issue can pair their calls differently on different ranks; with this setting,
    /// keeping the issue order the same on every rank is the program's duty.
    ///
    /// ```
    /// use std::thread;
    /// let opts = ringccl::InitOptions::new(0, 1, "127.0.0.1:0").issue_from_any_thread();
    /// let pg = ringccl::init_process_group("gloo", opts)?;
    /// let pending = pg.all_reduce_async(vec![1.0f32; 4], ringccl::ReduceOp::Sum)?;
    /// let other = pg.clone();
    /// // Another thread's call, issued while the first is pending, queues behind it.
    /// thread::spawn(move || other.barrier()).join().unwrap()?;
    /// assert_eq!(pending.wait()?, vec![1.0; 4]);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn issue_from_any_thread(mut self) -> InitOptions {
        self.any_thread = true;
        self
    }

    /// Names the group in its flight recorder's files, for a process that starts several
    /// groups itself (one per `torch.distributed` group, say) whose dumps must not
    /// overwrite each other's: `rank-<rank>.<name>.json` instead of `rank-<rank>.json`.
    ///
    /// ```
    /// let opts = ringccl::InitOptions::new(0, 1, "127.0.0.1:0").group_name("experts");
    /// assert_eq!(opts.group_name.as_deref(), Some("experts"));
    /// ```
    pub fn group_name(mut self, name: impl Into<String>) -> InitOptions {
        self.group_name = Some(name.into());
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The master's `"host:port"`.
    pub fn master(&self) -> &str {
        &self.master
    }

    /// Checks the options for consistency.
    ///
    /// ```
    /// assert!(ringccl::InitOptions::new(4, 4, "h:1").validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), Error> {
        if self.socket_ifname.is_none() {
            // Named as the variable it came from.
            env::socket_ifname(env::process_env)?;
        }
        self.mesh_settings(None).validate()?;
        if let Some(bytes) = self.chunk_bytes {
            if bytes == 0 || bytes > MAX_FRAME_PAYLOAD {
                return Err(Error::InvalidArgument(format!(
                    "chunk_bytes must be between 1 and {MAX_FRAME_PAYLOAD}, got {bytes}"
                )));
            }
        }
        if let Some(window) = self.spin {
            if window > MAX_SPIN {
                return Err(Error::InvalidArgument(format!(
                    "spin must be at most {MAX_SPIN:?}, got {window:?}"
                )));
            }
        }
        if let Some(entries) = self.flight_entries {
            if !(1..=MAX_FLIGHT_ENTRIES).contains(&entries) {
                return Err(Error::InvalidArgument(format!(
                    "flight_entries must be between 1 and {MAX_FLIGHT_ENTRIES}, got {entries}"
                )));
            }
        }
        Ok(())
    }

    /// The flight recorder's directory: the setting in code, else `RINGCCL_FLIGHT_DIR`,
    /// else none; refused when it is the trace's directory too.
    pub(crate) fn resolved_flight_dir(&self) -> Result<Option<PathBuf>, Error> {
        let Some(dir) = self
            .flight_dir
            .clone()
            .or_else(|| env::flight_dir(env::process_env))
        else {
            return Ok(None);
        };
        // The trace and the dumps both name their files rank-<rank>.json.
        if let Some(trace) = self.resolved_trace_dir()? {
            let same = match (std::fs::canonicalize(&dir), std::fs::canonicalize(&trace)) {
                (Ok(a), Ok(b)) => a == b,
                _ => dir == trace,
            };
            if same {
                return Err(Error::InvalidArgument(format!(
                    "the flight recorder's directory (RINGCCL_FLIGHT_DIR or \
                     InitOptions::flight_dir) and the trace's (RINGCCL_TRACE or \
                     InitOptions::trace_dir) are both {}: each writes rank-<rank>.json there; \
                     give them different directories",
                    dir.display()
                )));
            }
        }
        Ok(Some(dir))
    }

    /// The flight recorder's size: the setting in code, else `RINGCCL_FLIGHT_ENTRIES`,
    /// else 2000.
    pub(crate) fn resolved_flight_entries(&self) -> Result<usize, Error> {
        match self.flight_entries {
            Some(entries) => Ok(entries),
            None => Ok(env::flight_entries(env::process_env)?.unwrap_or(DEFAULT_FLIGHT_ENTRIES)),
        }
    }

    /// The main group's flight recorder settings over `transport`: where it writes
    /// ([`resolved_flight_dir`](Self::resolved_flight_dir)) and how many calls it keeps
    /// ([`resolved_flight_entries`](Self::resolved_flight_entries)).
    pub(crate) fn flight_config(&self, transport: &'static str) -> Result<FlightConfig, Error> {
        Ok(FlightConfig {
            entries: self.resolved_flight_entries()?,
            dir: self.resolved_flight_dir()?,
            group: MAIN_GROUP.into(),
            transport,
        })
    }

    /// The spin window: the setting in code, else `RINGCCL_SPIN_US`, else
    /// 50 µs.
    pub(crate) fn resolved_spin(&self) -> Result<Duration, Error> {
        match self.spin {
            Some(window) => Ok(window),
            None => Ok(env::spin(env::process_env)?.unwrap_or(DEFAULT_SPIN)),
        }
    }

    /// The all-reduce algorithm: the setting in code, else `RINGCCL_ALGO`, else auto.
    pub(crate) fn resolved_all_reduce_algo(&self) -> Result<AllReduceAlgo, Error> {
        match self.all_reduce_algo {
            Some(algo) => Ok(algo),
            None => Ok(env::all_reduce_algo(env::process_env)?.unwrap_or_default()),
        }
    }

    /// The transport: the setting in code, else `RINGCCL_TRANSPORT`, else auto.
    pub(crate) fn resolved_transport(&self) -> Result<TransportKind, Error> {
        match self.transport {
            Some(kind) => Ok(kind),
            None => Ok(env::transport(env::process_env)?.unwrap_or_default()),
        }
    }

    /// The trace directory: the setting in code, else `RINGCCL_TRACE`, else none.
    pub(crate) fn resolved_trace_dir(&self) -> Result<Option<PathBuf>, Error> {
        match &self.trace_dir {
            Some(dir) => Ok(Some(dir.clone())),
            None => env::trace_dir(env::process_env),
        }
    }

    /// These settings for rank `rank` of a group of `world_size` ranks living in this
    /// process, with its store at `master` and CUDA device `rank` (each local rank its
    /// own GPU). The store listener is not carried over.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))] // only local NCCL groups use it
    pub(crate) fn for_local_rank(
        &self,
        rank: usize,
        world_size: usize,
        master: &str,
    ) -> InitOptions {
        InitOptions {
            rank,
            world_size,
            master: master.to_string(),
            local_rank: Some(rank),
            timeout: self.timeout,
            store_listener: None,
            chunk_bytes: self.chunk_bytes,
            all_reduce_algo: self.all_reduce_algo,
            small_all_reduce_max_bytes: self.small_all_reduce_max_bytes,
            mid_all_reduce_max_bytes: self.mid_all_reduce_max_bytes,
            peer_memory_min_bytes: self.peer_memory_min_bytes,
            transport: self.transport,
            device: Some(rank),
            auth_token: self.auth_token.clone(),
            dead_peer_timeout: self.dead_peer_timeout,
            attempt: self.attempt,
            startup_report: self.startup_report,
            flight_dir: self.flight_dir.clone(),
            flight_entries: self.flight_entries,
            trace_dir: self.trace_dir.clone(),
            spin: self.spin,
            socket_ifname: self.socket_ifname.clone(),
            any_thread: self.any_thread,
            group_name: self.group_name.clone(),
        }
    }

    /// What the rendezvous needs, taking the store listener along (start-up consumes it).
    pub(crate) fn mesh_config(&mut self) -> MeshConfig {
        let listener = self.store_listener.take();
        self.mesh_settings(listener)
    }

    pub(crate) fn mesh_settings(&self, store_listener: Option<StoreListener>) -> MeshConfig {
        let mut config = MeshConfig::new(self.rank, self.world_size, &self.master, self.timeout);
        config.dead_peer_timeout = self.dead_peer_timeout;
        config.auth_token = self.auth_token.clone();
        config.store_listener = store_listener;
        config.attempt = self.attempt;
        config.startup_report = self.startup_report;
        config.socket_ifname = self
            .socket_ifname
            .clone()
            .or_else(|| env::socket_ifname_raw(env::process_env));
        config
    }
}
