#!/usr/bin/env python3
"""PyTorch DDP's handling of parameters unused on some or all ranks, for comparison
with ringccl's `unused_everywhere()` (tests/ddp.rs,
parameters_unused_on_every_rank_are_named_on_every_rank).

3 ranks (processes, gloo), find_unused_parameters=True, a model with a "trunk" (4
values, used by every rank) and a "head" (2 values):
  step 1: only rank 2 uses the head (gradient 3, 3);
  step 2: no rank uses it;
  step 3: rank 0 uses it in a no_sync micro-batch, nobody in the synchronised pass.
Prints, per step, each parameter's gradient on rank 0 after backward, or None where
torch left it untouched (its globally unused parameters).

    python3 scripts/torch_unused_parity.py
"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Parameter(torch.zeros(4))
        self.head = torch.nn.Parameter(torch.zeros(2))

    def forward(self, use_head):
        # d(loss)/d(trunk) = 1 for every value; d(loss)/d(head) = 3 where used.
        loss = self.trunk.sum()
        if use_head:
            loss = loss + 3.0 * self.head.sum()
        return loss


def rank_main(rank, world, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ddp = torch.nn.parallel.DistributedDataParallel(Model(), find_unused_parameters=True)
    lines = []
    # (step, ranks using the head, ranks using it in a no_sync micro-batch first)
    for step, users, unsynced_users in [(1, {2}, None), (2, set(), None), (3, set(), {0})]:
        for p in ddp.parameters():
            p.grad = None
        if unsynced_users is not None:
            with ddp.no_sync():
                ddp(rank in unsynced_users).backward()
        ddp(rank in users).backward()
        grads = {
            name: (None if p.grad is None else [round(x, 6) for x in p.grad.tolist()])
            for name, p in ddp.module.named_parameters()
        }
        unused = [name for name, g in grads.items() if g is None]
        lines.append(f"step {step}: grads {grads} unused_everywhere {unused}")
    if rank == 0:
        out.put("\n".join(lines))
    dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, 3, port, out)) for r in range(3)]
    for p in procs:
        p.start()
    print(f"torch {torch.__version__}")
    print(out.get(timeout=120))
    for p in procs:
        p.join(timeout=60)
    sys.exit(max(p.exitcode or 0 for p in procs))


if __name__ == "__main__":
    main()
