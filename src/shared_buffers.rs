//! Buffers in shared memory from the start, so that an all-reduce between processes of
//! one host reads its peers' buffers in place (see [`SharedBuffer`]).

use ringccl_collectives::Element;
use ringccl_transports::shm::SharedBuffer;

use crate::{Error, ProcessGroup};

impl ProcessGroup {
    /// `len` zeroed elements, allocated where this group's all-reduce is fastest: in
    /// shared memory (`/dev/shm`) when the group's ranks are processes of this host that
    /// share memory, on the heap otherwise. An all-reduce of (a slice of) such a buffer
    /// that every rank passes, of at least `HostConfig::shared_buffer_min_bytes` (16 KiB
    /// by default), reads the peers' buffers in place: each byte crosses between
    /// processes once, at the speed of memory, instead of twice through the rings.
    ///
    /// Every rank must then pass a shared buffer to that call, or none: a rank that
    /// passes another buffer while its peers pass shared ones gets an error naming it.
    /// The buffer holds `/dev/shm` space for as long as it lives, and for as long as a
    /// peer keeps it mapped after it is dropped (up to 32 newer shared buffers of the
    /// same rank, or the peer's group closing).
    ///
    /// ```
    /// # fn main() -> Result<(), ringccl::Error> {
    /// let pg = ringccl::local_groups("gloo", 1)?.remove(0);
    /// let mut grads = pg.shared_buffer::<f32>(1 << 20)?;
    /// grads.fill(1.0);
    /// pg.all_reduce(&mut grads[..], ringccl::ReduceOp::Sum)?;
    /// assert_eq!(grads[0], 1.0);
    /// # Ok(()) }
    /// ```
    pub fn shared_buffer<T: Element>(&self, len: usize) -> Result<SharedBuffer<T>, Error> {
        let rank = self.rank();
        let processes_sharing_memory = self.world_size() > 1
            && (0..self.world_size()).all(|p| p == rank || self.peer_transport(p) == "shm");
        if !processes_sharing_memory {
            return Ok(SharedBuffer::on_heap(len));
        }
        SharedBuffer::new(len).map_err(|reason| Error::Io {
            rank,
            context: format!("allocating a shared buffer of {len} {}", T::DTYPE.name()),
            source: std::io::Error::other(reason),
        })
    }
}
