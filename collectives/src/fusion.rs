//! Fusion planning for a fused ("coalesced") all-reduce of many tensors: which pieces of
//! which tensors go into which fusion buffer. Pure and deterministic: every rank plans
//! the same buffers from the same tensor sizes.
//!
//! Not to be confused with `ringccl_ddp::plan_buckets`, which groups whole parameters
//! into gradient buckets (PyTorch DDP's rule) and never splits one.

use std::ops::Range;

/// A contiguous piece of one tensor inside a fusion buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index of the tensor in the caller's list.
    pub tensor: usize,
    /// Elements of that tensor.
    pub range: Range<usize>,
}

/// Packs tensors of `lens` elements, in order, into fusion buffers of at most
/// `bucket_bytes` (at least one element); one `Vec<Piece>` per buffer. Tensors are never
/// reordered; a tensor that does not fit in the space left is split across buffers, so
/// every buffer but the last is full. Empty tensors get no piece.
pub fn plan_fusion(lens: &[usize], elem_size: usize, bucket_bytes: usize) -> Vec<Vec<Piece>> {
    let cap = (bucket_bytes / elem_size.max(1)).max(1);
    let mut buckets = Vec::new();
    let mut current: Vec<Piece> = Vec::new();
    let mut used = 0;
    for (tensor, &len) in lens.iter().enumerate() {
        let mut start = 0;
        while start < len {
            let take = (len - start).min(cap - used);
            current.push(Piece {
                tensor,
                range: start..start + take,
            });
            start += take;
            used += take;
            if used == cap {
                buckets.push(std::mem::take(&mut current));
                used = 0;
            }
        }
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_every_element_once_in_order_and_respect_the_cap() {
        for lens in [
            vec![],
            vec![0, 0],
            vec![10],
            vec![3, 0, 5, 7, 0, 1],
            vec![1000, 1, 2, 300],
            vec![256; 1000],
        ] {
            for (elem, cap_bytes) in [(4, 16), (4, 1), (2, 1000), (8, 1 << 20)] {
                let plan = plan_fusion(&lens, elem, cap_bytes);
                let cap = (cap_bytes / elem).max(1);
                let mut next = vec![0usize; lens.len()];
                let mut last_tensor = 0;
                for (b, bucket) in plan.iter().enumerate() {
                    let size: usize = bucket.iter().map(|p| p.range.len()).sum();
                    assert!(size <= cap && size > 0);
                    if b + 1 < plan.len() {
                        assert_eq!(size, cap, "only the last bucket may be partly filled");
                    }
                    for p in bucket {
                        assert!(p.tensor >= last_tensor, "tensors stay in order");
                        last_tensor = p.tensor;
                        assert_eq!(p.range.start, next[p.tensor]);
                        assert!(!p.range.is_empty());
                        next[p.tensor] = p.range.end;
                    }
                }
                assert_eq!(next, lens);
            }
        }
    }

    #[test]
    fn thousand_small_tensors_fill_one_bucket() {
        let plan = plan_fusion(&[256; 1000], 4, 1 << 20);
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].len(), 1000);
        let plan = plan_fusion(&[10, 100, 10], 1, 50);
        assert_eq!(plan.len(), 3);
        assert_eq!(
            plan[0],
            vec![
                Piece {
                    tensor: 0,
                    range: 0..10
                },
                Piece {
                    tensor: 1,
                    range: 0..40
                }
            ]
        );
    }
}
