//! PyTorch's `DataParallel`, as the seeds describe it: one process, one thread per
//! replica, gradients reduced to the master replica, which updates and sends the
//! parameters back out.

use std::any::Any;
use std::fmt;
use std::thread;
use std::time::{Duration, Instant};

use crate::element::GradElement;
use crate::DdpError;

/// A model DataParallel can replicate: a `Clone` whose parameters it can read and
/// overwrite, as flat slices in a fixed order (the order of the gradients).
///
/// ```
/// use ringccl::ddp::Replica;
/// #[derive(Clone)]
/// struct Linear { w: Vec<f32>, b: Vec<f32> }
/// impl Replica<f32> for Linear {
///     fn params(&self) -> Vec<&[f32]> { vec![&self.w, &self.b] }
///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w, &mut self.b] }
/// }
/// let model = Linear { w: vec![0.0; 3], b: vec![0.0] };
/// assert_eq!(model.params()[0].len(), 3);
/// ```
pub trait Replica<T>: Clone + Send + Sync {
    /// The parameters, in a fixed order.
    fn params(&self) -> Vec<&[T]>;
    /// The same parameters, mutably, in the same order.
    fn params_mut(&mut self) -> Vec<&mut [T]>;
}

/// Where the last [`DataParallel::step`] spent its time: the three phases of a DP step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DpTimings {
    /// Copying the master's parameters into the other replicas (in their own threads, at
    /// the same time; the slowest replica's copy).
    pub replicate: Duration,
    /// The replicas' forward and backward passes (the slowest replica's, thread start
    /// included).
    pub compute: Duration,
    /// The master summing every replica's gradients into its own, alone.
    pub reduce: Duration,
}

/// One replica's gradients, handed to the step's closure to fill in.
pub struct Grads<'a, T> {
    replica: usize,
    values: &'a mut [Vec<T>],
    set: Vec<bool>,
}

impl<T: GradElement> Grads<'_, T> {
    /// Which replica this is (0 is the master).
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![1.0] }, 2)?;
    /// let who = dp.step(&[1.0f32, 2.0], |_, _, grads| {
    ///     grads.set(0, &[0.0])?;
    ///     Ok::<usize, DdpError>(grads.replica())
    /// })?;
    /// assert_eq!(who, vec![0, 1]);
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// Sets the gradient of parameter `index` (of this replica's shard's mean loss).
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![1.0] }, 1)?;
    /// dp.step(&[3.0f32], |_, shard, grads| grads.set(0, &[shard[0]]))?;
    /// assert_eq!(dp.grads()[0], vec![3.0]);
    /// let wrong = dp.step(&[3.0f32], |_, _, grads| grads.set(0, &[1.0, 2.0]));
    /// assert!(wrong.is_err()); // the parameter has 1 element
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn set(&mut self, index: usize, grad: &[T]) -> Result<(), DdpError> {
        self.get_mut(index, grad.len())?.copy_from_slice(grad);
        Ok(())
    }

    /// The place of parameter `index`'s gradient, `numel` long, to write it in place; it
    /// counts as set.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![1.0, 1.0] }, 1)?;
    /// dp.step(&[2.0f32], |_, shard, grads| {
    ///     let g = grads.get_mut(0, 2)?;
    ///     g.fill(shard[0]);
    ///     Ok::<(), DdpError>(())
    /// })?;
    /// assert_eq!(dp.grads()[0], vec![2.0, 2.0]);
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn get_mut(&mut self, index: usize, numel: usize) -> Result<&mut [T], DdpError> {
        let replica = self.replica;
        let count = self.values.len();
        let Some(slot) = self.values.get_mut(index) else {
            return Err(DdpError::InvalidArgument(format!(
                "replica {replica}: no parameter #{index} (the model has {count})"
            )));
        };
        if slot.len() != numel {
            return Err(DdpError::InvalidArgument(format!(
                "replica {replica}: the gradient of parameter #{index} has {numel} elements, \
                 the parameter {}",
                slot.len()
            )));
        }
        self.set[index] = true;
        Ok(slot)
    }
}

impl<T> fmt::Debug for Grads<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grads")
            .field("replica", &self.replica)
            .field("params", &self.values.len())
            .finish()
    }
}

