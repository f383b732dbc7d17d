#!/usr/bin/env bash
# The PyTorch tests: builds the ringccl wheel (python/), installs it into a Python that
# has torch, and runs pytest on python/tests. Without such a Python it says so and
# skips. Which Python: $RINGCCL_PYTHON, else the venv scripts/python-env.sh makes, else
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."
venv_python="${RINGCCL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ringccl/venv}/bin/python"
python=""
for candidate in "${RINGCCL_PYTHON:-}" "$venv_python" python3; do
  if [ -n "$candidate" ] && "$candidate" -c 'import torch, pytest' >/dev/null 2>&1; then
    python="$candidate"
    break
  fi
done
if [ -z "$python" ]; then
  echo "SKIPPED the PyTorch tests: no Python with torch and pytest (run scripts/python-env.sh, or set RINGCCL_PYTHON)"
  exit 0
fi
if ! "$python" -m maturin --version >/dev/null 2>&1; then
  "$python" -m pip install -q 'maturin>=1.9,<2'
fi
echo "== PyTorch tests with $python (torch $("$python" -c 'import torch; print(torch.__version__)'))"
rm -f target/wheels/ringccl-*.whl
(cd python && CARGO_TARGET_DIR=../target/python "$python" -m maturin build --release \
  --interpreter "$python" --out ../target/wheels --quiet)
"$python" -m pip install -q --force-reinstall --no-deps target/wheels/ringccl-*.whl
# ringrun, for the launcher test (cargo test has built it already).
cargo build -q -p ringccl-tools --bin ringrun
cd python/tests && exec "$python" -m pytest -q -rs "${@:-.}"
