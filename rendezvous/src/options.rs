//! How a process finds its group: rank, world size, the master's address, the deadline.

use std::time::Duration;

use ringccl_collectives::wire::MAX_FRAME_PAYLOAD;
use ringccl_collectives::{AllReduceAlgo, Error};

use crate::auth::AuthToken;
use crate::StoreListener;

/// Which transport the CPU backend moves bytes with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// Shared memory when every rank is on one host and can set it up, TCP otherwise
    /// (decided collectively at start-up).
    #[default]
    Auto,
    /// TCP between every pair of ranks (any number of hosts).
    Tcp,
    /// Shared memory between every pair of ranks; every rank must be on one host.
    SharedMemory,
}

impl std::str::FromStr for TransportKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<TransportKind, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportKind::Auto),
            "tcp" => Ok(TransportKind::Tcp),
            "shm" | "shared_memory" => Ok(TransportKind::SharedMemory),
            other => Err(Error::InvalidArgument(format!(
                "unknown transport {other:?}: valid names are auto, tcp, shm"
            ))),
        }
    }
}

/// Default deadline of rendezvous and of every collective: 30 minutes, as PyTorch's gloo.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Default of [`InitOptions::dead_peer_timeout`].
pub const DEFAULT_DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to create a process group.
///
/// ```
/// use std::time::Duration;
/// use ringccl_rendezvous::InitOptions;
///
/// let opts = InitOptions::new(0, 4, "10.0.0.1:29500").timeout(Duration::from_secs(60));
/// assert_eq!(opts.rank(), 0);
/// assert_eq!(opts.world_size(), 4);
/// assert_eq!(opts.master(), "10.0.0.1:29500");
/// assert_eq!(opts.get_timeout(), Duration::from_secs(60));
/// ```
#[derive(Debug)]
pub struct InitOptions {
    rank: usize,
    world_size: usize,
    master: String,
    local_rank: Option<usize>,
    timeout: Duration,
    store_listener: Option<StoreListener>,
    chunk_bytes: Option<usize>,
    all_reduce_algo: Option<AllReduceAlgo>,
    small_all_reduce_max_bytes: Option<usize>,
    transport: Option<TransportKind>,
    device: Option<usize>,
    auth_token: Option<AuthToken>,
    dead_peer_timeout: Duration,
}

const TORCHRUN_HINT: &str = "launch under `ringrun`, `torchrun`, Slurm's `srun` or OpenMPI's `mpirun`, or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT";

/// The first host of a Slurm node list: `node[01-04,07],gpu5` → `node01`.
pub fn first_slurm_host(nodelist: &str) -> Option<String> {
    let list = nodelist.trim();
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0i32;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let first = &list[..end];
    let host = match first.split_once('[') {
        None => first.to_string(),
        Some((prefix, rest)) => {
            let range = rest.split([',', ']']).next()?;
            let start = range.split('-').next()?;
            if start.is_empty() || !start.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            format!("{prefix}{start}")
        }
    };
    (!host.is_empty()).then_some(host)
}

