"""Launching ranks for the tests: real processes, real torch, one torch TCPStore per
launch hosted by the test process on an ephemeral port (so no fixed port anywhere)."""

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch tests need it")
dist = pytest.importorskip("torch.distributed")

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
# A rank that has not finished by then has hung: every test's ranks are killed and the
# test fails, naming the ranks still running.
LAUNCH_LIMIT = float(os.environ.get("RINGCCL_TEST_LAUNCH_LIMIT", "300"))


class Ranks:
    """The outcome of one launch: each rank's exit status and output."""

    def __init__(self, procs, outputs):
        self.codes = [p.returncode for p in procs]
        self.outputs = outputs

    def ok(self):
        return all(code == 0 for code in self.codes)

    def report(self):
        return "\n".join(
            f"--- rank {r} (exit {code}) ---\n{out[-4000:]}"
            for r, (code, out) in enumerate(zip(self.codes, self.outputs))
        )

    def results(self):
        """The JSON line each rank printed last with the prefix RESULT."""
        found = []
        for out in self.outputs:
            lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
            found.append(json.loads(lines[-1][len("RESULT ") :]) if lines else None)
        return found


def launch(n, worker, *args, env=None, limit=LAUNCH_LIMIT, kill=None):
    """Runs `workers/<worker>` as ranks 0..n-1 against a fresh TCPStore; returns Ranks.

    `kill`: (rank, after_line) kills that rank once it prints `after_line`.
    """
    store = dist.TCPStore(
        "127.0.0.1", 0, n + 1, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=limit),
    )
    procs = []
    for rank in range(n):
        child_env = dict(os.environ)
        child_env.update(
            RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_RANK=str(rank),
            RINGCCL_TEST_STORE=f"127.0.0.1:{store.port}",
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
        )
        child_env.pop("MASTER_ADDR", None)
        child_env.pop("MASTER_PORT", None)
        child_env.update(env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / worker), *map(str, args)],
                env=child_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return _collect(procs, limit, kill, keep_alive=store)


def _collect(procs, limit, kill, keep_alive):
    import threading
    import time

    lines = [[] for _ in procs]

    def read(i, p):
        for line in p.stdout:
            lines[i].append(line)
            if kill and kill[0] == i and kill[1] in line:
                p.kill()

    readers = [threading.Thread(target=read, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + limit
    for p in procs:
        left = max(0.1, deadline - time.monotonic())
        try:
            p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            pass
    hung = [i for i, p in enumerate(procs) if p.poll() is None]
    for i in hung:
        procs[i].kill()
        procs[i].wait()
    for t in readers:
        t.join(timeout=10)
    outputs = ["".join(l) for l in lines]
    del keep_alive
    ranks = Ranks(procs, outputs)
    if hung:
        pytest.fail(f"ranks {hung} still running after {limit} s:\n{ranks.report()}")
    return ranks
