//! The clock that times the end of every call: the CPU's tick counter (through quanta),
//! about three times cheaper to read than [`Instant::now`](std::time::Instant::now) in a
//! VM, turned into Unix microseconds against an anchor taken from the precise clock.
//!
//! The counter's rate is calibrated once per process, so it drifts from the precise
//! clock by its calibration error (parts per million). The anchor is therefore taken
//! again whenever [`REANCHOR_AFTER_NS`] have passed since the last one: the end times
//! then never stray from the issue times, read from the precise clock, by more than that
//! window times the error (microseconds), however long the job runs.

use std::sync::OnceLock;

/// How long an anchor serves (nanoseconds by the tick counter).
pub(crate) const REANCHOR_AFTER_NS: u64 = 100_000_000;

/// The process's tick counter, calibrated on first use (under a millisecond).
fn counter() -> &'static quanta::Clock {
    static COUNTER: OnceLock<quanta::Clock> = OnceLock::new();
    COUNTER.get_or_init(quanta::Clock::new)
}

/// See the module documentation. One per recorder, read under its lock.
#[derive(Debug)]
pub(crate) struct TickClock {
    counter: &'static quanta::Clock,
    /// The counter's value when the anchor was taken, and the precise time then.
    ticks: u64,
    us: u64,
}

impl TickClock {
    /// A clock anchored at `now_us`, the precise time now.
    pub(crate) fn new(now_us: u64) -> TickClock {
        let counter = counter();
        TickClock {
            counter,
            ticks: counter.raw(),
            us: now_us,
        }
    }

    /// Now, in Unix microseconds. `precise_us` reads the precise clock, for when the
    /// anchor is due again.
    #[inline]
    pub(crate) fn now_us(&mut self, precise_us: impl FnOnce() -> u64) -> u64 {
        let ticks = self.counter.raw();
        let since_ns = self.counter.delta_as_nanos(self.ticks, ticks);
        if since_ns < REANCHOR_AFTER_NS {
            return self.us.saturating_add(since_ns / 1000);
        }
        self.ticks = ticks;
        self.us = precise_us();
        self.us
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn ticks_follow_the_precise_clock_and_take_it_again_when_due() {
        let start = Instant::now();
        let precise = move || start.elapsed().as_micros() as u64;
        let mut clock = TickClock::new(precise());
        std::thread::sleep(Duration::from_millis(20));
        let by_ticks = clock.now_us(precise); // by the anchor, unless the sleep overran
        let truth = precise();
        assert!(
            by_ticks.abs_diff(truth) < 2_000,
            "ticks say {by_ticks} us, the precise clock {truth} us"
        );
        std::thread::sleep(Duration::from_millis(120));
        let mut anchored = false;
        let at = clock.now_us(|| {
            anchored = true;
            precise()
        });
        assert!(anchored, "an anchor is due after 140 ms");
        assert!(at.abs_diff(precise()) < 1_000);
    }
}
