//! Collective schedules as plain data: which element ranges go to which peer, in which
//! order, and what to do with what arrives.
//!
//! Everything here is pure and deterministic. A [`Schedule`] is computed per call from
//! `(rank, world_size, count, element size)`, and every rank computes the matching half of
//! every exchange: for each ordered pair of ranks (a, b), the sizes of a's sends to b are
//! exactly the sizes of b's receives from a, in the same order. The tests check that
//! property and run all ranks' schedules in a simulator.

use std::ops::Range;

mod all_to_all;
mod barrier;
mod broadcast;
mod halving_doubling;
mod hierarchical;
mod point_to_point;
mod power_of_two_core;
mod recursive_doubling;
mod ring;

pub use all_to_all::pairwise_all_to_all;
pub use barrier::{dissemination_barrier, gather_release_barrier};
pub use broadcast::{binomial_tree_broadcast, chain_broadcast};
pub use halving_doubling::halving_doubling_all_reduce;
pub use hierarchical::{hierarchical_all_reduce, hierarchical_barrier, hierarchical_broadcast};
pub use point_to_point::{recv_from, send_to};
pub use recursive_doubling::recursive_doubling_all_reduce;
pub use ring::{
    ring_all_gather, ring_all_reduce, ring_order, ring_over, ring_reduce, ring_reduce_scatter,
    RingCollective,
};

/// What a rank does with a received range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvAction {
    /// Copy it into the caller's buffer (received straight into place).
    Store,
    /// Combine it into the caller's buffer with the reduction operator. `last` marks the
    /// final reduction of that range: after it this rank holds the range's complete
    /// result (where a mean divides by the world size).
    Reduce {
        /// Whether this is the range's final reduction.
        last: bool,
        /// Whether the received value is the left operand (`incoming (op) local`) rather
        /// than the right one. Schedules fix the order so that every rank combines the
        /// same operands the same way.
        incoming_first: bool,
    },
}

/// Send an element range of the caller's buffer to a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendStep {
    /// Destination rank.
    pub peer: usize,
    /// Elements of the caller's buffer to send.
    pub range: Range<usize>,
    /// Index into [`Schedule::recvs`] that must complete before this send may start.
    pub after_recv: Option<usize>,
}

/// Receive an element range from a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvStep {
    /// Source rank.
    pub peer: usize,
    /// Elements of the caller's buffer the data is for.
    pub range: Range<usize>,
    /// What to do with the data.
    pub action: RecvAction,
    /// Index into [`Schedule::sends`] that must complete before the received data may
    /// be written into the caller's buffer (a `Store` does not start before it; a
    /// `Reduce` may arrive in scratch space first). Guards ranges that are sent and
    /// received in the same step.
    pub after_send: Option<usize>,
}

/// One rank's part of one collective. Sends run in order, receives run in order, and the
/// two streams overlap except where a send waits for a receive (`after_recv`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Sends, in order.
    pub sends: Vec<SendStep>,
    /// Receives, in order.
    pub recvs: Vec<RecvStep>,
}

impl Schedule {
    /// Largest number of elements received with [`RecvAction::Reduce`] in one step: the
    /// scratch space the executor needs.
    pub fn max_reduce_len(&self) -> usize {
        self.recvs
            .iter()
            .filter(|r| matches!(r.action, RecvAction::Reduce { .. }))
            .map(|r| r.range.len())
            .max()
            .unwrap_or(0)
    }
}

/// Whether two element ranges share an element.
pub(crate) fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// The latest of `recvs[from..]` that writes any element of `range`: the receive a send
/// of `range` must wait for (receives complete in order, so every earlier one is done
/// then).
pub(crate) fn latest_recv_writing(
    recvs: &[RecvStep],
    from: usize,
    range: &Range<usize>,
) -> Option<usize> {
    let later = recvs.get(from..)?;
    let at = later.iter().rposition(|r| overlap(&r.range, range))?;
    Some(from + at)
}

/// The `index`-th of `parts` nearly equal, contiguous pieces of `0..count`: the first
/// `count % parts` pieces are one element longer.
pub fn segment(count: usize, parts: usize, index: usize) -> Range<usize> {
    debug_assert!(parts > 0 && index < parts);
    let base = count / parts;
    let extra = count % parts;
    let start = index * base + index.min(extra);
    let len = base + usize::from(index < extra);
    start..start + len
}

/// [`segment`] in bytes, for elements of `elem_size` bytes.
pub(crate) fn byte_segment(
    count: usize,
    parts: usize,
    index: usize,
    elem_size: usize,
) -> Range<usize> {
    let elements = segment(count, parts, index);
    elements.start * elem_size..elements.end * elem_size
}

/// Cuts `range` into the fewest nearly equal chunks of at most `max_chunk_bytes` bytes
/// each (at least one element per chunk). An empty range has no chunks.
pub fn chunks(
    range: Range<usize>,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> impl Iterator<Item = Range<usize>> {
    let len = range.len();
    let max_elems = (max_chunk_bytes / elem_size.max(1)).max(1);
    let parts = len.div_ceil(max_elems);
    (0..parts).map(move |i| {
        let piece = segment(len, parts, i);
        range.start + piece.start..range.start + piece.end
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_tile_the_buffer() {
        for count in [0usize, 1, 2, 7, 8, 9, 1000003] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let s = segment(count, parts, i);
                    assert_eq!(s.start, next);
                    assert!(s.len() == count / parts || s.len() == count / parts + 1);
                    next = s.end;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn chunks_respect_the_cap_and_tile_the_range() {
        for (range, elem, cap) in [
            (0..0, 4, 16),
            (3..3, 4, 16),
            (5..6, 8, 1),
            (10..1000, 4, 64),
            (0..1000003, 2, 1 << 20),
            (7..100, 4, 400),
        ] {
            let list: Vec<_> = chunks(range.clone(), elem, cap).collect();
            let mut next = range.start;
            for c in &list {
                assert_eq!(c.start, next);
                assert!(!c.is_empty());
                assert!(c.len() * elem <= cap.max(elem));
                next = c.end;
            }
            assert_eq!(next, range.end);
            if !range.is_empty() {
                let min_parts = (range.len() * elem).div_ceil(cap.max(elem));
                assert_eq!(list.len(), min_parts, "{range:?} {elem} {cap}");
            }
        }
    }
}
