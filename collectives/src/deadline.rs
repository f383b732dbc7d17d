//! A call's deadline: fixed when the call is issued, then passed down as data.

use std::time::{Duration, Instant};

/// When one call must be finished by, and the timeout it was computed from (which the
/// error names when it passes).
///
/// `ProcessGroup` makes one per call at the moment the call is issued (so time spent
/// queued behind earlier calls counts), and every layer below receives it as an
/// argument: no layer keeps a "current timeout" of its own.
///
/// ```
/// use std::time::Duration;
/// use ringccl_collectives::Deadline;
///
/// let deadline = Deadline::after(Duration::from_secs(5));
/// assert_eq!(deadline.timeout(), Duration::from_secs(5));
/// assert!(!deadline.has_passed());
/// assert!(deadline.remaining() <= Duration::from_secs(5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// The deadline `timeout` from now. A timeout too large to represent (e.g.
    /// `Duration::MAX`) means about a century.
    pub fn after(timeout: Duration) -> Deadline {
        let now = Instant::now();
        let at = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        Deadline { at, timeout }
    }

    /// The instant it passes.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The timeout it was computed from.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Time left (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether it has passed.
    pub fn has_passed(&self) -> bool {
        Instant::now() >= self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enormous_timeout_does_not_overflow() {
        let d = Deadline::after(Duration::MAX);
        assert_eq!(d.timeout(), Duration::MAX);
        assert!(d.remaining() > Duration::from_secs(365 * 24 * 3600));
    }

    #[test]
    fn a_zero_timeout_has_passed_at_once() {
        let d = Deadline::after(Duration::ZERO);
        assert!(d.has_passed());
        assert_eq!(d.remaining(), Duration::ZERO);
    }
}
