"""How torch's element types and reduction operators map onto ringccl's codes."""

import torch
from torch._C._distributed_c10d import ReduceOp

from ringccl import _ringccl

_CODES = _ringccl.dtype_codes()
# torch's element types that ringccl reduces natively.
_NATIVE = {
    torch.float32: _CODES["f32"],
    torch.float64: _CODES["f64"],
    torch.float16: _CODES["f16"],
    torch.bfloat16: _CODES["bf16"],
    torch.int8: _CODES["i8"],
    torch.uint8: _CODES["u8"],
    torch.int32: _CODES["i32"],
    torch.int64: _CODES["i64"],
}
_BYTES = _CODES["u8"]
# Reduced in a wider type and narrowed back: wrapping sums and products agree modulo
# 2^16 (2^32), and minimum and maximum are exact.
_WIDENED = {torch.int16: torch.int32, torch.uint16: torch.int32, torch.uint32: torch.int64}
_INTEGER = {
    torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32,
    torch.int64, torch.uint64, torch.bool,
}

_T = ReduceOp.RedOpType
# ringccl's operator codes (the order of ringccl::ReduceOp::ALL).
_SUM, _PRODUCT, _MIN, _MAX, _AVG = range(5)
_DIRECT = {_T.SUM: _SUM, _T.PRODUCT: _PRODUCT, _T.MIN: _MIN, _T.MAX: _MAX, _T.AVG: _AVG}
# bool as bytes: a sum is "any", a product "all" (gloo's results).
_BOOL = {_T.SUM: _MAX, _T.PRODUCT: _MIN, _T.MIN: _MIN, _T.MAX: _MAX, _T.BAND: _MIN, _T.BOR: _MAX}
_BITWISE = {_T.BAND: torch.bitwise_and, _T.BOR: torch.bitwise_or, _T.BXOR: torch.bitwise_xor}


def _red_op(op):
    kind = op.op if isinstance(op, ReduceOp) else op
    factor = op.factor if kind == _T.PREMUL_SUM else None
    return kind, factor
