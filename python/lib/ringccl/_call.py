"""One call being prepared: the tensors handed to ringccl as regions, the ones kept
alive until the call ends, and what runs once the data has arrived."""

import torch

from ringccl._codes import _BYTES, _NATIVE


class _Call:
    """One collective being prepared: the regions handed to ringccl, the tensors to keep
    alive, and what to do once the data has arrived (copy back, narrow, fold)."""

    __slots__ = ("keep", "after")

    def __init__(self, *keep):
        self.keep = list(keep)
        self.after = []

    def contiguous(self, tensor, writes):
        """`tensor`'s data, contiguous; copied back after the call if `writes`."""
        _check_cpu(tensor)
        if tensor.is_contiguous():
            return tensor
        dense = tensor.contiguous()
        self.keep.append(dense)
        if writes:
            self.after.append(lambda: tensor.copy_(dense))
        return dense

    def moving(self, tensor, writes):
        """`tensor` for a call that only moves its data: its region (contiguous, as the
        elements ringccl sends) and element code."""
        dense = self.contiguous(tensor, writes)
        data = _moving_view(dense)
        self.keep.append(data)
        return _region(data), _code_for_moving(dense)

    def finish(self):
        # Last registered, first run: a narrowing copy into a dense tensor comes before
        # the dense tensor's copy back into the caller's.
        for step in reversed(self.after):
            step()


def _check_cpu(tensor):
    if tensor.device.type != "cpu":
        raise ValueError(
            f"ringccl: a {tensor.device.type} tensor reached the CPU backend; use "
            f'init_process_group("cpu:ringccl,cuda:nccl") to send CUDA tensors to NCCL'
        )
    if tensor.is_sparse:
        raise ValueError("ringccl: sparse tensors are not supported")


def _region(tensor):
    return (tensor.data_ptr(), tensor.nbytes)


def _overlaps(a, b):
    if a.nbytes == 0 or b.nbytes == 0:
        return False
    (pa, na), (pb, nb) = _region(a), _region(b)
    return pa < pb + nb and pb < pa + na


def _code_for_moving(tensor):
    """The element code for a call that only moves `tensor`'s data."""
    return _NATIVE.get(tensor.dtype, _BYTES)


def _moving_view(tensor):
    """`tensor` (contiguous) as the elements a data-moving call sends."""
    if tensor.dtype in _NATIVE:
        return tensor
    return tensor.view(-1).view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)
