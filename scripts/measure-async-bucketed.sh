#!/usr/bin/env bash
# Figures for the async / bucketed / small-message work, all from the all-reduce bench.
# Usage: scripts/measure-async-bucketed.sh [REPS]   (interleaved repetitions, default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
OUT=${OUT:-target/measure-async-bucketed}
mkdir -p "$OUT"
cargo build --release --bench allreduce >/dev/null 2>&1
BENCH=$(ls -t target/release/deps/allreduce-* | grep -v '\.d$' | head -1)
run() { local name=$1; shift; timeout 600 "$BENCH" "$@" >>"$OUT/$name.txt" 2>&1 || echo "$name failed" >&2; }
for r in $(seq 1 "$REPS"); do
  [ -n "${SKIP_ALGO:-}" ] || for N in 4 2 3; do
    run "ring_N$N" --np "$N" --algo ring -b 8 -e 1M -f 2 --budget 0.5
    run "rd_N$N" --np "$N" --algo rd -b 8 -e 1M -f 2 --budget 0.5
  done
  for N in 4 2; do
    run "bucketed_N$N" --np "$N" --coll all_reduce_bucketed --tensors 1000 -b 1M -e 1M
    run "separate_N$N" --np "$N" --coll all_reduce_separate --tensors 1000 -b 1M -e 1M
    run "single_N$N" --np "$N" -b 1M -e 1M
    run "overlap_N$N" --np "$N" --coll all_reduce_async -b 64M -e 64M
  done
done
echo "raw results in $OUT/"
