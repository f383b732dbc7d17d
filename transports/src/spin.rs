//! The spin window both transports share: how long a wait looks for its peer without
//! sleeping (`RINGCCL_SPIN_US`). While every rank on the host can have a core, the wait
//! spins between looks. When the ranks outnumber the cores, a spinning rank would only
//! delay the peer it waits for, which may need that very core: the wait then gives the
//! core away (`sched_yield`) between looks, so the peer runs at once if it can, and the
//! wake-up from sleep (a futex or `poll(2)` hop through the scheduler) is saved when the
//! answer comes within the window.

use std::time::Duration;

/// How long a wait spins before it sleeps, unless told otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// The longest spin window accepted (`RINGCCL_SPIN_US`): beyond it, sleeping is cheaper.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

/// How a wait passes its spin window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spin {
    /// How long it looks before it sleeps.
    pub(crate) window: Duration,
    /// Whether it gives its core away between looks (the host is oversubscribed).
    pub(crate) yields: bool,
}

impl Spin {
    /// The spin window for `ranks` ranks on a host with `cores` cores: `wanted`, at most
    /// [`MAX_SPIN`], yielding between looks when the ranks outnumber the cores.
    pub(crate) fn new(wanted: Duration, ranks: usize, cores: usize) -> Spin {
        Spin {
            window: wanted.min(MAX_SPIN),
            yields: ranks > cores,
        }
    }

    /// Between two looks: a spin-loop hint, or the core given away.
    #[inline]
    pub(crate) fn pause(self) {
        if self.yields {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// How many looks go between two readings of the clock, `spinning` when spinning
    /// (a yield takes long enough to read it every time).
    #[inline]
    pub(crate) fn looks_per_clock(self, spinning: u32) -> u32 {
        if self.yields {
            1
        } else {
            spinning
        }
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
    fn ranks_spin_only_while_each_has_a_core_and_yield_beyond() {
        let us = Duration::from_micros;
        let spin = |window, yields| Spin { window, yields };
        assert_eq!(Spin::new(us(50), 2, 2), spin(us(50), false));
        assert_eq!(Spin::new(us(50), 1, 1), spin(us(50), false));
        assert_eq!(
            Spin::new(us(50), 3, 2),
            spin(us(50), true),
            "oversubscribed"
        );
        assert_eq!(Spin::new(Duration::ZERO, 2, 8), spin(Duration::ZERO, false));
        assert_eq!(
            Spin::new(Duration::from_secs(1), 2, 8),
            spin(MAX_SPIN, false)
        );
        assert_eq!(Spin::new(us(50), 3, 2).looks_per_clock(32), 1);
        assert!(host_cores() >= 1);
    }
}