/// Data parallelism inside one process, PyTorch's `DataParallel`: `R` replicas of the
/// model, replica 0 the master. Each [`step`](Self::step):
/// 1. splits the global batch evenly into `R` shards (the first `B mod R` shards one
///    longer when `R` does not divide `B`);
/// 2. copies the master's parameters into every other replica (per-step replication);
/// 3. runs the closure — forward and backward of one shard — on every replica at once,
///    each on its own thread (the master's on the calling thread);
/// 4. reduces the gradients to the master: the average over replicas, weighted by shard
///    length, so that it equals the gradient of the mean loss over the whole batch.
///
/// Then the trainer updates the master in [`update`](Self::update); the next step sends
/// the new parameters out again.
///
/// ```
/// use ringccl::ddp::{DataParallel, DdpError, Replica};
/// #[derive(Clone)]
/// struct Scale { w: Vec<f32> }
/// impl Replica<f32> for Scale {
///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
/// }
/// // Fit y = 3x by least squares on x = 1..=8, 4 replicas of 2 samples each.
/// let mut dp = DataParallel::new(Scale { w: vec![0.0] }, 4)?;
/// let xs: Vec<f32> = (1..=8).map(|x| x as f32).collect();
/// for _ in 0..50 {
///     dp.step(&xs, |model, shard, grads| {
///         let w = model.w[0];
///         let g = shard.iter().map(|x| (w * x - 3.0 * x) * x).sum::<f32>() / shard.len() as f32;
///         grads.set(0, &[g])?;
///         Ok::<(), DdpError>(())
///     })?;
///     dp.update(|master, grads| master.w[0] -= 0.01 * grads[0][0]);
/// }
/// assert!((dp.master().w[0] - 3.0).abs() < 1e-4);
/// # Ok::<(), DdpError>(())
/// ```
pub struct DataParallel<M, T> {
    /// Replica 0 is the master.
    replicas: Vec<M>,
    /// Each replica's gradients; the master's hold the reduced ones after a step.
    grads: Vec<Vec<Vec<T>>>,
    timings: DpTimings,
    steps: u64,
}

impl<M: Replica<T>, T: GradElement> DataParallel<M, T> {
    /// `replicas` copies of `model` (at least 1); `model` becomes the master.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let dp = DataParallel::new(Scale { w: vec![0.5] }, 3)?;
    /// assert_eq!((dp.replicas(), dp.master().w[0]), (3, 0.5));
    /// assert!(DataParallel::new(Scale { w: vec![] }, 0).is_err());
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn new(model: M, replicas: usize) -> Result<Self, DdpError> {
        if replicas == 0 {
            return Err(DdpError::InvalidArgument(
                "DataParallel needs at least 1 replica".into(),
            ));
        }
        let shapes: Vec<usize> = model.params().iter().map(|p| p.len()).collect();
        let grads = (0..replicas)
            .map(|_| shapes.iter().map(|&n| vec![T::default(); n]).collect())
            .collect();
        let mut all = Vec::with_capacity(replicas);
        all.extend(std::iter::repeat_n(model.clone(), replicas - 1));
        all.insert(0, model);
        Ok(DataParallel {
            replicas: all,
            grads,
            timings: DpTimings::default(),
            steps: 0,
        })
    }

    /// The number of replicas.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// assert_eq!(DataParallel::new(Scale { w: vec![0.0] }, 4)?.replicas(), 4);
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn replicas(&self) -> usize {
        self.replicas.len()
    }

    /// The master replica, whose parameters are the model's.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![0.0] }, 2)?;
    /// dp.update(|master, _| master.w[0] = 7.0);
    /// assert_eq!(dp.master().w, vec![7.0]);
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn master(&self) -> &M {
        &self.replicas[0]
    }

    /// The master's reduced gradients after a step, in parameter order.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![0.0] }, 2)?;
    /// // Shards [1, 2] and [3]: the average weighted by shard length is the batch mean, 2.
    /// dp.step(&[1.0f32, 2.0, 3.0], |_, shard, grads| {
    ///     grads.set(0, &[shard.iter().sum::<f32>() / shard.len() as f32])
    /// })?;
    /// assert_eq!(dp.grads()[0], vec![2.0]);
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn grads(&self) -> &[Vec<T>] {
        &self.grads[0]
    }

    /// Where the last step spent its time.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![0.0] }, 2)?;
    /// dp.step(&[1.0f32, 2.0], |_, _, grads| grads.set(0, &[1.0]))?;
    /// let t = dp.timings();
    /// assert!(t.compute > std::time::Duration::ZERO); // the replicas' passes, threads included
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn timings(&self) -> DpTimings {
        self.timings
    }

