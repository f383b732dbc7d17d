//! Fused all-reduce of many tensors ([`ProcessGroup::all_reduce_bucketed`]).

use std::collections::VecDeque;

use ringccl_collectives::fusion::{plan_fusion, Piece};
use ringccl_collectives::{validate_reduce, Element, ReduceOp};

use crate::fusion_pool::BUCKETS_IN_FLIGHT;
use crate::{Error, ProcessGroup, Work};

impl ProcessGroup {
    /// All-reduces many tensors through fusion buffers of at most `bucket_bytes`: the
    /// tensors are packed, in order, into buckets (a tensor larger than the space left is
    /// split across buckets), each bucket is all-reduced as one buffer, and the results
    /// are unpacked. The next bucket is packed while the previous ones are on the wire.
    /// A thousand 1 KiB tensors cost about one 1 MiB all-reduce, not a thousand
    /// latencies.
    ///
    /// ```
    /// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
    /// let (mut a, mut b) = (vec![1.0f32; 3], vec![2.0f32; 1000]);
    /// pg.all_reduce_bucketed(&mut [&mut a[..], &mut b[..]], ringccl::ReduceOp::Sum, 1024)?;
    /// assert_eq!(b[999], 2.0);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all_reduce_bucketed<T: Element>(
        &self,
        tensors: &mut [&mut [T]],
        op: ReduceOp,
        bucket_bytes: usize,
    ) -> Result<(), Error> {
        validate_reduce(T::DTYPE, op)?;
        let lens: Vec<usize> = tensors.iter().map(|t| t.len()).collect();
        let plan = plan_fusion(&lens, T::DTYPE.size(), bucket_bytes);
        let mut spare: Vec<Vec<T>> = self.shared().fusion_buffers.take();
        if plan.len() == 1 {
            // One bucket: nothing to pipeline, so skip the hand-off to the worker.
            let mut fused = spare.pop().unwrap_or_default();
            pack(&plan[0], tensors, &mut fused);
            self.all_reduce(&mut fused, op)?;
            unpack(&plan[0], &fused, tensors);
            spare.push(fused);
            self.shared().fusion_buffers.put(spare);
            return Ok(());
        }
        let mut in_flight = VecDeque::<(usize, Work<Vec<T>>)>::new();
        let mut first_error = None;
        // Waits for bucket `index` and copies its result back into the tensors.
        let finish = |index: usize,
                      work: Work<Vec<T>>,
                      tensors: &mut [&mut [T]],
                      spare: &mut Vec<Vec<T>>|
         -> Result<(), Error> {
            let fused = work.wait()?;
            unpack(&plan[index], &fused, tensors);
            spare.push(fused);
            Ok(())
        };
        for (index, bucket) in plan.iter().enumerate() {
            let mut fused = spare.pop().unwrap_or_default();
            pack(bucket, tensors, &mut fused);
            match self.all_reduce_async(fused, op) {
                Ok(work) => in_flight.push_back((index, work)),
                Err(e) => {
                    first_error.get_or_insert(e);
                    break;
                }
            }
            if in_flight.len() > BUCKETS_IN_FLIGHT {
                if let Some((i, work)) = in_flight.pop_front() {
                    if let Err(e) = finish(i, work, tensors, &mut spare) {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        // Wait for every bucket, even after an error: no operation outlives this call.
        while let Some((i, work)) = in_flight.pop_front() {
            if let Err(e) = finish(i, work, tensors, &mut spare) {
                first_error.get_or_insert(e);
            }
        }
        self.shared().fusion_buffers.put(spare);
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Copies the pieces of one fusion buffer, in order, out of `tensors` into `fused`.
fn pack<T: Element>(pieces: &[Piece], tensors: &[&mut [T]], fused: &mut Vec<T>) {
    fused.clear();
    for piece in pieces {
        fused.extend_from_slice(&tensors[piece.tensor][piece.range.clone()]);
    }
}

/// Copies a reduced fusion buffer back over its pieces in `tensors`.
fn unpack<T: Element>(pieces: &[Piece], fused: &[T], tensors: &mut [&mut [T]]) {
    let mut at = 0;
    for piece in pieces {
        let len = piece.range.len();
        tensors[piece.tensor][piece.range.clone()].copy_from_slice(&fused[at..at + len]);
        at += len;
    }
}
