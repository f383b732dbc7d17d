"""A job that goes wrong, as the mode on the command line says; each surviving rank
reports what it raised and how long that took. Prints RESULT {"error": str|None,
"type": str, "seconds": float}."""

import os
import sys
import time

import torch
import torch.distributed as dist

from common import init, result

mode = sys.argv[1]
rank, size = init("ringccl", timeout=20)
dist.barrier()
started = time.monotonic()
error = None
kind = ""
try:
    if mode == "shape_mismatch":
        # Rank 1 thinks the gradient has one more element.
        dist.all_reduce(torch.ones(1000 + (rank == 1)))
    elif mode == "dtype_mismatch":
        dist.all_reduce(torch.ones(64, dtype=torch.float32 if rank != 1 else torch.int32))
    elif mode == "killed_rank":
        print("READY", flush=True)
        if rank == size - 1:
            time.sleep(60)  # the test kills it here
        time.sleep(0.5)
        for _ in range(3):
            dist.all_reduce(torch.ones(1 << 16))
    elif mode == "monitored_barrier":
        import datetime

        if rank == 1:
            time.sleep(4)  # late: rank 0 waits 2 s
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=True)
    elif mode == "async_failure":
        work = dist.all_reduce(torch.ones(100 + (rank == 1)), async_op=True)
        work.wait()
except Exception as e:  # what the user's script would see
    error, kind = str(e), type(e).__name__
result({"error": error, "type": kind, "seconds": time.monotonic() - started})
sys.stdout.flush()
os._exit(0)  # the group is broken: skip destroy_process_group's goodbyes
