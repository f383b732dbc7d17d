#!/usr/bin/env bash
# Side-by-side all-reduce figures: ringccl (gloo backend) and PyTorch gloo, same machine,
# same run, same method (median of the slowest rank's per-iteration time; float32 sum).
#
# Usage: scripts/compare-peers.sh [REPS]      (default 3 repetitions per N, interleaved)
# Needs: the peer scripts in ../shared/peers (beside this checkout) and a Python with torch
#        (PY, default /tmp/torchenv/bin/python; see ../shared/peers/README.md to set it up).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
PY=${PY:-/tmp/torchenv/bin/python}
PEERS=${PEERS:-../shared/peers}
SIZES="8,1048576,67108864"
OUT=${OUT:-target/compare-peers}
mkdir -p "$OUT"
cargo build --release --bench allreduce >/dev/null 2>&1
BENCH=$(ls -t target/release/deps/allreduce-* | grep -v '\.d$' | head -1)
for r in $(seq 1 "$REPS"); do
  for N in 2 4; do
    for s in 8 1M 64M; do
      timeout 300 "$BENCH" --np "$N" -b "$s" -e "$s" >>"$OUT/ringccl_N${N}.txt" 2>&1 || echo "ringccl N=$N size $s failed" >&2
    done
    if [ -x "$PY" ] && [ -f "$PEERS/torch_gloo_allreduce.py" ]; then
      timeout 600 "$PY" "$PEERS/torch_gloo_allreduce.py" --nproc "$N" --sizes "$SIZES" >>"$OUT/torch_N${N}.txt" 2>&1 \
        || echo "torch gloo N=$N failed" >&2
    fi
  done
done
echo "raw results in $OUT/"
