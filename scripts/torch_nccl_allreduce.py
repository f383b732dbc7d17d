"""PyTorch's own NCCL all-reduce at world size 1, timed as ringccl-bench times it.

Run on a GPU machine (scripts/gpu-check.sh runs it beside `ringccl-bench --backend nccl
--np 1`, in the same run, so the two can be compared as a ratio):

    python3 scripts/torch_nccl_allreduce.py --min 8 --max 67108864 --factor 8

torch.distributed with "nccl", one rank, a float32 CUDA tensor reduced in place with SUM.
Per size: 5 warm-up calls, then back-to-back calls for about --budget seconds.
  us_sync = median over calls of (all_reduce + torch.cuda.synchronize()): the time until
            the result is there, which is what ringccl's blocking all_reduce_device returns
            after (the fair per-call comparison)
  us_loop = (one loop of calls, then one synchronize) / calls: torch enqueues and
            returns at once, so this is its pipelined throughput
"""
import argparse
import os
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--min", type=int, default=8)
    p.add_argument("--max", type=int, default=64 << 20)
    p.add_argument("--factor", type=int, default=8)
    p.add_argument("--budget", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()

    import datetime
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("torch_nccl_allreduce: skipped: torch sees no CUDA device")
        return 0
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=args.timeout),
        device_id=torch.device("cuda", 0),
    )
    print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{torch.cuda.get_device_name()}, world size 1, float32 sum, in place")
    print(f"{'bytes':>12} {'us_sync':>10} {'us_loop':>10} {'iters':>8}")
    size = args.min
    while True:
        n = max(1, size // 4)
        x = torch.ones(n, dtype=torch.float32, device="cuda")
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        times = []
        start = time.perf_counter()
        while time.perf_counter() - start < args.budget or len(times) < 5:
            t = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        iters = len(times)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        loop = (time.perf_counter() - t) / iters
        if not torch.all(x == 1.0).item():
            print(f"torch_nccl_allreduce: wrong result at {size} bytes", file=sys.stderr)
            return 1
        print(f"{n * 4:>12} {statistics.median(times) * 1e6:>10.2f} {loop * 1e6:>10.2f} {iters:>8}")
        if size >= args.max:
            break
        size = min(size * args.factor, args.max)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
