//! Dumps on request, and for ranks that sat idle while a peer aborted the group.
//!
//! When a group is made with a flight directory (`RINGCCL_FLIGHT_DIR`), the process
//! starts listening for `SIGUSR1`: signal-hook's handler writes a byte to a socket pair,
//! and one thread (`ringccl-flight`) reads it and writes every live group's dump, reason
//! `"requested"`. `ringrun` sends it to each rank's pid; so can a user (`kill -USR1 PID`).
//! The same thread looks every [`WATCH_EVERY`] for groups a peer has aborted while this
//! rank ran no call, and writes their dumps. Without a flight directory nothing is
//! installed: `SIGUSR1` keeps its default action.

use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use super::recorder::FlightRecorder;

/// How often the request thread looks for groups aborted by a peer.
pub const WATCH_EVERY: Duration = Duration::from_millis(200);

/// Every recorder with a flight directory, while it lives.
static LIVE: Mutex<Vec<Weak<FlightRecorder>>> = Mutex::new(Vec::new());
/// Whether the signal handler and its thread run (or why not).
static LISTENING: OnceLock<Result<(), String>> = OnceLock::new();

/// Adds `recorder` to the groups whose dumps a request writes; the first one starts the
/// listener.
pub(crate) fn register(recorder: &Arc<FlightRecorder>) {
    let listening = LISTENING.get_or_init(|| {
        listen().map_err(|e| {
            tracing::warn!(error = %e, "cannot listen for SIGUSR1 (flight recorder dump requests)");
            e.to_string()
        })
    });
    if listening.is_err() {
        tracing::debug!("flight recorder dumps are written on errors only: no SIGUSR1 listener");
    }
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|weak| weak.strong_count() > 0);
    live.push(Arc::downgrade(recorder));
}

fn live_recorders() -> Vec<Arc<FlightRecorder>> {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|weak| weak.strong_count() > 0);
    live.iter().filter_map(Weak::upgrade).collect()
}

/// Writes the dump of every live group of this process that has a flight directory, for
/// `reason`; returns the files written. This is what `SIGUSR1` does, with `"requested"`.
///
/// ```
/// // No group with a flight directory in this process: nothing to write.
/// assert!(ringccl_observe::flight::dump_all("requested").is_empty());
/// ```
pub fn dump_all(reason: &str) -> Vec<PathBuf> {
    live_recorders()
        .iter()
        .filter_map(|recorder| recorder.dump(reason))
        .collect()
}

fn listen() -> io::Result<()> {
    let (read, write) = UnixStream::pair()?;
    read.set_read_timeout(Some(WATCH_EVERY))?;
    let id = signal_hook::low_level::pipe::register(signal_hook::consts::SIGUSR1, write)?;
    let spawned = thread::Builder::new()
        .name("ringccl-flight".into())
        .spawn(move || serve(read));
    if let Err(e) = spawned {
        signal_hook::low_level::unregister(id);
        return Err(e);
    }
    tracing::debug!("flight recorder: SIGUSR1 writes every group's dump");
    Ok(())
}

fn serve(mut requests: UnixStream) {
    let mut bytes = [0u8; 64];
    loop {
        match requests.read(&mut bytes) {
            Ok(0) => return,
            Ok(_) => {
                let written = dump_all("requested");
                tracing::info!(
                    files = written.len(),
                    "SIGUSR1: wrote the flight recorder's dumps"
                );
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                tracing::warn!(error = %e, "flight recorder: reading dump requests failed");
                thread::sleep(WATCH_EVERY);
            }
        }
        for recorder in live_recorders() {
            recorder.dump_if_aborted();
        }
    }
}
