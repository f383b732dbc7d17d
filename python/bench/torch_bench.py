"""torch.distributed on ringccl against torch's gloo, in one run: dist.all_reduce from
8 B to 64 MiB, and the step time of DDP training a CPU model.

    python python/bench/torch_bench.py --np 2 4

Each rank joins the default group on "ringccl" and a second group of the same ranks on
"gloo"; the two are timed in alternating rounds on the same tensors, so both see the
same machine. A call's time is the slowest rank's mean over a round; the figure kept is
the best round's. Rank 0 prints one table per world size.
"""

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time


def sizes(hi):
    """8 B, then every eighth power up to `hi`, with 64 KiB and `hi` itself."""
    found = {8, 64 << 10, hi}
    n = 8
    while n <= hi:
        found.add(n)
        n *= 8
    return sorted(s for s in found if s <= hi)


def rank_main(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["RINGCCL_BENCH_STORE"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=300))
    dist.init_process_group("ringccl", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    groups = {"ringccl": None, "gloo": gloo}
    clock = torch.zeros(1, dtype=torch.float64)

    def slowest(seconds):
        clock[0] = seconds
        dist.all_reduce(clock, op=dist.ReduceOp.MAX, group=gloo)
        return float(clock[0])

    rows = []
    for nbytes in sizes(args.max_bytes):
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        iters = max(3, min(2000, int(args.budget / (1e-5 + nbytes * 2e-9))))
        best = {name: float("inf") for name in groups}
        for _ in range(args.rounds):
            for name, group in groups.items():
                for _ in range(max(1, iters // 10)):
                    dist.all_reduce(t, group=group)
                dist.barrier(group=gloo)
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=group)
                mean = (time.perf_counter() - start) / iters
                best[name] = min(best[name], slowest(mean))
        rows.append(("all_reduce", nbytes, best["ringccl"], best["gloo"]))

    # DDP: an MLP of about 4.2 M parameters, batch 64, SGD.
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))

    ddps = {name: DDP(model(), process_group=group) for name, group in groups.items()}
    opts = {name: torch.optim.SGD(d.parameters(), lr=0.01) for name, d in ddps.items()}
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    steps = {name: [] for name in groups}
    for _ in range(args.ddp_rounds):
        for name, ddp in ddps.items():
            for i in range(args.ddp_steps + 2):
                dist.barrier(group=gloo)
                start = time.perf_counter()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opts[name].step()
                opts[name].zero_grad()
                took = slowest(time.perf_counter() - start)
                if i >= 2:
                    steps[name].append(took)
    params = sum(p.numel() for p in ddps["ringccl"].parameters())
    rows.append(("ddp_step", params * 4, statistics.median(steps["ringccl"]),
                 statistics.median(steps["gloo"])))
    if rank == 0:
        print(f"# world size {size}: ringccl (torch.distributed backend) vs torch gloo, same run")
        print(f"# {'what':>10} {'bytes':>10} {'ringccl us':>12} {'gloo us':>12} {'ratio':>7}")
        for what, nbytes, ours, theirs in rows:
            print(f"  {what:>10} {nbytes:>10} {ours * 1e6:>12.1f} {theirs * 1e6:>12.1f} {ours / theirs:>7.3f}")
        sys.stdout.flush()
    dist.destroy_process_group()


def driver(args):
    import torch.distributed as dist

    for n in args.np:
        store = dist.TCPStore("127.0.0.1", 0, n + 1, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=600))
        procs = []
        for rank in range(n):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                       RINGCCL_BENCH_STORE=f"127.0.0.1:{store.port}", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", *sys.argv[1:]],
                                          env=env))
        codes = [p.wait() for p in procs]
        del store
        if any(codes):
            sys.exit(f"a rank failed: exit codes {codes}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, nargs="+", default=[2, 4], help="world sizes to run")
    parser.add_argument("--max-bytes", type=int, default=64 << 20, help="largest all-reduce")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per size")
    parser.add_argument("--budget", type=float, default=0.05, help="seconds per round and size")
    parser.add_argument("--ddp-steps", type=int, default=10, help="DDP steps per round")
    parser.add_argument("--ddp-rounds", type=int, default=3, help="alternating DDP rounds")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