impl InitOptions {
    /// Options for rank `rank` of `world_size`, with rank 0's store at `master`
    /// (`"host:port"`, IPv6 hosts in brackets: `"[fe80::1]:29500"`).
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
            transport: None,
            device: None,
            auth_token: None,
            dead_peer_timeout: DEFAULT_DEAD_PEER_TIMEOUT,
        }
    }

    /// Reads the torchrun variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and, if
    /// set, LOCAL_RANK and RINGCCL_TIMEOUT (seconds). A missing or malformed variable is
    /// an error that names it.
    pub fn from_env() -> Result<InitOptions, Error> {
        InitOptions::from_vars(|name| std::env::var(name).ok())
    }

    /// Like [`InitOptions::from_env`], reading variables through `lookup` instead of the
    /// process environment.
    ///
    /// ```
    /// use ringccl_rendezvous::InitOptions;
    /// let vars = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "::1"), ("MASTER_PORT", "29500")];
    /// let opts = InitOptions::from_vars(|k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string()))?;
    /// assert_eq!(opts.master(), "[::1]:29500");
    /// # Ok::<(), ringccl_collectives::Error>(())
    /// ```
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<InitOptions, Error> {
        let set = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());
        // The torchrun name first, then what Slurm's srun and OpenMPI's mpirun set.
        let first_of = |names: &[&'static str]| {
            names
                .iter()
                .find_map(|&var| set(var).map(|value| (var, value)))
        };
        let required = |names: &[&'static str]| {
            first_of(names).ok_or(Error::MissingEnv {
                var: names[0],
                hint: TORCHRUN_HINT,
            })
        };
        let number = |(var, value): (&'static str, String)| {
            value
                .trim()
                .parse::<usize>()
                .map_err(|e| Error::InvalidEnv {
                    var,
                    value: value.clone(),
                    reason: format!("expected a non-negative integer ({e})"),
                })
        };
        let rank_var = required(&["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"])?;
        let rank_name = rank_var.0;
        let rank = number(rank_var)?;
        let world_var = required(&["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"])?;
        let world_name = world_var.0;
        let world_size = number(world_var)?;
        if world_size == 0 {
            return Err(Error::InvalidEnv {
                var: world_name,
                value: "0".into(),
                reason: "a group needs at least one rank".into(),
            });
        }
        if rank >= world_size {
            return Err(Error::InvalidEnv {
                var: rank_name,
                value: rank.to_string(),
                reason: format!("must be less than {world_name}={world_size}"),
            });
        }
        let addr = match set("MASTER_ADDR") {
            Some(addr) => addr.trim().to_string(),
            None => match set("SLURM_JOB_NODELIST").map(|list| first_slurm_host(&list)) {
                Some(Some(host)) => host,
                Some(None) => {
                    return Err(Error::InvalidEnv {
                        var: "SLURM_JOB_NODELIST",
                        value: set("SLURM_JOB_NODELIST").unwrap_or_default(),
                        reason: "cannot read a first host from it; set MASTER_ADDR".into(),
                    })
                }
                None => required(&["MASTER_ADDR"])?.1,
            },
        };
        let port_text = required(&["MASTER_PORT"])?.1;
        let port = port_text
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| Error::InvalidEnv {
                var: "MASTER_PORT",
                value: port_text.clone(),
                reason: "expected a TCP port number from 1 to 65535".into(),
            })?;
        let host = if addr.contains(':') && !addr.starts_with('[') {
            format!("[{addr}]")
        } else {
            addr
        };
        let mut opts = InitOptions::new(rank, world_size, &format!("{host}:{port}"));
        if let Some(local) =
            first_of(&["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"])
        {
            opts.local_rank = Some(number(local)?);
        }
        if let Some(value) = lookup("RINGCCL_TIMEOUT") {
            let secs = value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0)
                .ok_or_else(|| Error::InvalidEnv {
                    var: "RINGCCL_TIMEOUT",
                    value: value.clone(),
                    reason: "expected a positive number of seconds".into(),
                })?;
            opts.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(value) = lookup("RINGCCL_DEAD_PEER_TIMEOUT") {
            let secs = value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 1.0)
                .ok_or_else(|| Error::InvalidEnv {
                    var: "RINGCCL_DEAD_PEER_TIMEOUT",
                    value: value.clone(),
                    reason: "expected a number of seconds, at least 1".into(),
                })?;
            opts.dead_peer_timeout = Duration::from_secs_f64(secs);
        }
        if let Some(secret) = lookup("RINGCCL_AUTH_TOKEN") {
            opts.auth_token =
                Some(
                    AuthToken::new(&secret).ok_or(Error::InvalidEnv {
                        var: "RINGCCL_AUTH_TOKEN",
                        value: String::new(),
                        reason:
                            "an empty token would authenticate nothing; set a secret, or unset it"
                                .into(),
                    })?,
                );
        }
        Ok(opts)
    }

    /// Sets the deadline of rendezvous and of each collective (default 30 minutes).
    pub fn timeout(mut self, timeout: Duration) -> InitOptions {
        self.timeout = timeout;
        self
    }

    /// Sets this process's rank on its node (used to pick a GPU).
    pub fn local_rank(mut self, local_rank: usize) -> InitOptions {
        self.local_rank = Some(local_rank);
        self
    }

    /// Hands rank 0 an already bound store listener instead of binding the master address
    /// itself (for example one bound to port 0, whose real port was passed to the others).
    pub fn store_listener(mut self, listener: StoreListener) -> InitOptions {
        self.store_listener = Some(listener);
        self
    }

    /// Sets the largest chunk the pipelined algorithms put in one frame. Every rank must
    /// use the same value. Mostly for benchmarks and tests.
    pub fn chunk_bytes(mut self, bytes: usize) -> InitOptions {
        self.chunk_bytes = Some(bytes);
        self
    }

    /// Forces an all-reduce algorithm (default [`AllReduceAlgo::Auto`]; the
    /// `RINGCCL_ALGO` environment variable applies when this is not called). Every rank
    /// must use the same setting.
    pub fn all_reduce_algo(mut self, algo: AllReduceAlgo) -> InitOptions {
        self.all_reduce_algo = Some(algo);
        self
    }

    /// Sets the largest all-reduce that [`AllReduceAlgo::Auto`] runs with recursive
    /// doubling (default 32 KiB). Every rank must use the same value.
    pub fn small_all_reduce_max_bytes(mut self, bytes: usize) -> InitOptions {
        self.small_all_reduce_max_bytes = Some(bytes);
        self
    }

    /// The all-reduce algorithm: the explicit setting, else `RINGCCL_ALGO`, else auto.
    pub fn get_all_reduce_algo(&self) -> Result<AllReduceAlgo, Error> {
        if let Some(algo) = self.all_reduce_algo {
            return Ok(algo);
        }
        match std::env::var("RINGCCL_ALGO") {
            Ok(value) => value.parse().map_err(|_| Error::InvalidEnv {
                var: "RINGCCL_ALGO",
                value: value.clone(),
                reason: format!("expected one of {}", AllReduceAlgo::NAMES),
            }),
            Err(_) => Ok(AllReduceAlgo::Auto),
        }
    }

    /// Chooses the transport (default [`TransportKind::Auto`]; the
    /// `RINGCCL_TRANSPORT=auto|tcp|shm` environment variable applies when this is not
    /// called). Every rank must use the same one.
    pub fn transport(mut self, kind: TransportKind) -> InitOptions {
        self.transport = Some(kind);
        self
    }

    /// The transport: the explicit setting, else `RINGCCL_TRANSPORT`, else auto.
    pub fn get_transport(&self) -> Result<TransportKind, Error> {
        if let Some(kind) = self.transport {
            return Ok(kind);
        }
        match std::env::var("RINGCCL_TRANSPORT") {
            Ok(value) => value.parse().map_err(|_| Error::InvalidEnv {
                var: "RINGCCL_TRANSPORT",
                value: value.clone(),
                reason: "expected auto, tcp or shm".into(),
            }),
            Err(_) => Ok(TransportKind::Auto),
        }
    }

    /// The recursive-doubling size limit override, if any.
    pub fn get_small_all_reduce_max_bytes(&self) -> Option<usize> {
        self.small_all_reduce_max_bytes
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

    /// The node-local rank, if known.
    pub fn get_local_rank(&self) -> Option<usize> {
        self.local_rank
    }

    /// Pins the `"nccl"` backend to CUDA device `ordinal` (as numbered after
    /// `CUDA_VISIBLE_DEVICES`). Without it, rank `r` uses device
    /// `(LOCAL_RANK or r) % device_count`.
    pub fn device(mut self, ordinal: usize) -> InitOptions {
        self.device = Some(ordinal);
        self
    }

    /// Requires every connection of the job (to the rendezvous store and between ranks)
    /// to prove, by an HMAC-SHA256 challenge–response, that it holds `secret`; others are
    /// refused and logged. Every rank must use the same secret (the `RINGCCL_AUTH_TOKEN`
    /// environment variable sets it too). An empty secret leaves authentication off.
    pub fn auth_token(mut self, secret: impl AsRef<[u8]>) -> InitOptions {
        self.auth_token = AuthToken::new(secret);
        self
    }

    /// How long a peer's host may stay silent at the TCP level (unanswered keepalive
    /// probes, unacknowledged data) before its connections count as failed (default
    /// 5 s; `RINGCCL_DEAD_PEER_TIMEOUT` in seconds). Slow but alive peers still answer
    /// at the TCP level, so this only bounds how fast a vanished host is noticed; raise
    /// it on networks with long outages that should be ridden out.
    pub fn dead_peer_timeout(mut self, timeout: Duration) -> InitOptions {
        self.dead_peer_timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// See [`InitOptions::dead_peer_timeout`].
    pub fn get_dead_peer_timeout(&self) -> Duration {
        self.dead_peer_timeout
    }

    /// The shared secret, if authentication is on.
    pub fn get_auth_token(&self) -> Option<&AuthToken> {
        self.auth_token.as_ref()
    }

    /// The CUDA device override, if any.
    pub fn get_device(&self) -> Option<usize> {
        self.device
    }

    /// The deadline.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The chunk size override, if any.
    pub fn get_chunk_bytes(&self) -> Option<usize> {
        self.chunk_bytes
    }

    /// Checks the options for consistency.
    pub fn validate(&self) -> Result<(), Error> {
        if self.world_size == 0 {
            return Err(Error::InvalidArgument(
                "world_size must be at least 1".into(),
            ));
        }
        if self.rank >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is out of range for world_size {} (ranks are 0..{})",
                self.rank, self.world_size, self.world_size
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidArgument("timeout must be positive".into()));
        }
        if self.store_listener.is_some() && self.rank != 0 {
            return Err(Error::InvalidArgument(format!(
                "only rank 0 hosts the store, but rank {} was given a store listener",
                self.rank
            )));
        }
        if let Some(bytes) = self.chunk_bytes {
            if bytes == 0 || bytes > MAX_FRAME_PAYLOAD {
                return Err(Error::InvalidArgument(format!(
                    "chunk_bytes must be between 1 and {MAX_FRAME_PAYLOAD}, got {bytes}"
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn take_store_listener(&mut self) -> Option<StoreListener> {
        self.store_listener.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    }

    const GOOD: [(&str, &str); 4] = [
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node0"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn reads_torchrun_variables() {
        let opts = InitOptions::from_vars(vars(&GOOD)).unwrap();
        assert_eq!((opts.rank(), opts.world_size()), (2, 4));
        assert_eq!(opts.master(), "node0:29500");
        assert_eq!(opts.get_local_rank(), None);
        assert_eq!(opts.get_timeout(), DEFAULT_TIMEOUT);
        let mut with_local = GOOD.to_vec();
        with_local.push(("LOCAL_RANK", "1"));
        with_local.push(("RINGCCL_TIMEOUT", "2.5"));
        let opts = InitOptions::from_vars(vars(&with_local)).unwrap();
        assert_eq!(opts.get_local_rank(), Some(1));
        assert_eq!(opts.get_timeout(), Duration::from_millis(2500));
    }

    #[test]
    fn each_missing_variable_is_named() {
        for missing in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
            let rest: Vec<_> = GOOD.iter().copied().filter(|p| p.0 != missing).collect();
            let err = InitOptions::from_vars(vars(&rest)).unwrap_err();
            assert!(matches!(err, Error::MissingEnv { var, .. } if var == missing));
            assert!(err.to_string().contains(missing), "{err}");
        }
    }

    #[test]
    fn malformed_variables_are_named() {
        for (var, bad) in [
            ("RANK", "two"),
            ("RANK", "4"),
            ("WORLD_SIZE", "-1"),
            ("WORLD_SIZE", "0"),
            ("MASTER_PORT", "99999"),
            ("MASTER_PORT", "0"),
            ("LOCAL_RANK", "x"),
            ("RINGCCL_TIMEOUT", "-3"),
        ] {
            let mut set: Vec<_> = GOOD.iter().copied().filter(|p| p.0 != var).collect();
            set.push((var, bad));
            let err = InitOptions::from_vars(vars(&set)).unwrap_err();
            match &err {
                Error::InvalidEnv { var: named, .. } => assert_eq!(*named, var, "{err}"),
                other => panic!("{var}={bad}: unexpected {other}"),
            }
        }
    }

    #[test]
    fn cluster_launcher_variables_are_understood_and_torchrun_names_win() {
        let slurm = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[007-010,12],cpu1"),
            ("MASTER_PORT", "29500"),
        ];
        let opts = InitOptions::from_vars(vars(&slurm)).unwrap();
        assert_eq!((opts.rank(), opts.world_size()), (5, 8));
        assert_eq!(opts.get_local_rank(), Some(1));
        assert_eq!(opts.master(), "gpu007:29500");

        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "1234"),
        ];
        let opts = InitOptions::from_vars(vars(&ompi)).unwrap();
        assert_eq!(
            (opts.rank(), opts.world_size(), opts.get_local_rank()),
            (2, 3, Some(0))
        );
        assert_eq!(opts.master(), "10.1.2.3:1234");

        let mut both = slurm.to_vec();
        both.extend([
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h0"),
        ]);
        let opts = InitOptions::from_vars(vars(&both)).unwrap();
        assert_eq!(
            (opts.rank(), opts.world_size(), opts.get_local_rank()),
            (1, 2, Some(0))
        );
        assert_eq!(opts.master(), "h0:29500");

        let bad = [
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "8"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ];
        let err = InitOptions::from_vars(vars(&bad)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidEnv {
                    var: "SLURM_PROCID",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_slurm_host("node01").as_deref(), Some("node01"));
        assert_eq!(
            first_slurm_host("node[01-04,07]").as_deref(),
            Some("node01")
        );
        assert_eq!(first_slurm_host("a[3,5],b7").as_deref(), Some("a3"));
        assert_eq!(first_slurm_host("x1,y[2-3]").as_deref(), Some("x1"));
        assert_eq!(first_slurm_host("n[]"), None);
        assert_eq!(first_slurm_host(""), None);
    }

    #[test]
    fn validate_rejects_out_of_range_rank() {
        assert!(InitOptions::new(4, 4, "h:1").validate().is_err());
        assert!(InitOptions::new(0, 0, "h:1").validate().is_err());
        assert!(InitOptions::new(3, 4, "h:1").validate().is_ok());
    }
}
