//! Timestamps for the trace: microseconds since the Unix epoch, so that the files of
//! different ranks (and, with synchronised clocks, different hosts) line up, while spans
//! are measured with the monotonic clock.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// One reading of both clocks, taken once per process.
struct Anchor {
    instant: Instant,
    unix_ns: u128,
}

fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| Anchor {
        instant: Instant::now(),
        // A clock set before 1970 reads as the epoch: spans still line up in this process.
        unix_ns: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    })
}

/// `at` as microseconds since the Unix epoch, fractional (an f64 resolves about a
/// quarter of a microsecond at today's dates; durations are computed apart, to the
/// nanosecond). Instants before the process's anchor count back from it.
pub(crate) fn unix_micros(at: Instant) -> f64 {
    let anchor = anchor();
    let ns = match at.checked_duration_since(anchor.instant) {
        Some(after) => anchor.unix_ns.saturating_add(after.as_nanos()),
        None => anchor
            .unix_ns
            .saturating_sub(anchor.instant.duration_since(at).as_nanos()),
    };
    ns as f64 / 1000.0
}

/// Makes sure the anchor is taken (called when a trace file opens, so later readings
/// need no initialisation).
pub(crate) fn start() {
    let _ = anchor();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn micros_follow_the_monotonic_clock_and_the_wall_clock() {
        let a = Instant::now();
        let b = a + Duration::from_micros(1500);
        let (ua, ub) = (unix_micros(a), unix_micros(b));
        // An f64 holds today's epoch microseconds to a quarter of a microsecond.
        assert!((ub - ua - 1500.0).abs() <= 0.5, "{ua} {ub}");
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as f64;
        assert!((ua - wall).abs() < 5e6, "{ua} vs {wall}");
    }
}
