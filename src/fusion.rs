//! Fused all-reduce of many tensors ([`ProcessGroup::all_reduce_bucketed`]).

use std::collections::VecDeque;

use ringccl_collectives::fusion::{plan_fusion, Piece};
use ringccl_collectives::{validate_reduce, BufferMut, Element, ReduceOp};
use ringccl_transports::shm::{copy_elements, SharedBuffer};

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
        let len_of = |pieces: &[Piece]| pieces.iter().map(|p| p.range.len()).sum::<usize>();
        let largest = plan.iter().map(|b| len_of(b)).max().unwrap_or(0);
        let wanted = plan.len().min(BUCKETS_IN_FLIGHT + 1);
        let mut spare = self.fusion_buffers_for::<T>(largest, wanted)?;
        if plan.len() == 1 {
            // One bucket: nothing to pipeline, so skip the hand-off to the worker.
            let result = match spare.last_mut() {
                Some(fused) => {
                    let len = len_of(&plan[0]);
                    pack(&plan[0], tensors, &mut fused[..len]);
                    let result = self.all_reduce(&mut fused[..len], op);
                    if result.is_ok() {
                        unpack(&plan[0], &fused[..len], tensors);
                    }
                    result
                }
                None => Ok(()),
            };
            self.shared().fusion_buffers.put(spare);
            return result;
        }
        let mut in_flight = VecDeque::<(usize, Work<SharedBuffer<T>>)>::new();
        let mut first_error = None;
        // Waits for bucket `index` and copies its result back into the tensors.
        let finish = |index: usize,
                      work: Work<SharedBuffer<T>>,
                      tensors: &mut [&mut [T]],
                      spare: &mut Vec<SharedBuffer<T>>|
         -> Result<(), Error> {
            let fused = work.wait()?;
            unpack(&plan[index], &fused[..len_of(&plan[index])], tensors);
            spare.push(fused);
            Ok(())
        };
        for (index, bucket) in plan.iter().enumerate() {
            let Some(mut fused) = spare.pop() else {
                // Never: as many buffers as buckets in flight, each back before reuse.
                first_error.get_or_insert(Error::InvalidArgument(
                    "all_reduce_bucketed ran out of fusion buffers".into(),
                ));
                break;
            };
            let len = len_of(bucket);
            pack(bucket, tensors, &mut fused[..len]);
            let started = self.queue("all_reduce", move |b, d| {
                b.all_reduce(BufferMut::from_slice(&mut fused[..len]), op, d)
                    .map(|()| fused)
            });
            match started {
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

    /// `wanted` fusion buffers of at least `len` elements, from the pool or new. New
    /// ones are shared buffers where the group's ranks are processes of one host, and
    /// every rank takes shared ones or none: whether every rank could allocate its new
    /// ones in `/dev/shm` is agreed in a small all-reduce (every rank grows its pool at
    /// the same call, the pool's history being the same on every rank), and if one
    /// could not, every rank takes heap buffers instead, so that a full `/dev/shm` costs
    /// speed, never an error.
    fn fusion_buffers_for<T: Element>(
        &self,
        len: usize,
        wanted: usize,
    ) -> Result<Vec<SharedBuffer<T>>, Error> {
        let mut spare: Vec<SharedBuffer<T>> = self.shared().fusion_buffers.take();
        spare.retain(|b| b.len() >= len);
        if spare.len() >= wanted {
            return Ok(spare);
        }
        let mut fresh = Vec::with_capacity(wanted - spare.len());
        let mut allocated = 1i32;
        while spare.len() + fresh.len() < wanted {
            match self.shared_buffer::<T>(len) {
                Ok(buffer) => fresh.push(buffer),
                Err(e) => {
                    tracing::debug!(rank = self.rank(), "fusion buffers on the heap: {e}");
                    allocated = 0;
                    break;
                }
            }
        }
        let mut everyone = [allocated];
        self.all_reduce(&mut everyone, ReduceOp::Min)?;
        if everyone[0] == 0 {
            fresh.clear();
            fresh.resize_with(wanted - spare.len(), || SharedBuffer::on_heap(len));
        }
        spare.append(&mut fresh);
        Ok(spare)
    }
}

/// Copies the pieces of one fusion buffer, in order, out of `tensors` into `fused`
/// (exactly their length).
fn pack<T: Element>(pieces: &[Piece], tensors: &[&mut [T]], fused: &mut [T]) {
    let mut at = 0;
    for piece in pieces {
        let len = piece.range.len();
        copy_elements(
            &mut fused[at..at + len],
            &tensors[piece.tensor][piece.range.clone()],
        );
        at += len;
    }
}

/// Copies a reduced fusion buffer back over its pieces in `tensors`.
fn unpack<T: Element>(pieces: &[Piece], fused: &[T], tensors: &mut [&mut [T]]) {
    let mut at = 0;
    for piece in pieces {
        let len = piece.range.len();
        copy_elements(
            &mut tensors[piece.tensor][piece.range.clone()],
            &fused[at..at + len],
        );
        at += len;
    }
}
