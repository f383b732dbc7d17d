"""torch's batch_isend_irecv as pipeline parallelism uses it, with tensors larger than
any connection holds: a pairwise exchange (every rank sends to and receives from its
partner, sends listed first) and a ring (send to the next rank, receive from the
previous). Prints RESULT {"ok": bool, "detail": str}."""

import torch
import torch.distributed as dist

from common import init, result

rank, size = init("ringccl", timeout=60)
n = 4 << 20  # 16 MiB of float32
detail = []

# Ring: send to the next, receive from the previous, listed send first on every rank.
out = torch.full((n,), float(rank))
into = torch.empty(n)
ops = [
    dist.P2POp(dist.isend, out, (rank + 1) % size),
    dist.P2POp(dist.irecv, into, (rank - 1) % size),
]
for work in dist.batch_isend_irecv(ops):
    work.wait()
if not torch.equal(into, torch.full((n,), float((rank - 1) % size))):
    detail.append(f"ring: got {into[:3].tolist()}")

# Pairwise exchange between 0 and 1 (the others sit it out), recv listed first on rank 1.
if rank in (0, 1):
    peer = 1 - rank
    out = torch.full((n,), 10.0 + rank)
    into = torch.empty(n)
    ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)]
    if rank == 1:
        ops.reverse()
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if not torch.equal(into, torch.full((n,), 10.0 + peer)):
        detail.append(f"pair: got {into[:3].tolist()}")
dist.barrier()
dist.destroy_process_group()
result({"ok": not detail, "detail": "; ".join(detail)})
