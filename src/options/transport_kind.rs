//! Which transport the CPU backend uses, by name.

use crate::Error;

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
