//! `Group`: one ringccl process group, started through torch's store, and every
//! collective the Python half calls, each with the interpreter released.
//!
//! A call runs synchronously on the calling thread (torch's `async_op=False`: no thread
//! hop) or, given `queued`, on the group's worker (`async_op=True`, and DDP's bucket
//! all-reduces), completing the torch future through its `on_done` callback. Either way
//! it takes its place in the group's issue order, whatever thread issued it, as gloo's.

use std::net::IpAddr;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ringccl::core::Deadline;
use ringccl::{
    Backend, BufferMut, BufferRef, DType, InitOptions, ProcessGroup, ReduceOp, RuntimeError,
};

use crate::completion::Completion;
use crate::errors::to_py;
use crate::memory::Region;
use crate::store::TorchStore;

/// The spin window of groups started from Python, unless `RINGCCL_SPIN_US` says
/// otherwise: Python's dispatch adds tens of microseconds of skew between ranks, so a
/// rank that stops spinning after ringccl's default 50 µs falls asleep on most calls.
const PYTHON_SPIN: Duration = Duration::from_micros(200);

/// The tags of the point-to-point messages `gather` and `scatter` are made of; user
/// tags are below them.
const GATHER_TAG: u32 = u32::MAX - 1;
const SCATTER_TAG: u32 = u32::MAX - 2;
/// User tags run from 0 to this, exclusive.
const USER_TAGS: u32 = 1 << 31;

/// What an operation does with the backend, given the call's deadline.
type Op = Box<dyn FnOnce(&dyn Backend, Deadline) -> Result<(), RuntimeError> + Send>;

/// How the Python half asks for a call on the group's worker: the callback its end
/// calls (`on_done(error)`), and the objects (tensors) to keep alive until then. Every
/// call without it runs on the calling thread.
type Queued = (Py<PyAny>, Vec<Py<PyAny>>);

/// One rank's ringccl process group (the Python half's backend holds one).
#[pyclass(frozen, module = "ringccl._ringccl")]
pub(crate) struct Group {
    pg: ProcessGroup,
}

/// The element-type codes the Python half passes: `{"float32": 0, ...}`.
#[pyfunction]
pub(crate) fn dtype_codes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let codes = PyDict::new(py);
    for (code, dtype) in DType::ALL.iter().enumerate() {
        codes.set_item(dtype.name(), code)?;
    }
    Ok(codes)
}

/// Joins rank `rank` of a group of `world_size` through torch's `store` (named
/// `store_name` in messages; reached from `local_ip` when it is a TCP store), with
/// `timeout` seconds as the deadline of start-up and of every call, named `group_name`
/// in the flight recorder's files (the main group's when `None`). The interpreter is
/// released while the ranks connect.
#[pyfunction]
#[pyo3(signature = (store, rank, world_size, timeout, store_name, local_ip=None, group_name=None))]
#[allow(clippy::too_many_arguments)] // torch's constructor arguments, passed through
pub(crate) fn init_group(
    py: Python<'_>,
    store: Py<PyAny>,
    rank: usize,
    world_size: usize,
    timeout: f64,
    store_name: String,
    local_ip: Option<String>,
    group_name: Option<String>,
) -> PyResult<Group> {
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(PyValueError::new_err(format!(
            "timeout must be a positive number of seconds, got {timeout}"
        )));
    }
    let timeout = Duration::from_secs_f64(timeout);
    let local_ip = match local_ip {
        Some(text) => Some(text.parse::<IpAddr>().map_err(|e| {
            PyValueError::new_err(format!("local_ip {text:?} is not an IP address: {e}"))
        })?),
        None => None,
    };
    let mut opts = InitOptions::new(rank, world_size, "")
        .timeout(timeout)
        .issue_from_any_thread();
    if std::env::var_os("RINGCCL_SPIN_US").is_none() {
        opts = opts.spin(PYTHON_SPIN);
    }
    if let Some(name) = group_name {
        opts = opts.group_name(name);
    }
    let store = TorchStore::new(store, rank, timeout, store_name, local_ip);
    let pg = py
        .detach(|| ringccl::init_process_group_with_store("gloo", Box::new(store), opts))
        .map_err(|e| to_py(py, e))?;
    Ok(Group { pg })
}

/// The element type with code `code` (an index into [`DType::ALL`]).
fn dtype(code: usize) -> PyResult<DType> {
    DType::ALL
        .get(code)
        .copied()
        .ok_or_else(|| PyValueError::new_err(format!("unknown element-type code {code}")))
}

