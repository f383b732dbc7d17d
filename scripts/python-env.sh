#!/usr/bin/env bash
# Makes (once) the Python environment the PyTorch tests and benchmark run in: a venv
# with the newest torch on the registry, pytest, numpy and maturin, kept in the
# machine's cache so that later runs reuse it. Prints the venv's python.
#
#   scripts/python-env.sh              # create or reuse
#   RINGCCL_TORCH=torch==2.15.0 scripts/python-env.sh   # another torch
#
# torch's wheel is large (about 5 GB installed with its CUDA libraries).
set -euo pipefail
venv="${RINGCCL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ringccl/venv}"
torch_spec="${RINGCCL_TORCH:-torch}"
python="$venv/bin/python"
if [ ! -x "$python" ]; then
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv" >&2
fi
if ! "$python" -c 'import torch, pytest, numpy, expecttest' >/dev/null 2>&1 ||
   ! "$venv/bin/maturin" --version >/dev/null 2>&1; then
  echo "installing $torch_spec, pytest, numpy and maturin into $venv (a large download, once)" >&2
  "$python" -m pip install -q --upgrade pip >&2
  "$python" -m pip install -q "$torch_spec" pytest numpy expecttest 'maturin>=1.9,<2' >&2
fi
echo "$python"
