"""What every test rank does first: join the launch's store, then the process group."""

import datetime
import json
import os

import torch.distributed as dist


def rank_and_size():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def init(backend="ringccl", timeout=60):
    """Joins the default group through the test's TCPStore (no `import ringccl`: the
    entry point that `import torch` runs registers the backend)."""
    rank, size = rank_and_size()
    host, port = os.environ["RINGCCL_TEST_STORE"].rsplit(":", 1)
    store = dist.TCPStore(
        host, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout)
    )
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    return rank, size


def result(value):
    """Prints the line the test reads back."""
    print("RESULT " + json.dumps(value), flush=True)
