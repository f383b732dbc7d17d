//! The spin window every transport shares (TCP, shared memory, in memory): how long a
//! wait looks for its peer without sleeping (`RINGCCL_SPIN_US`). While every rank on the host can have a core, the wait
//! spins between looks. When the ranks outnumber the cores, a spinning rank would only
//! delay the peer it waits for, which may need that very core: the wait then gives the
//! core away (`sched_yield`) between looks, so the peer runs at once if it can, and the
//! wake-up from sleep (a futex or `poll(2)` hop through the scheduler) is saved when the
//! answer comes within the window.

use std::io;
use std::time::{Duration, Instant};

/// How long a wait spins before it sleeps, unless told otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// The longest spin window accepted (`RINGCCL_SPIN_US`): beyond it, sleeping is cheaper.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

/// How a wait passes its spin window.
///
/// ```
/// use std::time::{Duration, Instant};
/// use ringccl_collectives::spin::Spin;
///
/// // Three ranks on two cores: they yield between looks.
/// let spin = Spin::new(Duration::from_millis(5), 3, 2);
/// assert!(spin.yields);
/// let deadline = Instant::now() + Duration::from_secs(5);
/// assert!(spin.look(deadline, 32, || Ok(true))?); // there at the first look
/// let started = Instant::now();
/// assert!(!spin.look(deadline, 32, || Ok(false))?); // never there: the window passes
/// assert!(started.elapsed() >= Duration::from_millis(5));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spin {
    /// How long it looks before it sleeps.
    pub window: Duration,
    /// Whether it gives its core away between looks (the host is oversubscribed).
    pub yields: bool,
}

impl Spin {
    /// The spin window for `ranks` ranks on a host with `cores` cores: `wanted`, at most
    /// [`MAX_SPIN`], yielding between looks when the ranks outnumber the cores.
    pub fn new(wanted: Duration, ranks: usize, cores: usize) -> Spin {
        Spin {
            window: wanted.min(MAX_SPIN),
            yields: ranks > cores,
        }
    }

    /// No spinning: every wait sleeps at once.
    pub const NONE: Spin = Spin {
        window: Duration::ZERO,
        yields: false,
    };

    /// Between two looks: a spin-loop hint, or the core given away.
    #[inline]
    pub fn pause(self) {
        if self.yields {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// How many looks go between two readings of the clock, `spinning` when spinning
    /// (a yield takes long enough to read it every time).
    #[inline]
    fn looks_per_clock(self, spinning: u32) -> u32 {
        if self.yields {
            1
        } else {
            spinning
        }
    }

    /// Looks with `ready` until it holds (`Ok(true)`), or until the window or `deadline`
    /// has passed (`Ok(false)`), pausing between looks. The clock is read every
    /// `looks_per_clock` looks while spinning (after every look while yielding), the
    /// window counted from the first reading: a wait that ends within the first looks
    /// never reads it (on some virtual machines a reading costs 30 ns, a good part of a
    /// small call).
    #[inline]
    pub fn look(
        self,
        deadline: Instant,
        looks_per_clock: u32,
        mut ready: impl FnMut() -> io::Result<bool>,
    ) -> io::Result<bool> {
        if ready()? {
            return Ok(true);
        }
        if self.window.is_zero() {
            return Ok(false);
        }
        let every = self.looks_per_clock(looks_per_clock).max(1);
        let mut until = None;
        let mut looks = 0u32;
        loop {
            self.pause();
            if ready()? {
                return Ok(true);
            }
            looks = looks.wrapping_add(1);
            if looks % every == 0 {
                let now = Instant::now();
                if now >= *until.get_or_insert_with(|| (now + self.window).min(deadline)) {
                    return Ok(false);
                }
            }
        }
    }
}

/// The cores this process may run on (its affinity and CPU quota), 1 if unknown.
///
/// ```
/// assert!(ringccl_collectives::spin::host_cores() >= 1);
/// ```
pub fn host_cores() -> usize {
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

    #[test]
    fn a_look_ends_when_ready_or_when_the_window_has_passed() {
        for yields in [false, true] {
            let spin = Spin {
                window: Duration::from_millis(5),
                yields,
            };
            let far = Instant::now() + Duration::from_secs(60);
            // A window no loaded machine runs ten looks past.
            let patient = Spin {
                window: Duration::from_secs(30),
                yields,
            };
            let mut looks = 0;
            let found = patient.look(far, 32, || {
                looks += 1;
                Ok(looks == 10)
            });
            assert!(found.unwrap(), "yields={yields}");
            let started = Instant::now();
            assert!(!spin.look(far, 32, || Ok(false)).unwrap());
            let took = started.elapsed();
            assert!(took >= spin.window, "yields={yields}: {took:?}");
            let failing = spin.look(far, 32, || Err(io::ErrorKind::Other.into()));
            assert!(failing.is_err());
        }
        let none = Spin::new(Duration::ZERO, 2, 2);
        let mut looks = 0;
        let found = none.look(Instant::now(), 32, || {
            looks += 1;
            Ok(false)
        });
        assert_eq!((found.unwrap(), looks), (false, 1), "no window: one look");
    }
}
