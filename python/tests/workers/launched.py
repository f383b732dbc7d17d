"""A script as a user writes it: init_process_group with one string changed, nothing
else ringccl-specific. argv: [init_method [backend]]."""

import json
import os
import sys

import torch
import torch.distributed as dist

method = sys.argv[1] if len(sys.argv) > 1 else "env://"
backend = sys.argv[2] if len(sys.argv) > 2 else "ringccl"
kwargs = {}
if not method.startswith("env://"):
    kwargs = dict(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
dist.init_process_group(backend, init_method=method, **kwargs)
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
gpu = None
if torch.cuda.is_available() and "cuda" in backend:
    g = torch.full((3,), float(rank + 1), device=f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    dist.all_reduce(g)
    gpu = g.cpu().tolist()
import ringccl  # only to report the version

line = json.dumps({
    "backend": dist.get_backend(), "sum": t.tolist(), "world": size, "rank": rank,
    "version": ringccl.__version__, "gpu": gpu,
})
print("RESULT " + line, flush=True)
if os.environ.get("RINGCCL_TEST_OUT"):  # launchers that interleave the ranks' output
    with open(os.path.join(os.environ["RINGCCL_TEST_OUT"], f"rank-{rank}.json"), "w") as f:
        f.write(line)
dist.destroy_process_group()
