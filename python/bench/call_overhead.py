"""Where an 8-byte all-reduce's time goes through torch, at world size 1 (no peer, so
no waiting): `dist.all_reduce`, the backend's `allreduce` method called directly, and
ringccl's native call.

    python python/bench/call_overhead.py [--calls 5000]
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions


def per_call(fn, calls):
    for _ in range(calls // 5):
        fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    dist.init_process_group("ringccl", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(2)
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    opts = AllreduceOptions()
    opts.asyncOp = False
    native = backend._group
    rows = [
        ("dist.all_reduce", per_call(lambda: dist.all_reduce(t), args.calls)),
        ("backend.allreduce", per_call(lambda: backend.allreduce([t], opts), args.calls)),
        ("native all_reduce", per_call(lambda: native.all_reduce(t.data_ptr(), 8, 0, 0), args.calls)),
    ]
    print("# world size 1, 8-byte float32 sum, best of 3 loops")
    for what, us in rows:
        print(f"  {what:>20} {us:8.1f} us per call")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
