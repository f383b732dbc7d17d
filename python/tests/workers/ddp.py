"""DistributedDataParallel on ringccl against DDP on gloo, from the same start on the
same data: a model with BatchNorm and a branch it never uses, 20 steps, in the variant
named on the command line. Prints RESULT {"bit_identical": bool, "max_diff": float}."""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from common import init, result

variant = sys.argv[1]
rank, size = init("ringccl")
gloo = dist.new_group(backend="gloo")


class Net(nn.Module):
    def __init__(self, unused):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 4)
        if unused:
            self.unused = nn.Linear(64, 4)  # never in the graph

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def make(group):
    torch.manual_seed(0)
    # "plain": every parameter used, DDP's defaults. The others carry an unused branch,
    # which DDP handles with find_unused_parameters, or with static_graph.
    model = Net(unused=variant != "plain")
    kwargs = dict(process_group=group, bucket_cap_mb=0.01)  # several buckets
    if variant == "static_graph":
        kwargs["static_graph"] = True
    elif variant != "plain":
        kwargs["find_unused_parameters"] = True
    if variant == "bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    ddp = DDP(model, **kwargs)
    if variant == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)


models = [make(None), make(gloo)]  # ringccl (the default group), then gloo
gen = torch.Generator().manual_seed(100 + rank)
for step in range(20):
    x = torch.randn(8, 16, generator=gen)
    y = torch.randn(8, 4, generator=gen)
    for ddp, opt in models:
        accumulate = variant == "no_sync" and step % 2 == 0
        if accumulate:
            with ddp.no_sync():
                nn.functional.mse_loss(ddp(x), y).backward()
            continue
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=variant != "bucket_view")

ours = [p.detach() for p in models[0][0].module.state_dict().values()]
theirs = [p.detach() for p in models[1][0].module.state_dict().values()]
identical = all(torch.equal(a, b) for a, b in zip(ours, theirs))
diff = max(float((a.double() - b.double()).abs().max()) if a.numel() else 0.0 for a, b in zip(ours, theirs))
# Every rank must hold the same parameters (buffers such as BatchNorm's running mean
# are each rank's own after its last forward).
flat = torch.cat([p.detach().reshape(-1).double() for p in models[0][0].module.parameters()])
rows = [torch.empty_like(flat) for _ in range(size)]
dist.all_gather(rows, flat, group=gloo)
same_everywhere = all(torch.equal(r, rows[0]) for r in rows)
dist.destroy_process_group()
result({"bit_identical": identical, "max_diff": diff, "same_everywhere": same_everywhere})
