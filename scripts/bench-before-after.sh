#!/usr/bin/env bash
# Usage: scripts/bench-before-after.sh OLD_BENCH_BINARY NEW_BENCH_BINARY [ROUNDS]
# (build each tree with `cargo build --release --bin ringccl-bench`).
# Before/after: the same sizes, ranks and transports, interleaved, 3 rounds; prints the
# median time(us) of each binary per case and the after/before ratio.
set -euo pipefail
before=$1; after=$2; rounds=${3:-3}
out=$(mktemp -d)
for round in $(seq 1 "$rounds"); do
  for t in tcp shm; do for np in 2 4; do for size in 8 1M 64M; do
    for which in before after; do
      bin=$before; [ "$which" = after ] && bin=$after
      n=200; [ "$size" = 1M ] && n=40; [ "$size" = 64M ] && n=4
      line=$("$bin" --np "$np" --transport "$t" -b "$size" -e "$size" -n "$n" -w 2 2>/dev/null | awk '$1 ~ /^[0-9]+$/ {print $6}' | head -1)
      echo "$t $np $size $which $line" >> "$out/raw"
    done
  done; done; done
done
python3 - "$out/raw" <<'PY'
import sys, statistics, collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    t,np,size,which,us=l.split()
    d[(t,np,size,which)].append(float(us))
print(f"{'transport':9} {'N':>2} {'size':>5} {'before us':>10} {'after us':>10} {'after/before':>12}")
for t in ['tcp','shm']:
  for np in ['2','4']:
    for size in ['8','1M','64M']:
      b=statistics.median(d[(t,np,size,'before')]); a=statistics.median(d[(t,np,size,'after')])
      print(f"{t:9} {np:>2} {size:>5} {b:10.1f} {a:10.1f} {a/b:12.3f}")
PY
