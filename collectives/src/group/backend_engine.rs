//! A backend of the caller's own, run as an engine: the runner's rules (numbering,
//! checks, one abort record, diagnosis) hold for it as for the built-in backends.

use std::fmt;
use std::sync::Arc;

use super::{Engine, GroupRunner, Request};
use crate::control::GroupControl;
use crate::{Backend, Deadline, Error, OpDesc};

/// Any [`Backend`] as an [`Engine`]: each request goes to the backend's own method.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ringccl_collectives::{Backend, BackendEngine, Deadline, HostBackend, HostConfig};
/// # use ringccl_collectives::{MemoryConfig, MemoryTransport};
///
/// # let transport = MemoryTransport::mesh(1, MemoryConfig::default()).remove(0);
/// # let own: Arc<dyn Backend> = Arc::new(HostBackend::new("mine", transport, HostConfig::default()));
/// // `own`: a backend of the caller's own.
/// let group = BackendEngine::runner(own);
/// group.barrier(Deadline::after(Duration::from_secs(5)))?;
/// group.abort("done with it");
/// assert!(group.barrier(Deadline::after(Duration::from_secs(5))).is_err());
/// # Ok::<(), ringccl_collectives::Error>(())
/// ```
pub struct BackendEngine {
    backend: Arc<dyn Backend>,
    control: Option<Arc<GroupControl>>,
}

impl BackendEngine {
    /// A runner around `backend`, with its rank, size, name and default timeout.
    pub fn runner(backend: Arc<dyn Backend>) -> GroupRunner<BackendEngine> {
        let (rank, world_size, timeout) = (backend.rank(), backend.world_size(), backend.timeout());
        let name = backend.name().to_string();
        GroupRunner::with_engine(
            name,
            rank,
            world_size,
            timeout,
            BackendEngine {
                backend,
                control: None,
            },
        )
    }
}

impl Engine for BackendEngine {
    fn execute(
        &mut self,
        _op: &OpDesc,
        request: Request<'_>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let backend = &*self.backend;
        match request {
            Request::AllReduce { buf, op } => backend.all_reduce(buf, op, deadline),
            Request::Broadcast { buf, root } => backend.broadcast(buf, root, deadline),
            Request::Barrier => backend.barrier(deadline),
            Request::Reduce { buf, op, root } => backend.reduce(buf, op, root, deadline),
            Request::AllGather { input, output } => backend.all_gather(input, output, deadline),
            Request::ReduceScatter { input, output, op } => {
                backend.reduce_scatter(input, output, op, deadline)
            }
            Request::AllToAll { input, output } => backend.all_to_all(input, output, deadline),
            Request::Send { buf, peer, tag } => backend.send(buf, peer, tag, deadline),
            Request::Recv { buf, peer, tag } => backend.recv(buf, peer, tag, deadline),
        }
    }

    fn attach(&mut self, control: &Arc<GroupControl>) {
        self.control = Some(Arc::clone(control));
    }

    fn abort(&mut self) {
        let reason = self
            .control
            .as_ref()
            .and_then(|control| control.aborted())
            .map_or_else(|| "the process group was aborted".to_string(), |r| r.reason);
        self.backend.abort(&reason);
    }
}

impl fmt::Debug for BackendEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BackendEngine").field(&self.backend).finish()
    }
}
