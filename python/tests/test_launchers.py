"""A user's script reaches ringccl with one string, under every launcher torch users
have: torchrun, ringrun, and init_method file:// (the TCPStore of the other tests)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import WORKERS, launch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(WORKERS / "launched.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def results(out_dir):
    import json

    return sorted(
        (json.loads(p.read_text()) for p in Path(out_dir).glob("rank-*.json")),
        key=lambda r: r["rank"],
    )


def check(found, backend="ringccl"):
    import ringccl

    assert [r["rank"] for r in found] == [0, 1], found
    for r in found:
        assert r["backend"] == backend
        assert r["sum"] == [3.0, 3.0, 3.0]
        assert r["version"] == ringccl.__version__


def run(command, out_dir, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RINGCCL_TEST_OUT": str(out_dir)}
    return subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300, **kwargs)


def test_torchrun_env(tmp_path):
    proc = run([*TORCHRUN, SCRIPT], tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    check(results(tmp_path))


def test_file_init_method(tmp_path):
    ranks = launch(2, "launched.py", f"file://{tmp_path / 'rendezvous'}")
    assert ranks.ok(), ranks.report()
    check(sorted(ranks.results(), key=lambda r: r["rank"]))


def ringrun_binary():
    ringrun = os.environ.get("RINGCCL_RINGRUN") or shutil.which("ringrun")
    if not ringrun:
        built = REPO / "target" / "debug" / "ringrun"
        ringrun = str(built) if built.exists() else None
    if not ringrun:
        pytest.skip("no ringrun binary: build it with `cargo build -p ringccl-tools --bin ringrun` (or set RINGCCL_RINGRUN)")
    return ringrun


def test_ringrun(tmp_path):
    ringrun = ringrun_binary()
    proc = run([ringrun, "--nproc-per-node", "2", "--", sys.executable, SCRIPT], tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    check(results(tmp_path))


def test_device_mapped_backend_string(tmp_path):
    # The mapping is torch's; gloo stands in for NCCL on a machine without a GPU.
    proc = run([*TORCHRUN, SCRIPT, "env://", "cpu:ringccl,cuda:gloo"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    found = results(tmp_path)
    check(found, backend="cpu:ringccl,cuda:gloo")


def test_cpu_ringccl_cuda_nccl(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices for NCCL, found {torch.cuda.device_count()}")
    proc = run([*TORCHRUN, SCRIPT, "env://", "cpu:ringccl,cuda:nccl"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    found = results(tmp_path)
    check(found, backend="cpu:ringccl,cuda:nccl")
    assert all(r["gpu"] == [3.0, 3.0, 3.0] for r in found), found


def test_ringrun_hang_watch_names_the_rank_a_torch_job_waits_for(tmp_path):
    ringrun = ringrun_binary()
    proc = run(
        [ringrun, "--nproc-per-node", "3", "--hang-timeout", "6", "--hang-action", "stop",
         "--", sys.executable, str(WORKERS / "hang.py")],
        tmp_path,
    )
    assert proc.returncode != 0, proc.stdout[-4000:]
    diagnosis = [l for l in proc.stdout.splitlines() if "DIAGNOSIS" in l]
    assert any("wait in op #4 all_reduce" in l and "for rank 1" in l for l in diagnosis), (
        proc.stdout[-4000:]
    )


def test_tcp_init_method():
    import socket

    # Rank 0 binds the port torch's tcp:// names: take a free one from the kernel.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = launch(2, "launched.py", f"tcp://127.0.0.1:{port}")
    assert ranks.ok(), ranks.report()
    check(sorted(ranks.results(), key=lambda r: r["rank"]))
