//! The largest power-of-two group inside N ranks, which recursive doubling and
//! halving-doubling run on: with `p` the largest power of two ≤ N and `e = N − p`, the
//! first `2e` ranks pair up; each even one hands its buffer to the odd one above it and
//! sits out, and the `p` remaining ranks take virtual ranks `0..p`.

/// See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PowerOfTwoCore {
    /// How many ranks run the core's rounds.
    pub(super) p: usize,
    /// How many ranks sit out (each beside the partner that folds its buffer in).
    extra: usize,
}

impl PowerOfTwoCore {
    /// The core of `n` ranks (`n ≥ 1`).
    pub(super) fn of(n: usize) -> PowerOfTwoCore {
        let p = 1usize << (usize::BITS - 1 - n.max(1).leading_zeros());
        PowerOfTwoCore { p, extra: n - p }
    }

    /// The rank that plays virtual rank `v`.
    pub(super) fn real(self, v: usize) -> usize {
        if v < self.extra {
            2 * v + 1
        } else {
            v + self.extra
        }
    }

    /// `rank`'s virtual rank, or `None` for a rank that sits out (it hands its buffer to
    /// `rank + 1` and gets the result back).
    pub(super) fn virtual_rank(self, rank: usize) -> Option<usize> {
        if rank < 2 * self.extra {
            (rank % 2 == 1).then_some(rank / 2)
        } else {
            Some(rank - self.extra)
        }
    }

    /// Whether `rank`, a rank of the core, folds in the buffer of `rank - 1` (which sits
    /// out) first and hands it the result last.
    pub(super) fn folds_in(self, rank: usize) -> bool {
        rank < 2 * self.extra
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_virtual_rank_is_played_by_exactly_one_rank() {
        for n in 1..=17 {
            let core = PowerOfTwoCore::of(n);
            assert!(core.p.is_power_of_two() && core.p <= n && 2 * core.p > n);
            let played: Vec<_> = (0..n).filter_map(|r| core.virtual_rank(r)).collect();
            assert_eq!(played, (0..core.p).collect::<Vec<_>>(), "n={n}");
            for v in 0..core.p {
                assert_eq!(core.virtual_rank(core.real(v)), Some(v), "n={n}");
            }
            let folding = (0..n).filter(|&r| core.virtual_rank(r).is_some() && core.folds_in(r));
            assert_eq!(folding.count(), n - core.p, "n={n}");
        }
    }
}
