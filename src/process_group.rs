//! The typed, user-facing handle on a group of ranks.

use ringccl_collectives::{Backend, BufferMut, Element, Error, HostBackend, HostConfig, ReduceOp};
use ringccl_transports::{connect_mesh, InitOptions};

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
    match backend.trim().to_ascii_lowercase().as_str() {
        "gloo" => {
            opts.validate()?;
            let mut config = HostConfig {
                timeout: opts.get_timeout(),
                ..HostConfig::default()
            };
            if let Some(chunk) = opts.get_chunk_bytes() {
                config.chunk_bytes = chunk;
            }
            let transport = connect_mesh(opts)?;
            Ok(ProcessGroup::from_backend(Box::new(HostBackend::new(
                "gloo", transport, config,
            ))))
        }
        "nccl" => Err(Error::BackendUnavailable {
            backend: "nccl",
            reason: "this build of ringccl has no NCCL backend yet; use \"gloo\" (CPU over TCP)"
                .into(),
        }),
        _ => Err(Error::UnknownBackend {
            name: backend.to_string(),
            valid: BACKENDS,
        }),
    }
}

/// One rank's handle on a group of processes that run collectives together.
///
/// `Send + Sync`: it can be shared between threads (calls are serialised). Every method
/// is collective: all ranks must call the same methods, in the same order, with matching
/// arguments; a rank that disagrees gets [`Error::CollectiveMismatch`] instead of a hang.
#[derive(Debug)]
pub struct ProcessGroup {
    backend: Box<dyn Backend>,
}

impl ProcessGroup {
    /// Wraps any backend implementation.
    pub fn from_backend(backend: Box<dyn Backend>) -> ProcessGroup {
        ProcessGroup { backend }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.backend.rank()
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.backend.world_size()
    }

    /// The backend's name (`"gloo"` or `"nccl"`).
    pub fn backend(&self) -> &str {
        self.backend.name()
    }

    /// The type-erased backend underneath.
    pub fn as_backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Reduces `buf` element-wise across all ranks with `op`; every rank ends with the
    /// bit-identical result. `Avg` works on float types only.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), Error> {
        self.backend.all_reduce(BufferMut::from_slice(buf), op)
    }

    /// Copies rank `root`'s `buf` into every rank's `buf`.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<(), Error> {
        self.backend.broadcast(BufferMut::from_slice(buf), root)
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&self) -> Result<(), Error> {
        self.backend.barrier()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn process_group_is_send_and_sync() {
        assert_send_sync::<ProcessGroup>();
    }
}
