//! Binding the store's listening socket.

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};

use crate::SetupError;

/// Resolves a `"host:port"` string (IPv6 hosts in brackets, e.g. `"[::1]:29500"`).
pub fn resolve(master: &str) -> io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = master.to_socket_addrs()?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{master:?} resolves to no address"),
        ));
    }
    Ok(addrs)
}

/// The listening socket of the rendezvous store, bound before the process group is
/// created.
///
/// Rank 0 normally binds `MASTER_ADDR:MASTER_PORT` itself. Binding first is useful when
/// the port must be chosen by the OS (bind port 0, then hand the real port to the other
/// ranks), as tests and launchers do.
///
/// ```
/// use ringccl_rendezvous::StoreListener;
/// let listener = StoreListener::bind("127.0.0.1:0")?;
/// assert_ne!(listener.local_addr()?.port(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct StoreListener {
    pub(crate) inner: TcpListener,
}

impl StoreListener {
    /// Binds exactly `addr` (`"host:port"`); never every interface unless `addr` says so.
    pub fn bind(addr: &str) -> Result<StoreListener, SetupError> {
        let candidates = resolve(addr).map_err(|source| SetupError::StoreBind {
            addr: addr.to_string(),
            reason:
                "cannot resolve the address; MASTER_ADDR must be a host name or IP of this machine"
                    .into(),
            source,
        })?;
        let mut last = None;
        for candidate in candidates {
            match TcpListener::bind(candidate) {
                Ok(inner) => return Ok(StoreListener { inner }),
                Err(e) => last = Some((candidate, e)),
            }
        }
        let (candidate, source) = match last {
            Some(pair) => pair,
            None => unreachable_bind(addr),
        };
        let reason = match source.kind() {
            io::ErrorKind::AddrInUse => format!(
                "port {} is already in use (another job, or a previous run still exiting?); choose another MASTER_PORT",
                candidate.port()
            ),
            io::ErrorKind::AddrNotAvailable => format!(
                "{} is not an address of this machine; rank 0 must run on the host MASTER_ADDR names",
                candidate.ip()
            ),
            io::ErrorKind::PermissionDenied => format!(
                "no permission to bind port {}; choose a MASTER_PORT above 1023",
                candidate.port()
            ),
            _ => format!("binding {candidate} failed"),
        };
        Err(SetupError::StoreBind {
            addr: addr.to_string(),
            reason,
            source,
        })
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

fn unreachable_bind(addr: &str) -> (SocketAddr, io::Error) {
    // `resolve` never returns an empty list; keep a well-formed error anyway.
    (
        SocketAddr::from(([0, 0, 0, 0], 0)),
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{addr:?} resolves to no address"),
        ),
    )
}

impl fmt::Debug for StoreListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreListener")
            .field("local_addr", &self.inner.local_addr().ok())
            .finish()
    }
}
