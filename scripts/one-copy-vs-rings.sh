#!/usr/bin/env bash
# Usage: scripts/one-copy-vs-rings.sh [ROUNDS]
# Processes over shared memory: the all-reduce through the rings (the automatic choice)
# against the one-copy all-reduce (--algo pm: each rank reads its peers' buffers through
# the kernel), alternated round by round; prints the median time of each and their ratio.
# SIZES (default "64K 1M 16M 64M") and RANKS (default "2 4") narrow the sweep.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
cargo build --quiet --release -p ringccl-tools --bin ringccl-bench --manifest-path "$root/Cargo.toml"
bench=${CARGO_TARGET_DIR:-$root/target}/release/ringccl-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for round in $(seq 1 "$rounds"); do
  order="auto pm"; [ $((round % 2)) = 0 ] && order="pm auto"
  for np in ${RANKS:-2 4}; do for size in ${SIZES:-64K 1M 16M 64M}; do
    for algo in $order; do
      n=200; [ "$size" = 16M ] && n=10; [ "$size" = 64M ] && n=4
      "$bench" --np "$np" --transport shm --algo "$algo" -b "$size" -e "$size" -n "$n" -w 2 \
        --json "$out/row.json" >/dev/null 2>&1
      us=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["time_us"])' "$out/row.json")
      rm -f "$out/row.json"
      echo "$np $size $algo $us" >> "$out/raw"
    done
  done; done
done
python3 - "$out/raw" <<'PY'
import sys, statistics, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    np, size, algo, us = line.split()
    d[(int(np), size, algo)].append(float(us))
print(f"{'N':>2} {'size':>5} {'rings us':>10} {'one copy us':>12} {'one copy / rings':>17}")
for (np, size, algo) in sorted(k for k in d if k[2] == 'auto'):
    r = statistics.median(d[(np, size, 'auto')]); o = statistics.median(d[(np, size, 'pm')])
    print(f"{np:>2} {size:>5} {r:10.1f} {o:12.1f} {o / r:17.2f}")
PY
