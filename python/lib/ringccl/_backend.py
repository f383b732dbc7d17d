"""The "ringccl" torch.distributed backend: a c10d ``Backend`` whose collectives run on
ringccl's process group (``ringccl._ringccl.Group``) over CPU tensors.

Calls with ``async_op=False`` run on the calling thread with the GIL released; the
others (DDP's bucket all-reduces among them) are queued on the group's worker and
complete a torch future. Either way each call takes its place in the group's issue
order, whatever thread issued it, as gloo orders them.
"""

import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10DBackend

from ringccl import _ringccl
from ringccl._call import _Call, _check_cpu, _code_for_moving, _moving_view, _overlaps, _region
from ringccl._codes import (
    _BITWISE, _BOOL, _BYTES, _DIRECT, _INTEGER, _MAX, _NATIVE, _SUM, _T, _WIDENED, _red_op,
)
from ringccl._store import _describe_store
from ringccl._work import _NO_TIMEOUT, _Work, _error, _last, _then

__all__ = ["RingcclBackend", "register"]

NAME = "ringccl"


class RingcclBackend(C10DBackend):
    """torch.distributed's view of one ringccl process group (CPU tensors)."""

    def __init__(self, store, rank, size, timeout, group_name=""):
        super().__init__(rank, size)
        self._timeout = timeout
        self._options = C10DBackend.Options(NAME, timeout=timeout)
        self._store = store
        self._group_name = group_name
        self._monitored = 0
        self._lock = threading.Lock()
        # The point-to-point calls of a batch_isend_irecv being recorded, if one is.
        self._batch = None
        name, local_ip = _describe_store(store)
        # torch's default group is "0"; the flight recorder names the others apart.
        flight_name = None if group_name in ("", "0") else f"torch-{group_name}"
        self._group = _ringccl.init_group(
            store, rank, size, timeout.total_seconds(), name, local_ip, flight_name
        )

    # --- what torch asks of a backend -------------------------------------------------

    @property
    def options(self):
        return self._options

    @property
    def supports_splitting(self):
        return True

    @property
    def supports_coalescing(self):
        # torch's batch_isend_irecv then hands over the whole batch (see end_coalescing).
        return True

    def start_coalescing(self):
        self._batch = []

    def end_coalescing(self):
        """Runs the point-to-point calls recorded since start_coalescing (torch's
        batch_isend_irecv) in an order that cannot deadlock a pairwise exchange or a
        ring, whatever order each rank listed them in: peer by peer, lowest first, and
        with each peer the lower rank sends first. ringccl runs a rank's calls one at a
        time, and a large send waits for its receiver."""
        batch, self._batch = self._batch or [], None
        rank = self.rank()

        def turn(entry):
            index, (kind, _, peer, _) = entry
            sends_first = rank < peer
            return (peer, 0 if (kind == "send") == sends_first else 1, index)

        works = []
        for _, (kind, tensor, peer, tag) in sorted(enumerate(batch), key=turn):
            method = RingcclBackend.send if kind == "send" else RingcclBackend.recv
            works.append(method(self, [tensor], peer, tag))
        return _last(works, [t for _, t, _, _ in batch])

    def getBackendName(self):
        return NAME

    def split(self, store, ranks, opts=None):
        """torch's split_group: the members of `ranks` (ranks of this group) form a new
        group through `store`; the others get None."""
        ranks = list(ranks)
        if self.rank() not in ranks:
            return None
        timeout = getattr(opts, "_timeout", None) or self._timeout
        name = getattr(opts, "group_name", "") or f"{self._group_name}-split"
        return RingcclBackend(store, ranks.index(self.rank()), len(ranks), timeout, name)

    def abort(self):
        self._group.abort("torch.distributed aborted the process group")

    def shutdown(self):
        pass

    # --- running a call ---------------------------------------------------------------

    def _run(self, method, args, call, result, asynchronous):
        """Runs `method(*args)` on the group, synchronously or on the worker, and returns
        the torch Work whose result is `result`."""
        if not asynchronous:
            method(*args)
            call.finish()
            return _Work(result)
        future = torch.futures.Future()

        def on_done(error):
            if error is None:
                try:
                    call.finish()
                except Exception as failure:  # a copy-back failed: the call failed
                    future.set_exception(failure)
                    return
                future.set_result(result)
            else:
                future.set_exception(_error(error))

        method(*args, (on_done, call.keep))
        return _Work(result, future)

    def _reduce_plan(self, call, tensor, op):
        """How to reduce `tensor` (contiguous, in place) with torch's `op`: the tensor
        ringccl works on, its element code and ringccl's operator code; or None when the
        operator needs the gather-and-fold path."""
        kind, factor = _red_op(op)
        dtype = tensor.dtype
        if kind == _T.PREMUL_SUM:
            if factor is None:
                raise ValueError("ringccl: PREMUL_SUM needs a factor")
            tensor.mul_(factor)
            kind = _T.SUM
        if dtype == torch.bool:
            if kind == _T.AVG:
                raise ValueError("ringccl: AVG does not apply to bool tensors")
            if kind == _T.BXOR:
                return None
            return tensor.view(torch.uint8), _BYTES, _BOOL[kind]
        if kind in _BITWISE:
            if dtype not in _INTEGER:
                raise ValueError(f"ringccl: {kind.name} applies to integer tensors, not {dtype}")
            return None
        if kind == _T.AVG and dtype in _INTEGER:
            raise ValueError(f"ringccl: AVG applies to floating-point tensors, not {dtype}")
        if dtype.is_complex:
            if kind not in (_T.SUM, _T.AVG):
                raise ValueError(f"ringccl: {kind.name} does not apply to complex tensors")
            real = torch.view_as_real(tensor)
            return real, _NATIVE[real.dtype], _DIRECT[kind]
        if dtype in _WIDENED:
            wide = tensor.to(_WIDENED[dtype])
            call.keep.append(wide)
            call.after.append(lambda: tensor.copy_(wide))
            return wide, _NATIVE[wide.dtype], _DIRECT[kind]
        if dtype not in _NATIVE:
            raise ValueError(f"ringccl: cannot reduce {dtype} tensors")
        return tensor, _NATIVE[dtype], _DIRECT[kind]

    def _fold(self, kind, gathered):
        """Reduces the rows of `gathered` (one per rank, in rank order) with a bitwise
        operator, the same way on every rank."""
        fold = _BITWISE[kind]
        out = gathered[0].clone()
        for row in gathered[1:]:
            out = fold(out, row)
        return out

    # --- the collectives --------------------------------------------------------------

    def allreduce(self, tensors, opts):
        asynchronous = opts.asyncOp
        if len(tensors) == 1 and not asynchronous:
            # The common blocking call, kept short: one dense CPU tensor of a native type,
            # summed (the general path below does the same, with more to check).
            tensor = tensors[0]
            code = _NATIVE.get(tensor.dtype)
            if (
                code is not None
                and opts.reduceOp == _T.SUM
                and tensor.is_cpu
                and tensor.layout is torch.strided
                and tensor.is_contiguous()
            ):
                self._group.all_reduce(tensor.data_ptr(), tensor.nbytes, code, _SUM)
                return _Work(tensors)
        call = _Call()
        if len(tensors) == 1:
            tensor = tensors[0]
            dense = call.contiguous(tensor, writes=True)
            plan = self._reduce_plan(call, dense, opts.reduceOp)
            if plan is None:
                return self._allreduce_by_gather(tensors, opts)
            work_on, code, op = plan
            call.keep.append(work_on)
            return self._run(
                self._group.all_reduce, (*_region(work_on), code, op), call, tensors, asynchronous
            )
        return self.allreduce_coalesced(tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        """Several tensors of one type, reduced as one flat buffer (as gloo does)."""
        if not tensors:
            return _Work([])
        for t in tensors:
            _check_cpu(t)
        if len({t.dtype for t in tensors}) != 1:
            raise ValueError("ringccl: tensors reduced together must share one element type")
        call = _Call()
        flat = torch.cat([t.reshape(-1) for t in tensors])
        # Registered first, so it runs last: after a widened result is narrowed into flat.
        call.after.append(lambda: _unflatten(flat, tensors))
        plan = self._reduce_plan(call, flat, opts.reduceOp)
        if plan is None:
            raise ValueError("ringccl: bitwise operators take one tensor per call")
        work_on, code, op = plan
        call.keep.append(work_on)
        asynchronous = getattr(opts, "asyncOp", True)
        return self._run(
            self._group.all_reduce, (*_region(work_on), code, op), call, tensors, asynchronous
        )

    def _allreduce_by_gather(self, tensors, opts, writes=True):
        """BAND, BOR and BXOR (and bool BXOR): every rank's tensor gathered, folded in rank
        order on every rank, so every rank gets the same bits."""
        (tensor,) = tensors
        kind, _ = _red_op(opts.reduceOp)
        dense = tensor.contiguous()
        source = _moving_view(dense)
        gathered = torch.empty((self.size(), *source.shape), dtype=source.dtype)
        call = _Call()
        call.keep += [dense, source, gathered]

        def fold():
            rows = gathered if dense.dtype in _NATIVE else gathered.view(dense.dtype)
            rows = rows.view(self.size(), *dense.shape)
            if writes:
                tensor.copy_(self._fold(kind, list(rows.unbind(0))))

        call.after.append(fold)
        return self._run(
            self._group.all_gather,
            (_region(source), _region(gathered), _code_for_moving(dense)),
            call,
            tensors,
            opts.asyncOp,
        )

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        if len(tensors) != 1:
            raise ValueError("ringccl: broadcast takes one tensor per call")
        call = _Call()
        region, code = call.moving(tensors[0], writes=self.rank() != root)
        return self._run(self._group.broadcast, (*region, code, root), call, tensors, opts.asyncOp)

    def reduce(self, tensors, opts):
        call = _Call()
        if len(tensors) != 1:
            raise ValueError("ringccl: reduce takes one tensor per call")
        tensor = tensors[0]
        dense = call.contiguous(tensor, writes=True)
        kind, _ = _red_op(opts.reduceOp)
        if kind in _BITWISE or (tensor.dtype == torch.bool and kind == _T.BXOR):
            # Every rank gathers; only the root keeps the result (gloo leaves the others'
            # tensors as they were).
            return self._allreduce_by_gather(tensors, opts, writes=self.rank() == opts.rootRank)
        # ringccl leaves partial results in the other ranks' buffers; torch (gloo)
        # leaves them untouched: reduce a copy there.
        root = opts.rootRank
        if self.rank() != root:
            dense = dense.clone()
            call.keep.append(dense)
            call.after.clear()
        work_on, code, op = self._reduce_plan(call, dense, opts.reduceOp)
        call.keep.append(work_on)
        return self._run(
            self._group.reduce, (*_region(work_on), code, op, root), call, tensors, opts.asyncOp
        )

    def allgather(self, output_tensors, input_tensors, opts):
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError("ringccl: allgather takes one input tensor per call")
        outputs = output_tensors[0]
        if len(outputs) != self.size():
            raise ValueError(
                f"ringccl: allgather needs {self.size()} output tensors, got {len(outputs)}"
            )
        call = _Call()
        dense = call.contiguous(input_tensors[0], writes=False)
        data = _moving_view(dense)
        flat = torch.empty((self.size() * data.numel(),), dtype=data.dtype)
        call.keep += [data, flat]

        def spread():
            for i, out in enumerate(outputs):
                block = flat[i * data.numel() : (i + 1) * data.numel()]
                out.copy_(block.view(dense.dtype).view_as(out) if data is not dense else block.view_as(out))

        call.after.append(spread)
        return self._run(
            self._group.all_gather,
            (_region(data), _region(flat), _code_for_moving(dense)),
            call,
            output_tensors,
            opts.asyncOp,
        )

    def all_gather_single(self, output, input, opts):
        call = _Call()
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                f"ringccl: all_gather_into_tensor needs an output of {self.size()} x "
                f"{input.numel()} elements, got {output.numel()}"
            )
        dense_out = call.contiguous(output, writes=True)
        dense_in = call.contiguous(input, writes=False)
        if _overlaps(dense_in, dense_out):
            dense_in = dense_in.clone()
            call.keep.append(dense_in)
        source, target = _moving_view(dense_in), _moving_view(dense_out)
        call.keep += [source, target]
        return self._run(
            self._group.all_gather,
            (_region(source), _region(target), _code_for_moving(dense_in)),
            call,
            [output],
            opts.asyncOp,
        )

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_tensors, opts):
        """`output_lists[r][i]` receives rank r's `input_tensors[i]`."""
        if len(output_lists) != self.size():
            raise ValueError(
                f"ringccl: all_gather_coalesced needs {self.size()} output lists, "
                f"got {len(output_lists)}"
            )
        works = [
            self.allgather([[outs[i] for outs in output_lists]], [inp], opts)
            for i, inp in enumerate(input_tensors)
        ]
        return _last(works, output_lists)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _last(works, outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError("ringccl: reduce_scatter takes one output tensor per call")
        inputs = input_tensors[0]
        if len(inputs) != self.size():
            raise ValueError(
                f"ringccl: reduce_scatter needs {self.size()} input tensors, got {len(inputs)}"
            )
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self._reduce_scatter_flat(output_tensors[0], flat, opts, output_tensors)

    def reduce_scatter_single(self, output, input, opts):
        if input.numel() != output.numel() * self.size():
            raise ValueError(
                f"ringccl: reduce_scatter_tensor needs an input of {self.size()} x "
                f"{output.numel()} elements, got {input.numel()}"
            )
        flat = input.reshape(-1).clone()
        return self._reduce_scatter_flat(output, flat, opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _last(works, outputs)

    def _reduce_scatter_flat(self, output, flat, opts, result):
        """Reduce-scatter of `flat` (a private copy of the inputs) into `output`."""
        call = _Call()
        call.keep.append(flat)
        kind, _ = _red_op(opts.reduceOp)
        if kind in _BITWISE or (flat.dtype == torch.bool and kind == _T.BXOR):
            raise ValueError(f"ringccl: reduce_scatter does not support {kind.name}")
        work_in, code, op = self._reduce_plan(call, flat, opts.reduceOp)
        dense_out = call.contiguous(output, writes=True)
        if work_in.dtype != flat.dtype:  # widened: reduce into a wide output too
            wide_out = torch.empty(dense_out.shape, dtype=work_in.dtype)
            call.keep.append(wide_out)
            call.after.append(lambda: dense_out.copy_(wide_out))
            work_out = wide_out
        elif flat.dtype == torch.bool:
            work_out = dense_out.view(torch.uint8)
        elif flat.dtype.is_complex:
            work_out = torch.view_as_real(dense_out)
        else:
            work_out = dense_out
        call.keep += [work_in, work_out]
        return self._run(
            self._group.reduce_scatter,
            (_region(work_in), _region(work_out), code, op),
            call,
            result,
            opts.asyncOp,
        )

    def alltoall(self, output_tensors, input_tensors, opts):
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"ringccl: alltoall needs {n} input and {n} output tensors")
        dtype = input_tensors[0].dtype
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        in_splits = [t.numel() for t in input_tensors]
        out_splits = [t.numel() for t in output_tensors]
        flat_out = torch.empty((sum(out_splits),), dtype=dtype)
        work = self._all_to_all_flat(flat_out, flat_in, out_splits, in_splits, opts, output_tensors)
        return _then(work, lambda: _unflatten(flat_out, output_tensors), output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        n = self.size()
        rows_in = input.size(0) if input.dim() else 1
        rows_out = output.size(0) if output.dim() else 1
        row_in = input.numel() // rows_in if rows_in else 0
        row_out = output.numel() // rows_out if rows_out else 0
        in_splits = list(input_split_sizes) or [rows_in // n] * n
        out_splits = list(output_split_sizes) or [rows_out // n] * n
        if len(in_splits) != n or len(out_splits) != n:
            raise ValueError(f"ringccl: all_to_all_single needs {n} split sizes")
        if sum(in_splits) != rows_in or sum(out_splits) != rows_out:
            raise ValueError(
                "ringccl: all_to_all_single's split sizes must add up to the tensors' first "
                f"dimensions ({rows_in} in, {rows_out} out)"
            )
        flat_in = input.contiguous().reshape(-1)
        if _overlaps(flat_in, output):
            flat_in = flat_in.clone()
        flat_out = output.reshape(-1) if output.is_contiguous() else torch.empty(output.numel(), dtype=output.dtype)
        work = self._all_to_all_flat(
            flat_out,
            flat_in,
            [s * row_out for s in out_splits],
            [s * row_in for s in in_splits],
            opts,
            [output],
        )
        if flat_out.data_ptr() == output.data_ptr() and output.is_contiguous():
            return work
        return _then(work, lambda: output.copy_(flat_out.view_as(output)), [output])

    alltoall_base = all_to_all_single

    def _all_to_all_flat(self, flat_out, flat_in, out_counts, in_counts, opts, result):
        """All-to-all of uneven blocks (element counts per rank) as ringccl's all-to-all of
        equal blocks: each block padded to the largest any rank sends (agreed first with a
        max all-reduce)."""
        n = self.size()
        call = _Call()
        local_max = max(in_counts + out_counts) if n else 0
        agreed = torch.tensor([local_max], dtype=torch.int64)
        self._group.all_reduce(*_region(agreed), _NATIVE[torch.int64], _MAX)
        block = int(agreed.item())
        data_in = _moving_view(flat_in)
        scale = data_in.numel() // flat_in.numel() if flat_in.numel() else 1
        padded_in = torch.zeros((n * block * scale,), dtype=data_in.dtype)
        offset = 0
        for peer, count in enumerate(in_counts):
            padded_in[peer * block * scale : (peer * block + count) * scale] = data_in[
                offset * scale : (offset + count) * scale
            ]
            offset += count
        padded_out = torch.empty_like(padded_in)
        call.keep += [padded_in, padded_out]
        data_out = _moving_view(flat_out)

        def unpad():
            offset = 0
            for peer, count in enumerate(out_counts):
                data_out[offset * scale : (offset + count) * scale] = padded_out[
                    peer * block * scale : (peer * block + count) * scale
                ]
                offset += count

        call.after.append(unpad)
        call.keep.append(data_out)
        return self._run(
            self._group.all_to_all,
            (_region(padded_in), _region(padded_out), _code_for_moving(flat_in)),
            call,
            result,
            opts.asyncOp,
        )

    def gather(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        if len(input_tensors) != 1:
            raise ValueError("ringccl: gather takes one input tensor per call")
        call = _Call()
        source, code = call.moving(input_tensors[0], writes=False)
        targets = []
        if self.rank() == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self.size():
                raise ValueError(f"ringccl: gather's root needs {self.size()} output tensors")
            targets = [call.moving(out, writes=True)[0] for out in output_tensors[0]]
        return self._run(
            self._group.gather, (source, targets, code, root), call, output_tensors, opts.asyncOp
        )

    def scatter(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        if len(output_tensors) != 1:
            raise ValueError("ringccl: scatter takes one output tensor per call")
        call = _Call()
        target, code = call.moving(output_tensors[0], writes=True)
        sources = []
        if self.rank() == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
                raise ValueError(f"ringccl: scatter's root needs {self.size()} input tensors")
            sources = [call.moving(inp, writes=False)[0] for inp in input_tensors[0]]
        return self._run(
            self._group.scatter, (sources, target, code, root), call, output_tensors, opts.asyncOp
        )

    def send(self, tensors, dst, tag=0):
        if len(tensors) != 1:
            raise ValueError("ringccl: send takes one tensor per call")
        if self._batch is not None:  # inside batch_isend_irecv: runs at end_coalescing
            self._batch.append(("send", tensors[0], dst, tag))
            return _Work(tensors)
        call = _Call()
        region, code = call.moving(tensors[0], writes=False)
        return self._run(self._group.send, (*region, code, dst, tag), call, tensors, True)

    def recv(self, tensors, src, tag=0):
        if len(tensors) != 1:
            raise ValueError("ringccl: recv takes one tensor per call")
        if self._batch is not None:  # inside batch_isend_irecv: runs at end_coalescing
            self._batch.append(("recv", tensors[0], src, tag))
            return _Work(tensors)
        call = _Call()
        region, code = call.moving(tensors[0], writes=True)
        return self._run(self._group.recv, (*region, code, src, tag), call, tensors, True)

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("ringccl: receiving from any source is not supported; name the sender")

    def barrier(self, opts):
        call = _Call()
        return self._run(self._group.barrier, (), call, [], opts.asyncOp)

    def monitored_barrier(self, opts, wait_all_ranks=False):
        """Every rank checks in through the store; rank 0 waits `opts.timeout` for all
        and names the ranks that did not come (all of them with `wait_all_ranks`, else the
        first), then releases the others."""
        timeout = opts.timeout if opts.timeout > _NO_TIMEOUT else self._timeout
        with self._lock:
            self._monitored += 1
            key = f"ringccl/monitored_barrier/{self._monitored}"
        store, rank, size = self._store, self.rank(), self.size()
        store.set(f"{key}/{rank}", b"1")
        seconds = timeout.total_seconds()
        if rank == 0:
            deadline = time.monotonic() + seconds
            missing = list(range(1, size))
            while missing and time.monotonic() < deadline:
                missing = [r for r in missing if not store.check([f"{key}/{r}"])]
                if missing:
                    time.sleep(0.01)
            if missing:
                named = missing if wait_all_ranks else missing[:1]
                store.set(f"{key}/done", f"failed: {named}".encode())
                raise _error(
                    f"ringccl monitored_barrier: rank(s) {', '.join(map(str, named))} did not "
                    f"reach the barrier within {seconds:g} s (rank 0 waited for them)"
                )
            store.set(f"{key}/done", b"ok")
            return
        old = store.timeout
        try:
            store.set_timeout(timeout)
            store.wait([f"{key}/done"])
        except Exception as error:
            raise _error(
                f"ringccl monitored_barrier: rank {rank} was not released by rank 0 within "
                f"{seconds:g} s ({error})"
            ) from None
        finally:
            store.set_timeout(old)
        if store.get(f"{key}/done") != b"ok":
            raise _error(
                f"ringccl monitored_barrier: rank 0 reported {store.get(f'{key}/done').decode()}"
            )


def _unflatten(flat, tensors):
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def _create(opts, backend_options=None):
    """torch's constructor hook (the extended API): one backend per group."""
    return RingcclBackend(
        opts.store, opts.group_rank, opts.group_size, opts.timeout, str(opts.group_id)
    )


def register():
    """Registers "ringccl" with torch.distributed for CPU tensors (idempotent)."""
    if NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])
