//! What connecting the mesh needs to know. The `ringccl` facade builds it from its
//! `InitOptions` (code or environment); nothing here reads the environment.

use std::time::Duration;

use crate::{AuthToken, InterfaceSpec, SetupError, StoreListener};

/// The settings of [`connect_mesh`](crate::connect_mesh).
///
/// ```
/// use std::time::Duration;
/// use ringccl_rendezvous::MeshConfig;
///
/// let config = MeshConfig::new(1, 4, "10.0.0.1:29500", Duration::from_secs(60));
/// assert_eq!(config.world_size, 4);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct MeshConfig {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank 0's store, `"host:port"`.
    pub master: String,
    /// Deadline of the whole start-up.
    pub timeout: Duration,
    /// How long a silent peer host may stay silent before its connections count as failed.
    pub dead_peer_timeout: Duration,
    /// The shared secret every connection must prove, if any.
    pub auth_token: Option<AuthToken>,
    /// Rank 0's already bound store listener, instead of binding `master`.
    pub store_listener: Option<StoreListener>,
    /// Which attempt of a restarted job this process belongs to (`ringrun` and
    /// `torchrun` set `TORCHELASTIC_RESTART_COUNT`); part of the job's identity, so a
    /// process left over from an earlier attempt cannot join a later one.
    pub attempt: u32,
    /// How long a rank waits at start-up before it says, by itself, whom it is waiting
    /// for; then again every twice that ([`DEFAULT_STARTUP_REPORT`] by default).
    pub startup_report: Duration,
    /// Which network interfaces this rank may listen on for its peers, in NCCL's
    /// syntax ([`InterfaceSpec`](crate::InterfaceSpec): `eth0`, `ib0,eth1`,
    /// `^lo,docker`, `=eth0`); the first match's address of the store connection's family
    /// is listened on and published. `None` (the default): the address this rank reaches
    /// the store through.
    pub socket_ifname: Option<String>,
}

/// How long a rank waits at start-up before its first report of whom it waits for.
pub const DEFAULT_STARTUP_REPORT: Duration = Duration::from_secs(30);

impl MeshConfig {
    /// Rank `rank` of `world_size`, with the store at `master`, start-up bounded by
    /// `timeout`; the other settings at their defaults (5 s dead-peer timeout, no secret,
    /// attempt 0, the first start-up report after 30 s,
    /// listening for peers where the store is reached).
    pub fn new(rank: usize, world_size: usize, master: &str, timeout: Duration) -> MeshConfig {
        MeshConfig {
            rank,
            world_size,
            master: master.to_string(),
            timeout,
            dead_peer_timeout: Duration::from_secs(5),
            auth_token: None,
            store_listener: None,
            attempt: 0,
            startup_report: DEFAULT_STARTUP_REPORT,
            socket_ifname: None,
        }
    }

    /// Checks that the settings can describe a group.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let config = ringccl_rendezvous::MeshConfig::new(4, 4, "h:1", Duration::from_secs(1));
    /// assert!(config.validate().is_err());
    /// let mut config = ringccl_rendezvous::MeshConfig::new(0, 4, "h:1", Duration::from_secs(1));
    /// config.socket_ifname = Some("eth0,^lo".into()); // `^` only opens the list
    /// assert!(config.validate().is_err());
    /// config.socket_ifname = Some("^lo,docker".into());
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), SetupError> {
        if self.world_size == 0 {
            return Err(SetupError::InvalidArgument(
                "world_size must be at least 1".into(),
            ));
        }
        if self.rank >= self.world_size {
            return Err(SetupError::InvalidArgument(format!(
                "rank {} is out of range for world_size {} (ranks are 0..{})",
                self.rank, self.world_size, self.world_size
            )));
        }
        if self.timeout.is_zero() {
            return Err(SetupError::InvalidArgument(
                "timeout must be positive".into(),
            ));
        }
        if self.startup_report.is_zero() {
            return Err(SetupError::InvalidArgument(
                "startup_report must be positive".into(),
            ));
        }
        if let Some(spec) = &self.socket_ifname {
            if let Err(e) = spec.parse::<InterfaceSpec>() {
                return Err(SetupError::InvalidArgument(format!(
                    "socket_ifname (RINGCCL_SOCKET_IFNAME) {spec:?}: {e}"
                )));
            }
        }
        if self.store_listener.is_some() && self.rank != 0 {
            return Err(SetupError::InvalidArgument(format!(
                "only rank 0 hosts the store, but rank {} was given a store listener",
                self.rank
            )));
        }
        Ok(())
    }
}
