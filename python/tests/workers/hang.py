"""A torch job whose rank 1 stops issuing collectives after three: ringrun's hang watch
must name it."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("ringccl")
for _ in range(3):
    dist.all_reduce(torch.ones(10))
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(torch.ones(10))
