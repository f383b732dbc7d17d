//! A sampler's indices cut into batches, epoch after epoch, resumable mid-epoch.

use crate::sampler::DistributedSampler;
use crate::DdpError;

/// Where a batch sits in training: its epoch and its step within that epoch. Save the
/// position of the next batch ([`Batches::position`]) in a checkpoint and resume from it
/// with [`DistributedSampler::batches_from`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchPosition {
    /// The epoch (the sampler's shuffling epoch).
    pub epoch: u64,
    /// The step within the epoch, from 0.
    pub step: u64,
}

impl BatchPosition {
    /// The position of global step `step` (counted from epoch 0, step 0) with
    /// `steps_per_epoch` steps in each epoch; `None` if `steps_per_epoch` is 0.
    ///
    /// ```
    /// use ringccl::ddp::BatchPosition;
    /// let at = BatchPosition::of_global_step(25, 10).unwrap();
    /// assert_eq!((at.epoch, at.step), (2, 5));
    /// assert_eq!(at.global_step(10), 25);
    /// ```
    pub fn of_global_step(step: u64, steps_per_epoch: u64) -> Option<BatchPosition> {
        (steps_per_epoch > 0).then(|| BatchPosition {
            epoch: step / steps_per_epoch,
            step: step % steps_per_epoch,
        })
    }

    /// The global step of this position with `steps_per_epoch` steps in each epoch.
    ///
    /// ```
    /// let at = ringccl::ddp::BatchPosition { epoch: 2, step: 3 };
    /// assert_eq!(at.global_step(10), 23);
    /// ```
    pub fn global_step(&self, steps_per_epoch: u64) -> u64 {
        self.epoch * steps_per_epoch + self.step
    }
}

/// One batch of this rank's dataset indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Where it is in training.
    pub position: BatchPosition,
    /// The dataset indices, in visiting order.
    pub indices: Vec<usize>,
}

/// The batches of a [`DistributedSampler`], from [`DistributedSampler::batches`]: an
/// endless iterator (take as many steps as you train) that moves to the next epoch by
/// itself, with the epoch's shuffled order. Only full batches are produced: the last
/// `num_samples % batch_size` indices of each epoch are skipped, the same on every rank.
/// Each epoch's order is built once, when the epoch starts.
///
/// ```
/// use ringccl::ddp::{BatchPosition, DistributedSampler};
/// let sampler = DistributedSampler::new(100, 2, 0)?.seed(7);
/// let mut batches = sampler.batches(8)?; // 50 indices per rank: 6 batches per epoch
/// assert_eq!(batches.steps_per_epoch(), 6);
/// let first: Vec<_> = batches.by_ref().take(8).collect();
/// assert_eq!(first[7].position, BatchPosition { epoch: 1, step: 1 });
///
/// // After a restart, resume where the first run stopped.
/// let saved = batches.position();
/// let mut resumed = sampler.batches_from(8, saved)?;
/// assert_eq!(resumed.next(), batches.next());
/// # Ok::<(), ringccl::ddp::DdpError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Batches {
    sampler: DistributedSampler,
    batch_size: usize,
    steps_per_epoch: u64,
    next: BatchPosition,
    /// The indices of epoch `next.epoch`, once built.
    order: Option<Vec<usize>>,
}

impl Batches {
    pub(crate) fn new(
        sampler: &DistributedSampler,
        batch_size: usize,
        from: BatchPosition,
    ) -> Result<Batches, DdpError> {
        if batch_size == 0 {
            return Err(DdpError::InvalidArgument(
                "DistributedSampler::batches: the batch size must be at least 1".into(),
            ));
        }
        let steps_per_epoch = (sampler.num_samples() / batch_size) as u64;
        if steps_per_epoch == 0 {
            return Err(DdpError::InvalidArgument(format!(
                "DistributedSampler::batches: batches of {batch_size} do not fit in the {} \
                 indices each rank gets per epoch; use a smaller batch or more data",
                sampler.num_samples()
            )));
        }
        if from.step >= steps_per_epoch {
            return Err(DdpError::InvalidArgument(format!(
                "DistributedSampler::batches_from: step {} is past the end of an epoch of {} \
                 batches of {batch_size}; was the position saved with another batch size or \
                 world size?",
                from.step, steps_per_epoch
            )));
        }
        Ok(Batches {
            sampler: sampler.clone(),
            batch_size,
            steps_per_epoch,
            next: from,
            order: None,
        })
    }

