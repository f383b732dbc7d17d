//! Joining the NCCL communicator: rendezvous, the unique id through the store, and a
//! bounded wait for every rank to join.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, DriverError};
use ringccl_collectives::{Deadline, GroupRunner, OpDesc};

use super::engine::NcclEngine;
use super::ffi::{self, Progress, RawComm, UNIQUE_ID_LEN};
use super::poller::{Cx, Involved};
use super::probe::probe;
use super::NcclBackend;
use crate::{DeviceError, NcclConfig};
use ringccl_rendezvous::{connect_mesh, Mesh, SetupError};
use ringccl_transports::{ControlLink, TcpTransport};

const ID_KEY: &str = "ringccl/nccl/id";

/// See [`NcclBackend::connect`].
pub(super) fn connect(config: NcclConfig) -> Result<NcclBackend, DeviceError> {
    let NcclConfig {
        mesh,
        device,
        local_rank,
        hooks,
    } = config;
    mesh.validate()?;
    let device_count = probe()?;
    let rank = mesh.rank;
    let world_size = mesh.world_size;
    let timeout = mesh.timeout;
    let device = match device {
        Some(d) if d >= device_count => {
            return Err(SetupError::InvalidArgument(format!(
                "rank {rank}: CUDA device {d} was requested but only {device_count} \
                 device(s) are visible (after CUDA_VISIBLE_DEVICES)"
            ))
            .into())
        }
        Some(d) => d,
        None => local_rank.unwrap_or(rank) % device_count,
    };
    let startup_error = |call: &str, reason: String| DeviceError::Call {
        rank,
        op: format!("NCCL start-up on cuda:{device}"),
        call: call.to_string(),
        reason,
    };
    let driver = |call: &'static str| move |e: DriverError| startup_error(call, e.to_string());
    let ctx = CudaContext::new(device).map_err(driver("creating the CUDA context"))?;
    let stream = ctx
        .new_stream()
        .map_err(driver("creating the NCCL stream"))?;

    let deadline = Deadline::after(timeout);
    let mut mesh = connect_mesh(mesh)?;
    mesh.startup_step("sharing NCCL's unique id");
    let id = share_unique_id(&mut mesh, rank, deadline.at())?;
    let dead_peer = mesh.dead_peer_timeout();
    let (connections, store) = mesh.finish(deadline.at())?;
    let control_connections = connections.control;
    let peers =
        TcpTransport::new(rank, connections.data, dead_peer).map_err(|source| SetupError::Io {
            rank,
            context: "configuring the liveness connections".into(),
            source,
        })?;

    ctx.bind_to_thread()
        .map_err(driver("binding the CUDA context"))?;
    let comm = RawComm::start_init(world_size, rank, &id)
        .map_err(|code| startup_error("ncclCommInitRankConfig", code.describe()))?;
    let op = OpDesc::barrier(0);
    let cx = Cx {
        rank,
        world_size,
        comm: &comm,
        stream: &stream,
        peers: &peers,
        op: &op,
        involved: Involved::All,
        deadline,
        control: None,
    };
    let joined = cx.poll(|| {
        Ok(comm
            .async_status()
            .map_err(|c| cx.nccl("ncclCommInitRankConfig", c))?
            == Progress::Done)
    });
    if let Err(e) = joined {
        comm.abort();
        return Err(match DeviceError::from(e) {
            DeviceError::Timeout { .. } => SetupError::RendezvousTimeout {
                rank,
                waiting_for: "every rank to join the NCCL communicator".into(),
                timeout,
            }
            .into(),
            other => other,
        });
    }
    let engine = NcclEngine::new(rank, world_size, comm, Arc::clone(&stream), peers, timeout);
    let mut group = GroupRunner::with_engine("nccl", rank, world_size, timeout, engine);
    group.attach_hooks(hooks);
    // The TCP side of an abort: peers hear of it even while NCCL is stuck.
    let link = ControlLink::start(
        rank,
        control_connections,
        dead_peer,
        Arc::clone(group.control()),
    )
    .map_err(|source| SetupError::Io {
        rank,
        context: "starting the control thread".into(),
        source,
    })?;
    group.keep_control_link(Box::new(link));
    tracing::info!(
        rank,
        world_size,
        backend = "nccl",
        device,
        timeout = ?timeout,
        "process group ready (collectives run in NCCL; the TCP mesh carries liveness and control)"
    );
    Ok(NcclBackend {
        group: Arc::new(group),
        device,
        stream,
        _store: store,
    })
}

/// Rank 0 makes the unique id (or records why it could not); the others read it.
fn share_unique_id(
    mesh: &mut Mesh,
    rank: usize,
    deadline: Instant,
) -> Result<[u8; UNIQUE_ID_LEN], DeviceError> {
    let store = mesh.store();
    let raw = if rank == 0 {
        match ffi::new_unique_id() {
            Ok(id) => {
                store.set(ID_KEY, &id)?;
                id.to_vec()
            }
            Err(code) => {
                let reason = format!("ncclGetUniqueId failed: {}", code.describe());
                store.set(ID_KEY, format!("error: {reason}").as_bytes())?;
                return Err(DeviceError::Call {
                    rank,
                    op: "NCCL start-up".into(),
                    call: "ncclGetUniqueId".into(),
                    reason: code.describe(),
                });
            }
        }
    } else {
        store.wait(ID_KEY, deadline, &|| {
            "rank 0 to publish the NCCL unique id".into()
        })?
    };
    raw.as_slice().try_into().map_err(|_| {
        SetupError::Handshake {
            rank,
            peer: "rank 0".into(),
            reason: format!(
                "rank 0 could not start NCCL ({})",
                String::from_utf8_lossy(&raw).trim_start_matches("error: ")
            ),
        }
        .into()
    })
}
