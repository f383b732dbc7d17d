//! Splitting a dataset between ranks, with `torch.utils.data.DistributedSampler`'s
//! semantics.

use crate::DdpError;

/// Which dataset indices this rank visits in an epoch.
///
/// Semantics follow PyTorch's `DistributedSampler`:
/// - every rank gets the same number of indices, [`num_samples`](Self::num_samples);
/// - with `shuffle` (the default), the order is a permutation seeded by `seed + epoch`,
///   the same on every rank, so call [`set_epoch`](Self::set_epoch) each epoch to get a
///   new order;
/// - without `drop_last` (the default), the list is padded to a multiple of
///   `num_replicas` by repeating indices from its start; with it, the tail is dropped;
/// - rank `r` takes positions `r, r + num_replicas, r + 2 num_replicas, ...`, so the ranks'
///   lists never overlap (except for the padding) and together cover the dataset.
///
/// Consequently, with local batch `b`, step `s` of all ranks together visits positions
/// `s·b·N .. (s+1)·b·N` of the epoch's permutation: the same samples one process with
/// batch `N·b` would visit. The permutation is ringccl's own (SplitMix64 + Fisher–Yates),
/// not bit-compatible with torch's.
///
/// ```
/// use ringccl::ddp::DistributedSampler;
/// let mut sampler = DistributedSampler::new(10, 4, 1)?.shuffle(false);
/// assert_eq!(sampler.indices(), vec![1, 5, 9]);
/// assert_eq!(sampler.num_samples(), 3); // 10 padded to 12
/// sampler.set_epoch(1);
/// # Ok::<(), ringccl::ddp::DdpError>(())
/// ```
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// A sampler over a dataset of `len` items for rank `rank` of `num_replicas`, with
    /// shuffling on, seed 0 and padding.
    ///
    /// ```
    /// use ringccl::ddp::DistributedSampler;
    /// let sampler = DistributedSampler::new(10, 3, 2)?;
    /// assert_eq!(sampler.num_samples(), 4); // padded to 12
    /// assert!(DistributedSampler::new(10, 3, 3).is_err());
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<Self, DdpError> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(DdpError::InvalidArgument(format!(
                "DistributedSampler: rank {rank} is out of range for {num_replicas} replicas"
            )));
        }
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            epoch: 0,
            drop_last: false,
        })
    }

    /// Whether to shuffle (default true).
    ///
    /// ```
    /// let sampler = ringccl::ddp::DistributedSampler::new(6, 2, 0)?.shuffle(false);
    /// assert_eq!(sampler.indices(), vec![0, 2, 4]);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The shuffling seed; every rank must use the same one (default 0).
    ///
    /// ```
    /// use ringccl::ddp::DistributedSampler;
    /// let a = DistributedSampler::new(100, 2, 0)?.seed(1).indices();
    /// let b = DistributedSampler::new(100, 2, 0)?.seed(2).indices();
    /// assert_ne!(a, b);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail instead of padding (default false).
    ///
    /// ```
    /// let sampler = ringccl::ddp::DistributedSampler::new(10, 3, 0)?.drop_last(true);
    /// assert_eq!(sampler.num_samples(), 3); // 10 / 3, the last item dropped
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Sets the epoch, which changes the shuffled order. Call it at the start of every
    /// epoch on every rank.
    ///
    /// ```
    /// let mut sampler = ringccl::ddp::DistributedSampler::new(100, 2, 0)?;
    /// let first = sampler.indices();
    /// sampler.set_epoch(1);
    /// assert_ne!(sampler.indices(), first);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The epoch set last ([`set_epoch`](Self::set_epoch); 0 until then).
    ///
    /// ```
    /// use ringccl::ddp::DistributedSampler;
    /// let mut sampler = DistributedSampler::new(10, 2, 0)?;
    /// sampler.set_epoch(4);
    /// assert_eq!(sampler.epoch(), 4);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The indices each rank visits per epoch.
    ///
    /// ```
    /// assert_eq!(ringccl::ddp::DistributedSampler::new(10, 4, 0)?.num_samples(), 3);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn num_samples(&self) -> usize {
        let n = self.num_replicas;
        if self.drop_last {
            self.len / n
        } else {
            self.len.div_ceil(n)
        }
    }

    /// `num_samples() * num_replicas`: the padded (or trimmed) epoch length.
    ///
    /// ```
    /// assert_eq!(ringccl::ddp::DistributedSampler::new(10, 4, 0)?.total_size(), 12);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    /// This rank's indices for the current epoch, in visiting order.
    ///
    /// ```
    /// use ringccl::ddp::DistributedSampler;
    /// let all: Vec<usize> = (0..2)
    ///     .flat_map(|rank| DistributedSampler::new(8, 2, rank).unwrap().seed(3).indices())
    ///     .collect();
    /// let mut sorted = all.clone();
    /// sorted.sort();
    /// assert_eq!(sorted, (0..8).collect::<Vec<_>>()); // every item once across the ranks
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn indices(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = SplitMix64(self.seed.wrapping_add(self.epoch));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let total = self.total_size();
        if order.is_empty() {
            return Vec::new();
        }
        let mut k = 0;
        while order.len() < total {
            order.push(order[k]);
            k += 1;
        }
        order.truncate(total);
        order
            .into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }
}