/// The reduction with code `code` (an index into [`ReduceOp::ALL`]).
fn reduce_op(code: usize) -> PyResult<ReduceOp> {
    ReduceOp::ALL
        .get(code)
        .copied()
        .ok_or_else(|| PyValueError::new_err(format!("unknown reduce-op code {code}")))
}

/// A user's message tag, checked.
fn user_tag(tag: i64) -> PyResult<u32> {
    u32::try_from(tag)
        .ok()
        .filter(|&t| t < USER_TAGS)
        .ok_or_else(|| {
            PyValueError::new_err(format!("tag must be between 0 and 2^31 - 1, got {tag}"))
        })
}

impl Group {
    fn region(&self, py: Python<'_>, addr: usize, bytes: usize) -> PyResult<Region> {
        Region::new(addr, bytes).map_err(|e| to_py(py, e))
    }

    /// A call's input and output regions, which must not overlap.
    fn input_output(
        &self,
        py: Python<'_>,
        input: (usize, usize),
        output: (usize, usize),
    ) -> PyResult<(Region, Region)> {
        let input = self.region(py, input.0, input.1)?;
        let output = self.region(py, output.0, output.1)?;
        Group::disjoint(&[&input, &output])?;
        Ok((input, output))
    }

    /// A call that moves `input` into `output` (all-gather, all-to-all): `run` with the
    /// two as buffers of the element type `dtype_code` names.
    #[allow(clippy::too_many_arguments)] // the shared tail of two calls' arguments
    fn moving_call(
        &self,
        py: Python<'_>,
        name: &'static str,
        input: (usize, usize),
        output: (usize, usize),
        dtype_code: usize,
        queued: Option<Queued>,
        run: fn(&dyn Backend, BufferRef<'_>, BufferMut<'_>, Deadline) -> Result<(), RuntimeError>,
    ) -> PyResult<()> {
        let (input, mut output) = self.input_output(py, input, output)?;
        let dtype = dtype(dtype_code)?;
        let op: Op =
            Box::new(move |b, d| run(b, input.buffer_ref(dtype)?, output.buffer_mut(dtype)?, d));
        self.call(py, name, queued, op)
    }

    /// `regions` if no two of them overlap.
    fn disjoint(regions: &[&Region]) -> PyResult<()> {
        for (i, a) in regions.iter().enumerate() {
            if regions[i + 1..].iter().any(|b| !a.disjoint(b)) {
                return Err(PyValueError::new_err(
                    "the input and output tensors of a call overlap; pass a copy of the input",
                ));
            }
        }
        Ok(())
    }

    /// Runs `op` as the operation `name`: on this thread now, or, `queued`, on the
    /// group's worker, where its end calls `on_done` and releases what it keeps.
    fn call(
        &self,
        py: Python<'_>,
        name: &'static str,
        queued: Option<Queued>,
        op: Op,
    ) -> PyResult<()> {
        let Some((on_done, keep)) = queued else {
            let pg = &self.pg;
            return py.detach(|| pg.run(name, op)).map_err(|e| to_py(py, e));
        };
        let completion = Completion::new(on_done, keep);
        // The callback runs once the turn has passed on: Python code it runs (a future's
        // callbacks) may issue calls on this group, even blocking ones.
        let work = self.pg.run_async_and_then(name, op, move |outcome| {
            completion.finish(outcome.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        });
        // Dropping the handle leaves the call running; its end is reported to `on_done`.
        work.map(drop).map_err(|e| to_py(py, e))
    }
}

#[pymethods]
impl Group {
    /// This rank.
    fn rank(&self) -> usize {
        self.pg.rank()
    }

    /// Number of ranks.
    fn size(&self) -> usize {
        self.pg.world_size()
    }

    /// How this rank reaches rank `peer`: "self", "shm" or "tcp".
    fn peer_transport(&self, peer: usize) -> &'static str {
        self.pg.peer_transport(peer)
    }

    /// Breaks the group: the call running now and every later one fail, quoting `cause`,
    /// and the peers are told.
    fn abort(&self, cause: &str) {
        self.pg.as_backend().abort(cause);
    }

