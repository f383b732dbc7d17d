//! Which gradients share a bucket: pure, deterministic, and the same on every rank.

/// Groups parameters into buckets, PyTorch DDP's way.
///
/// `order` lists parameter indices in the order their gradients are expected to be
/// ready (usually registration order reversed: backward produces the last layer's
/// gradients first). Parameters are added to the current bucket in that order; a bucket
/// is closed as soon as it holds at least its cap: `first_cap_bytes` for the first
/// bucket (small, so that communication starts early), `cap_bytes` for the others. A
/// parameter larger than the cap gets a bucket of its own; parameters are never split.
/// Empty parameters are placed like the others (they cost nothing).
///
/// (`ringccl::core::fusion::plan_fusion`, behind `all_reduce_bucketed`, is the
/// other planner: it packs tensors into fixed-size fusion buffers and does split them.)
///
/// ```
/// // Parameters of 1, 2, 4 and 1 elements of 4 bytes, in reverse order; the first
/// // bucket closes once it holds 8 bytes, the others once they hold 12.
/// let buckets = ringccl::ddp::plan_buckets(&[3, 2, 1, 0], &[1, 2, 4, 1], 4, 8, 12);
/// assert_eq!(buckets, vec![vec![3, 2], vec![1, 0]]);
/// ```
pub fn plan_buckets(
    order: &[usize],
    numels: &[usize],
    elem_bytes: usize,
    first_cap_bytes: usize,
    cap_bytes: usize,
) -> Vec<Vec<usize>> {
    let mut buckets = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0usize;
    for &param in order {
        current.push(param);
        bytes = bytes.saturating_add(numels[param].saturating_mul(elem_bytes));
        let cap = if buckets.is_empty() {
            first_cap_bytes
        } else {
            cap_bytes
        };
        if bytes >= cap.max(1) {
            buckets.push(std::mem::take(&mut current));
            bytes = 0;
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

    fn reverse(n: usize) -> Vec<usize> {
        (0..n).rev().collect()
    }

    #[test]
    fn reverse_order_fills_buckets_from_the_last_parameter() {
        // Four 400-byte params, caps 1000: [3, 2, 1] reaches 1200 >= 1000.
        let plan = plan_buckets(&reverse(4), &[100; 4], 4, 1000, 1000);
        assert_eq!(plan, vec![vec![3, 2, 1], vec![0]]);
    }

    #[test]
    fn the_first_bucket_has_its_own_smaller_cap() {
        let plan = plan_buckets(&reverse(6), &[100; 6], 4, 400, 1200);
        assert_eq!(plan, vec![vec![5], vec![4, 3, 2], vec![1, 0]]);
    }

    #[test]
    fn a_parameter_bigger_than_the_cap_gets_its_own_bucket() {
        let plan = plan_buckets(&reverse(3), &[10, 10_000, 10], 4, 100, 100);
        assert_eq!(plan, vec![vec![2, 1], vec![0]]);
        let plan = plan_buckets(&[0, 1, 2], &[10_000, 10, 10], 4, 100, 100);
        assert_eq!(plan, vec![vec![0], vec![1, 2]]);
    }

    #[test]
    fn every_parameter_lands_in_exactly_one_bucket_in_order() {
        for n in 0..40 {
            let numels: Vec<usize> = (0..n).map(|i| (i * 37) % 11 * 100).collect();
            let order: Vec<usize> = (0..n).rev().collect();
            for (first, cap) in [(1, 1), (400, 4000), (1 << 20, 25 << 20), (0, 0)] {
                let plan = plan_buckets(&order, &numels, 4, first, cap);
                let flat: Vec<usize> = plan.concat();
                assert_eq!(flat, order, "n={n} caps {first}/{cap}");
                assert!(plan.iter().all(|b| !b.is_empty()));
                // Every bucket but the last reached its cap; removing its last parameter
                // would have left it under the cap.
                for (k, bucket) in plan.iter().enumerate().take(plan.len().saturating_sub(1)) {
                    let cap = if k == 0 { first } else { cap }.max(1);
                    let bytes: usize = bucket.iter().map(|&p| numels[p] * 4).sum();
                    let last = numels[*bucket.last().unwrap()] * 4;
                    assert!(bytes >= cap && bytes - last < cap, "bucket {k}: {bucket:?}");
                }
            }
        }
    }

    #[test]
    fn torch_default_caps_on_a_realistic_model() {
        // 1 MiB first bucket, 25 MiB after: 10 layers of 1M f32 params + 1K biases.
        let numels: Vec<usize> = (0..20)
            .map(|i| if i % 2 == 0 { 1 << 20 } else { 1024 })
            .collect();
        let plan = plan_buckets(&reverse(20), &numels, 4, 1 << 20, 25 << 20);
        assert_eq!(plan[0], vec![19, 18]);
        assert_eq!(plan.len(), 3);
        assert_eq!(plan[1].first(), Some(&17));
        assert_eq!(plan[1].last(), Some(&4));
    }
}