/// SplitMix64: small, fast, and good enough to shuffle a dataset.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (Lemire's multiply-shift, with rejection).
    fn below(&mut self, bound: u64) -> u64 {
        loop {
            let product = u128::from(self.next()) * u128::from(bound);
            let low = product as u64;
            if low >= bound.wrapping_neg() % bound {
                return (product >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn all_ranks(len: usize, n: usize, epoch: u64, drop_last: bool) -> Vec<Vec<usize>> {
        (0..n)
            .map(|r| {
                let mut s = DistributedSampler::new(len, n, r)
                    .unwrap()
                    .seed(42)
                    .drop_last(drop_last);
                s.set_epoch(epoch);
                s.indices()
            })
            .collect()
    }

    #[test]
    fn ranks_are_disjoint_cover_the_dataset_and_have_equal_lengths() {
        for len in [0, 1, 5, 8, 10, 97, 100] {
            for n in 1..=6 {
                let parts = all_ranks(len, n, 3, false);
                let want = len.div_ceil(n);
                assert!(parts.iter().all(|p| p.len() == want), "len {len} n {n}");
                let covered: BTreeSet<usize> = parts.iter().flatten().copied().collect();
                assert_eq!(covered, (0..len).collect(), "len {len} n {n}");
                // Only the padding repeats: total minus distinct = padding size.
                let total: usize = parts.iter().map(Vec::len).sum();
                assert_eq!(total - covered.len(), want * n - len, "len {len} n {n}");
            }
        }
    }

    #[test]
    fn drop_last_trims_to_a_multiple_with_no_repeats() {
        for len in [0, 3, 10, 97] {
            for n in 1..=5 {
                let parts = all_ranks(len, n, 0, true);
                let flat: Vec<usize> = parts.concat();
                let distinct: BTreeSet<usize> = flat.iter().copied().collect();
                assert_eq!(flat.len(), len / n * n);
                assert_eq!(distinct.len(), flat.len(), "no repeats");
                assert!(parts.iter().all(|p| p.len() == len / n));
            }
        }
    }

    #[test]
    fn padding_repeats_the_start_of_the_order() {
        let s = DistributedSampler::new(10, 4, 0).unwrap().shuffle(false);
        let rank3 = DistributedSampler::new(10, 4, 3).unwrap().shuffle(false);
        assert_eq!(s.indices(), vec![0, 4, 8]);
        assert_eq!(rank3.indices(), vec![3, 7, 1]); // 10, 11 -> 0, 1
        let tiny = DistributedSampler::new(2, 5, 4).unwrap().shuffle(false);
        assert_eq!(tiny.indices(), vec![0]); // [0,1,0,1,0]
    }

    #[test]
    fn epochs_shuffle_differently_and_seeds_are_reproducible() {
        let a = all_ranks(1000, 1, 0, false);
        let b = all_ranks(1000, 1, 1, false);
        assert_ne!(a, b);
        assert_eq!(a, all_ranks(1000, 1, 0, false));
        let sorted: Vec<usize> = (0..1000).collect();
        assert_ne!(a[0], sorted, "shuffled");
    }

    #[test]
    fn a_global_step_visits_the_same_samples_at_any_world_size() {
        // Step s with local batch b on N ranks = step s with batch N*b on one rank.
        let (len, b) = (640, 16);
        let one = all_ranks(len, 1, 7, false).remove(0);
        let four = all_ranks(len, 4, 7, false);
        for step in 0..len / (4 * b) {
            let mut together: Vec<usize> = four
                .iter()
                .flat_map(|p| p[step * b..(step + 1) * b].iter().copied())
                .collect();
            let mut alone = one[step * 4 * b..(step + 1) * 4 * b].to_vec();
            together.sort_unstable();
            alone.sort_unstable();
            assert_eq!(together, alone, "step {step}");
        }
    }

    #[test]
    fn out_of_range_rank_is_an_error() {
        assert!(DistributedSampler::new(10, 4, 4).is_err());
        assert!(DistributedSampler::new(10, 0, 0).is_err());
    }
}