    /// All-reduce of the `bytes` bytes at `addr` in place.
    #[pyo3(signature = (addr, bytes, dtype_code, op_code, queued=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        addr: usize,
        bytes: usize,
        dtype_code: usize,
        op_code: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (mut buf, dtype, op) = (
            self.region(py, addr, bytes)?,
            dtype(dtype_code)?,
            reduce_op(op_code)?,
        );
        self.call(
            py,
            "all_reduce",
            queued,
            Box::new(move |b, d| b.all_reduce(buf.buffer_mut(dtype)?, op, d)),
        )
    }

    /// Broadcast of rank `root`'s bytes at `addr` into every rank's.
    #[pyo3(signature = (addr, bytes, dtype_code, root, queued=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        addr: usize,
        bytes: usize,
        dtype_code: usize,
        root: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (mut buf, dtype) = (self.region(py, addr, bytes)?, dtype(dtype_code)?);
        self.call(
            py,
            "broadcast",
            queued,
            Box::new(move |b, d| b.broadcast(buf.buffer_mut(dtype)?, root, d)),
        )
    }

    /// Reduction into rank `root`'s bytes at `addr` (the others' are left unspecified).
    #[pyo3(signature = (addr, bytes, dtype_code, op_code, root, queued=None))]
    #[allow(clippy::too_many_arguments)] // one per field of torch's call, flattened for speed
    fn reduce(
        &self,
        py: Python<'_>,
        addr: usize,
        bytes: usize,
        dtype_code: usize,
        op_code: usize,
        root: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (mut buf, dtype, op) = (
            self.region(py, addr, bytes)?,
            dtype(dtype_code)?,
            reduce_op(op_code)?,
        );
        self.call(
            py,
            "reduce",
            queued,
            Box::new(move |b, d| b.reduce(buf.buffer_mut(dtype)?, op, root, d)),
        )
    }

    /// All-gather: every rank's input, in rank order, into every rank's output.
    #[pyo3(signature = (input, output, dtype_code, queued=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        input: (usize, usize),
        output: (usize, usize),
        dtype_code: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        self.moving_call(
            py,
            "all_gather",
            input,
            output,
            dtype_code,
            queued,
            |b, i, o, d| b.all_gather(i, o, d),
        )
    }

    /// Reduce-scatter: block `r` of the inputs' reduction into rank `r`'s output.
    #[pyo3(signature = (input, output, dtype_code, op_code, queued=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: (usize, usize),
        output: (usize, usize),
        dtype_code: usize,
        op_code: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (input, mut output) = self.input_output(py, input, output)?;
        let (dtype, op) = (dtype(dtype_code)?, reduce_op(op_code)?);
        self.call(
            py,
            "reduce_scatter",
            queued,
            Box::new(move |b, d| {
                b.reduce_scatter(input.buffer_ref(dtype)?, output.buffer_mut(dtype)?, op, d)
            }),
        )
    }

    /// All-to-all of equal blocks: block `q` of rank `r`'s input becomes block `r` of
    /// rank `q`'s output.
    #[pyo3(signature = (input, output, dtype_code, queued=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        input: (usize, usize),
        output: (usize, usize),
        dtype_code: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        self.moving_call(
            py,
            "all_to_all",
            input,
            output,
            dtype_code,
            queued,
            |b, i, o, d| b.all_to_all(i, o, d),
        )
    }

    /// Gather into rank `root`: rank `r`'s input into `outputs[r]` (`outputs` is empty
    /// on the other ranks).
    #[pyo3(signature = (input, outputs, dtype_code, root, queued=None))]
    fn gather(
        &self,
        py: Python<'_>,
        input: (usize, usize),
        outputs: Vec<(usize, usize)>,
        dtype_code: usize,
        root: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (rank, n, dtype) = (self.pg.rank(), self.pg.world_size(), dtype(dtype_code)?);
        let input = self.region(py, input.0, input.1)?;
        let mut outputs = outputs
            .into_iter()
            .map(|(addr, bytes)| self.region(py, addr, bytes))
            .collect::<PyResult<Vec<_>>>()?;
        if rank == root && outputs.len() != n {
            return Err(PyValueError::new_err(format!(
                "gather: rank {root} gathers {n} tensors, got {}",
                outputs.len()
            )));
        }
        let mut all: Vec<&Region> = outputs.iter().collect();
        all.push(&input);
        Group::disjoint(&all)?;
        self.call(
            py,
            "gather",
            queued,
            Box::new(move |b, d| {
                if rank != root {
                    return b.send(input.buffer_ref(dtype)?, root, GATHER_TAG, d);
                }
                for (peer, out) in outputs.iter_mut().enumerate() {
                    let mut out = out.buffer_mut(dtype)?;
                    if peer == rank {
                        let own = input.buffer_ref(dtype)?;
                        copy_block(own.bytes(), out.bytes_mut())?;
                    } else {
                        b.recv(out, peer, GATHER_TAG, d)?;
                    }
                }
                Ok(())
            }),
        )
    }

    /// Scatter from rank `root`: its `inputs[r]` into rank `r`'s output (`inputs` is
    /// empty on the other ranks).
    #[pyo3(signature = (inputs, output, dtype_code, root, queued=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        inputs: Vec<(usize, usize)>,
        output: (usize, usize),
        dtype_code: usize,
        root: usize,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (rank, n, dtype) = (self.pg.rank(), self.pg.world_size(), dtype(dtype_code)?);
        let mut output = self.region(py, output.0, output.1)?;
        let inputs = inputs
            .into_iter()
            .map(|(addr, bytes)| self.region(py, addr, bytes))
            .collect::<PyResult<Vec<_>>>()?;
        if rank == root && inputs.len() != n {
            return Err(PyValueError::new_err(format!(
                "scatter: rank {root} scatters {n} tensors, got {}",
                inputs.len()
            )));
        }
        let mut all: Vec<&Region> = inputs.iter().collect();
        all.push(&output);
        Group::disjoint(&all)?;
        self.call(
            py,
            "scatter",
            queued,
            Box::new(move |b, d| {
                if rank != root {
                    return b.recv(output.buffer_mut(dtype)?, root, SCATTER_TAG, d);
                }
                for (peer, input) in inputs.iter().enumerate() {
                    let input = input.buffer_ref(dtype)?;
                    if peer == rank {
                        copy_block(input.bytes(), output.buffer_mut(dtype)?.bytes_mut())?;
                    } else {
                        b.send(input, peer, SCATTER_TAG, d)?;
                    }
                }
                Ok(())
            }),
        )
    }

    /// Sends the bytes at `addr` to rank `dst`, tagged `tag`.
    #[pyo3(signature = (addr, bytes, dtype_code, dst, tag, queued=None))]
    #[allow(clippy::too_many_arguments)] // one per field of torch's call, flattened for speed
    fn send(
        &self,
        py: Python<'_>,
        addr: usize,
        bytes: usize,
        dtype_code: usize,
        dst: usize,
        tag: i64,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (buf, dtype, tag) = (
            self.region(py, addr, bytes)?,
            dtype(dtype_code)?,
            user_tag(tag)?,
        );
        self.call(
            py,
            "send",
            queued,
            Box::new(move |b, d| b.send(buf.buffer_ref(dtype)?, dst, tag, d)),
        )
    }

    /// Receives rank `src`'s next message, which must carry `tag`, into `addr`.
    #[pyo3(signature = (addr, bytes, dtype_code, src, tag, queued=None))]
    #[allow(clippy::too_many_arguments)] // one per field of torch's call, flattened for speed
    fn recv(
        &self,
        py: Python<'_>,
        addr: usize,
        bytes: usize,
        dtype_code: usize,
        src: usize,
        tag: i64,
        queued: Option<Queued>,
    ) -> PyResult<()> {
        let (mut buf, dtype, tag) = (
            self.region(py, addr, bytes)?,
            dtype(dtype_code)?,
            user_tag(tag)?,
        );
        self.call(
            py,
            "recv",
            queued,
            Box::new(move |b, d| b.recv(buf.buffer_mut(dtype)?, src, tag, d)),
        )
    }

    /// Returns once every rank has entered the barrier.
    #[pyo3(signature = (queued=None))]
    fn barrier(&self, py: Python<'_>, queued: Option<Queued>) -> PyResult<()> {
        self.call(py, "barrier", queued, Box::new(|b, d| b.barrier(d)))
    }
}

/// Copies this rank's own block of a gather or scatter.
fn copy_block(from: &[u8], to: &mut [u8]) -> Result<(), RuntimeError> {
    if from.len() != to.len() {
        return Err(RuntimeError::InvalidArgument(format!(
            "this rank's own block has {} bytes but its slot {}",
            from.len(),
            to.len()
        )));
    }
    to.copy_from_slice(from);
    Ok(())
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("pg", &self.pg).finish()
    }
}