    /// Steps run so far.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![0.0] }, 1)?;
    /// dp.step(&[1.0f32], |_, _, grads| grads.set(0, &[1.0]))?;
    /// assert_eq!(dp.steps(), 1);
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Lets `update` change the master (usually: the optimizer step from the reduced
    /// gradients, the second argument). The other replicas get the new parameters at
    /// the start of the next step.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![1.0] }, 2)?;
    /// dp.step(&[1.0f32, 1.0], |_, _, grads| grads.set(0, &[0.5]))?;
    /// let lr = 0.1;
    /// dp.update(|master, grads| master.w[0] -= lr * grads[0][0]);
    /// assert_eq!(dp.master().w, vec![0.95]);
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn update<R>(&mut self, update: impl FnOnce(&mut M, &[Vec<T>]) -> R) -> R {
        update(&mut self.replicas[0], &self.grads[0])
    }

    /// One forward-backward over `batch` on every replica; see the type's docs.
    /// `pass(replica's model, its shard, its gradients)` must set the gradient of every
    /// parameter (of the shard's mean loss) and returns whatever the trainer wants back
    /// (the shard's loss, say); `step` returns those in replica order. A replica whose
    /// shard is empty (a batch shorter than the replica count) does not run.
    ///
    /// The first error in replica order is returned, after every replica has finished;
    /// a panicking replica is an error naming it. The master's gradients are then
    /// unspecified until the next successful step.
    ///
    /// ```
    /// use ringccl::ddp::{DataParallel, DdpError, Replica};
    /// #[derive(Clone)]
    /// struct Scale { w: Vec<f32> }
    /// impl Replica<f32> for Scale {
    ///     fn params(&self) -> Vec<&[f32]> { vec![&self.w] }
    ///     fn params_mut(&mut self) -> Vec<&mut [f32]> { vec![&mut self.w] }
    /// }
    /// let mut dp = DataParallel::new(Scale { w: vec![0.0] }, 2)?;
    /// let losses = dp.step(&[1.0f32, 3.0], |model, shard, grads| {
    ///     grads.set(0, &[model.w[0] - shard[0]])?;
    ///     Ok::<f32, DdpError>(shard[0])
    /// })?;
    /// assert_eq!(losses, vec![1.0, 3.0]); // one per replica, in replica order
    /// # Ok::<(), DdpError>(())
    /// ```
    pub fn step<B, L, E>(
        &mut self,
        batch: &[B],
        pass: impl Fn(&M, &[B], &mut Grads<'_, T>) -> Result<L, E> + Sync,
    ) -> Result<Vec<L>, E>
    where
        B: Sync,
        L: Send,
        E: From<DdpError> + Send,
    {
        let count = self.replicas.len();
        let shards = split(batch, count);
        let (master, others) = self.replicas.split_at_mut(1);
        let master = &master[0];
        let (master_grads, other_grads) = self.grads.split_at_mut(1);
        let pass = &pass;
        let started = Instant::now();
        let outcomes = thread::scope(|scope| {
            let mut handles = Vec::with_capacity(count - 1);
            for (i, ((replica, grads), shard)) in others
                .iter_mut()
                .zip(other_grads.iter_mut())
                .zip(&shards[1..])
                .enumerate()
            {
                let spawned = thread::Builder::new()
                    .name(format!("dp-replica-{}", i + 1))
                    .spawn_scoped(scope, move || {
                        let copy = Instant::now();
                        replicate(master, replica);
                        let copied = copy.elapsed();
                        let outcome = run_pass(pass, replica, shard, i + 1, grads);
                        (outcome, copied)
                    });
                handles.push(spawned);
            }
            let mine = run_pass(pass, master, shards[0], 0, &mut master_grads[0]);
            let mut outcomes = vec![(mine, Duration::ZERO)];
            for (i, handle) in handles.into_iter().enumerate() {
                let replica = i + 1;
                outcomes.push(match handle {
                    Ok(handle) => handle.join().unwrap_or_else(|payload| {
                        (
                            Outcome::Failed(panicked(replica, payload).into()),
                            Duration::ZERO,
                        )
                    }),
                    Err(e) => (
                        Outcome::Failed(
                            DdpError::Replica {
                                replica,
                                reason: format!("could not start its thread: {e}"),
                            }
                            .into(),
                        ),
                        Duration::ZERO,
                    ),
                });
            }
            let copying = outcomes.iter().map(|o| o.1).max().unwrap_or_default();
            (outcomes.into_iter().map(|o| o.0).collect(), copying)
        });
        let (outcomes, copying): (Vec<Outcome<L, E>>, Duration) = outcomes;
        self.timings.replicate = copying;
        self.timings.compute = started.elapsed().saturating_sub(copying);

        let mut results = Vec::with_capacity(count);
        let mut first_error = None;
        for outcome in outcomes {
            match outcome {
                Outcome::Done(value) => results.push(value),
                Outcome::Skipped => {}
                Outcome::Failed(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let reducing = Instant::now();
        let lengths: Vec<usize> = shards.iter().map(|s| s.len()).collect();
        reduce_to_master(&mut self.grads, &lengths, batch.len());
        self.timings.reduce = reducing.elapsed();
        self.steps += 1;
        Ok(results)
    }
}

impl<M, T> fmt::Debug for DataParallel<M, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataParallel")
            .field("replicas", &self.replicas.len())
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

enum Outcome<L, E> {
    Done(L),
    /// The replica's shard was empty.
    Skipped,
    Failed(E),
}

/// `batch` cut into `count` contiguous shards, as even as possible.
fn split<B>(batch: &[B], count: usize) -> Vec<&[B]> {
    let (base, extra) = (batch.len() / count, batch.len() % count);
    let mut shards = Vec::with_capacity(count);
    let mut at = 0;
    for r in 0..count {
        let len = base + usize::from(r < extra);
        shards.push(&batch[at..at + len]);
        at += len;
    }
    shards
}

fn replicate<M: Replica<T>, T: GradElement>(master: &M, replica: &mut M) {
    for (to, from) in replica.params_mut().into_iter().zip(master.params()) {
        if to.len() == from.len() {
            to.copy_from_slice(from);
        }
    }
}

fn run_pass<M, T, B, L, E>(
    pass: &(impl Fn(&M, &[B], &mut Grads<'_, T>) -> Result<L, E> + Sync),
    model: &M,
    shard: &[B],
    replica: usize,
    values: &mut [Vec<T>],
) -> Outcome<L, E>
where
    T: GradElement,
    E: From<DdpError>,
{
    if shard.is_empty() {
        values.iter_mut().for_each(|g| g.fill(T::default()));
        return Outcome::Skipped;
    }
    let mut grads = Grads {
        replica,
        set: vec![false; values.len()],
        values,
    };
    match pass(model, shard, &mut grads) {
        Ok(value) => match grads.set.iter().position(|set| !set) {
            None => Outcome::Done(value),
            Some(index) => Outcome::Failed(
                DdpError::Replica {
                    replica,
                    reason: format!(
                        "its pass set no gradient for parameter #{index}; set every \
                         parameter's gradient (zeros for an unused one)"
                    ),
                }
                .into(),
            ),
        },
        Err(e) => Outcome::Failed(e),
    }
}

fn panicked(replica: usize, payload: Box<dyn Any + Send>) -> DdpError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into());
    DdpError::Replica {
        replica,
        reason: format!("its pass panicked: {message}"),
    }
}

/// The master's gradients become the shard-length-weighted average of every replica's:
/// replicas summed in order into the master's, then divided once by the replica count
/// (even shards) or weighted by shard length over the batch (uneven ones).
fn reduce_to_master<T: GradElement>(grads: &mut [Vec<Vec<T>>], lengths: &[usize], total: usize) {
    let Some((master, others)) = grads.split_first_mut() else {
        return;
    };
    let even = lengths.iter().all(|&l| l == lengths[0]);
    if even {
        for other in others.iter() {
            for (m, o) in master.iter_mut().zip(other) {
                m.iter_mut().zip(o).for_each(|(m, &o)| *m = m.add(o));
            }
        }
        let count = lengths.len();
        if count > 1 {
            master
                .iter_mut()
                .for_each(|m| m.iter_mut().for_each(|m| *m = m.div_count(count)));
        }
        return;
    }
    let weight = |r: usize| lengths[r];
    for m in master.iter_mut() {
        m.iter_mut().for_each(|m| *m = m.mul_count(weight(0)));
    }
    for (r, other) in others.iter().enumerate() {
        for (m, o) in master.iter_mut().zip(other) {
            m.iter_mut()
                .zip(o)
                .for_each(|(m, &o)| *m = m.add(o.mul_count(weight(r + 1))));
        }
    }
    master
        .iter_mut()
        .for_each(|m| m.iter_mut().for_each(|m| *m = m.div_count(total)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_contiguous_and_as_even_as_possible() {
        let batch: Vec<usize> = (0..10).collect();
        let shards = split(&batch, 4);
        let lens: Vec<usize> = shards.iter().map(|s| s.len()).collect();
        assert_eq!(lens, vec![3, 3, 2, 2]);
        assert_eq!(shards.concat(), batch);
        assert_eq!(split(&batch[..2], 3)[2].len(), 0);
    }

    #[test]
    fn uneven_shards_weigh_by_length() {
        // Replica gradients 1, 2, 4 over shards of 2, 1, 1: (2*1 + 2 + 4) / 4 = 2.
        let mut grads = vec![vec![vec![1.0f32]], vec![vec![2.0]], vec![vec![4.0]]];
        reduce_to_master(&mut grads, &[2, 1, 1], 4);
        assert_eq!(grads[0][0][0], 2.0);
        let mut even = vec![vec![vec![1.0f64]], vec![vec![2.0]]];
        reduce_to_master(&mut even, &[3, 3], 6);
        assert_eq!(even[0][0][0], 1.5);
    }
}
