#!/usr/bin/env bash
# Ranks on threads of one process (ringccl::local_groups: the in-process rings, and the
# peer-memory all-reduce from 1 MiB) against ranks in separate processes over shared
# memory, interleaved, medians of REPS runs. Prints a markdown table of all-reduce times.
#
#   scripts/local-vs-shm.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
cargo build --release -q -p ringccl-tools --bin ringccl-bench
bench=target/release/ringccl-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for _ in $(seq "$reps"); do
  for n in 2 4; do
    for transport in memory shm; do
      for size in 8 1K 64K 1M 16M 64M; do
        if ! "$bench" --np "$n" --transport "$transport" -b "$size" -e "$size" \
          >"$out/run" 2>"$out/err"; then
          echo "local-vs-shm: ringccl-bench --np $n --transport $transport -b $size failed:" >&2
          cat "$out/err" >&2
          exit 1
        fi
        awk -v n="$n" -v t="$transport" '$1 ~ /^[0-9]+$/ { print n, t, $1, $6 }' "$out/run"
      done
    done
  done
done >"$out/rows"
python3 - "$out/rows" <<'PY'
import collections, statistics, sys
times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    n, t, size, us = line.split()
    times[(int(n), int(size), t)].append(float(us))
def cell(us):
    return f"{us:.1f} µs" if us < 10000 else f"{us / 1000:.2f} ms"
print("| N | size (B) | threads, one process | processes, shared memory | processes / threads |")
print("|---|---|---|---|---|")
for (n, size) in sorted({(k[0], k[1]) for k in times}):
    mem = statistics.median(times[(n, size, "memory")])
    shm = statistics.median(times[(n, size, "shm")])
    print(f"| {n} | {size} | {cell(mem)} | {cell(shm)} | {shm / mem:.2f}× |")
PY
