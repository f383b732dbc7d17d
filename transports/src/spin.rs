//! The spin window both transports share: how long a wait looks for its peer without
//! sleeping (`RINGCCL_SPIN_US`), and the rule that no rank spins on a host whose ranks
//! outnumber its cores, where a spinning rank would only delay the peer it waits for.

use std::time::Duration;

/// How long a wait spins before it sleeps, unless told otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// The longest spin window accepted (`RINGCCL_SPIN_US`): beyond it, sleeping is cheaper.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

/// The spin window for `ranks` ranks on a host with `cores` cores: `wanted` (at most
/// [`MAX_SPIN`]) while every rank can have a core, none otherwise.
pub(crate) fn spin_window(wanted: Duration, ranks: usize, cores: usize) -> Duration {
    if ranks > cores {
        Duration::ZERO
    } else {
        wanted.min(MAX_SPIN)
    }
}

/// The cores this process may run on (its affinity and CPU quota), 1 if unknown.
pub(crate) fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_spin_only_while_each_has_a_core() {
        let us = Duration::from_micros;
        assert_eq!(spin_window(us(50), 2, 2), us(50));
        assert_eq!(spin_window(us(50), 1, 1), us(50));
        assert_eq!(spin_window(us(50), 3, 2), Duration::ZERO, "oversubscribed");
        assert_eq!(spin_window(Duration::ZERO, 2, 8), Duration::ZERO);
        assert_eq!(spin_window(Duration::from_secs(1), 2, 8), MAX_SPIN);
        assert!(host_cores() >= 1);
    }
}
