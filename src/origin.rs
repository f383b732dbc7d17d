//! How a group was made, kept for the life of the group so that the groups formed from
//! it ([`ProcessGroup::new_group`](crate::ProcessGroup::new_group),
//! [`ProcessGroup::split`](crate::ProcessGroup::split)) meet through the same store and
//! are made the same way.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use ringccl_collectives::HostConfig;
use ringccl_observe::flight::FlightConfig;
use ringccl_observe::timeline::TraceFile;
use ringccl_observe::Observers;
use ringccl_rendezvous::{KeptStore, MeshConfig};

use crate::observers::observers;
use crate::options::TransportKind;

/// How a group was made, kept to form groups from it.
pub(crate) struct Origin {
    /// The rendezvous store the new groups meet through.
    pub(crate) store: KeptStore,
    pub(crate) recipe: Arc<GlooRecipe>,
    /// How many groups this group has formed so far (the next one's serial number).
    pub(crate) formed: AtomicU64,
}

/// What a `"gloo"` group was made with, kept so that the groups formed from it are made
/// the same way.
#[derive(Debug)]
pub(crate) struct GlooRecipe {
    pub(crate) config: HostConfig,
    pub(crate) kind: TransportKind,
    /// The rendezvous settings; rank and world size are the original group's.
    pub(crate) mesh: MeshConfig,
    /// Where the groups' flight recorders write, and how many calls they keep (each
    /// group names its own group and transport).
    pub(crate) flight: FlightConfig,
    /// How long a wait spins (shared memory) or busy-polls (TCP) before it sleeps.
    pub(crate) spin: Duration,
    /// This rank's trace file, shared by the groups formed from this one.
    pub(crate) trace: Option<Arc<TraceFile>>,
}

impl GlooRecipe {
    /// What watches rank `rank` of the group of `world_size` named `group` over
    /// `transport`: its flight recorder and, when this rank writes a trace, the row
    /// `row` of it.
    pub(crate) fn observers(
        &self,
        (rank, world_size): (usize, usize),
        group: &str,
        row: &str,
        transport: &'static str,
    ) -> Arc<Observers> {
        let flight = FlightConfig {
            group: group.into(),
            transport,
            ..self.flight.clone()
        };
        let trace = self.trace.as_ref().map(|file| (file, row));
        observers((rank, world_size), "gloo", flight, trace)
    }

    /// The rendezvous settings for rank `rank` of a group of `world_size`.
    pub(crate) fn mesh_config(&self, rank: usize, world_size: usize) -> MeshConfig {
        let mut config = MeshConfig::new(rank, world_size, &self.mesh.master, self.mesh.timeout);
        config.dead_peer_timeout = self.mesh.dead_peer_timeout;
        config.auth_token = self.mesh.auth_token.clone();
        config.attempt = self.mesh.attempt;
        config.socket_ifname = self.mesh.socket_ifname.clone();
        config
    }
}