    /// Full batches per epoch.
    ///
    /// ```
    /// let sampler = ringccl::ddp::DistributedSampler::new(64, 2, 1)?;
    /// assert_eq!(sampler.batches(10)?.steps_per_epoch(), 3); // 32 indices per rank
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// The position of the batch `next` returns next: what a checkpoint saves.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, DistributedSampler};
    /// let mut batches = DistributedSampler::new(64, 2, 0)?.batches(16)?; // 2 per epoch
    /// batches.next();
    /// batches.next();
    /// assert_eq!(batches.position(), BatchPosition { epoch: 1, step: 0 });
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn position(&self) -> BatchPosition {
        self.next
    }
}

impl Iterator for Batches {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let position = self.next;
        let order = self.order.get_or_insert_with(|| {
            self.sampler.set_epoch(position.epoch);
            self.sampler.indices()
        });
        let start = position.step as usize * self.batch_size;
        let indices = order.get(start..start + self.batch_size)?.to_vec();
        self.next.step += 1;
        if self.next.step == self.steps_per_epoch {
            self.next = BatchPosition {
                epoch: position.epoch + 1,
                step: 0,
            };
            self.order = None;
        }
        Some(Batch { position, indices })
    }
}

impl DistributedSampler {
    /// This rank's indices in batches of `batch_size`, from step 0 of the current epoch
    /// onwards, epoch after epoch (see [`Batches`]).
    ///
    /// ```
    /// use ringccl::ddp::DistributedSampler;
    /// let sampler = DistributedSampler::new(64, 4, 2)?;
    /// for batch in sampler.batches(4)?.take(10) {
    ///     assert_eq!(batch.indices.len(), 4);
    /// }
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn batches(&self, batch_size: usize) -> Result<Batches, DdpError> {
        let from = BatchPosition {
            epoch: self.epoch(),
            step: 0,
        };
        Batches::new(self, batch_size, from)
    }

    /// [`batches`](Self::batches) from `position` on (a position saved from
    /// [`Batches::position`]), for resuming mid-epoch.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, DistributedSampler};
    /// let sampler = DistributedSampler::new(64, 4, 2)?;
    /// let at = BatchPosition { epoch: 3, step: 2 };
    /// assert_eq!(sampler.batches_from(4, at)?.next().unwrap().position, at);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn batches_from(
        &self,
        batch_size: usize,
        position: BatchPosition,
    ) -> Result<Batches, DdpError> {
        Batches::new(self, batch_size, position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_each_epoch_in_the_samplers_order() {
        let mut sampler = DistributedSampler::new(50, 3, 1).unwrap().seed(3);
        let batches: Vec<Batch> = sampler.batches(4).unwrap().take(9).collect();
        // 17 indices per rank: 4 batches per epoch, the 17th index skipped.
        for epoch in 0..2u64 {
            sampler.set_epoch(epoch);
            let want = sampler.indices();
            for step in 0..4 {
                let batch = &batches[epoch as usize * 4 + step];
                assert_eq!(
                    batch.position,
                    BatchPosition {
                        epoch,
                        step: step as u64
                    }
                );
                assert_eq!(batch.indices, want[step * 4..step * 4 + 4]);
            }
        }
        assert_eq!(batches[8].position, BatchPosition { epoch: 2, step: 0 });
    }

    #[test]
    fn resuming_anywhere_continues_the_same_sequence() {
        let sampler = DistributedSampler::new(40, 2, 0).unwrap().seed(11);
        let straight: Vec<Batch> = sampler.batches(6).unwrap().take(12).collect();
        for cut in 0..12 {
            let mut first = sampler.batches(6).unwrap();
            first.by_ref().take(cut).for_each(drop);
            let resumed: Vec<Batch> = sampler
                .batches_from(6, first.position())
                .unwrap()
                .take(12 - cut)
                .collect();
            assert_eq!(resumed, straight[cut..], "cut at {cut}");
        }
    }

    #[test]
    fn impossible_batches_are_errors() {
        let sampler = DistributedSampler::new(10, 2, 0).unwrap();
        assert!(sampler.batches(0).is_err());
        assert!(sampler.batches(6).is_err()); // 5 indices per rank
        let past = BatchPosition { epoch: 0, step: 5 };
        assert!(sampler.batches_from(1, past).is_err());
        assert_eq!(BatchPosition::of_global_step(3, 0), None);
    }
}
