#!/usr/bin/env bash
# Usage: scripts/bench-before-after.sh OLD_BENCH_BINARY NEW_BENCH_BINARY [ROUNDS]
# (build each tree with `cargo build --release -p ringccl-tools --bin ringccl-bench`).
# Before/after: the same sizes, ranks and transports, interleaved, 3 rounds (the binary
# that runs first alternates from round to round: whichever runs first in a pair tends
# to be faster, and alternating cancels that out); prints the
# median time(us) of each binary per case, the after/before ratio, and the spread of the
# before binary's own rounds (max/min), the noise a difference must exceed to be seen.
# SIZES (default "8 1M 64M"), RANKS (default "2 4") and TRANSPORTS (default "tcp shm")
# narrow the sweep.
set -euo pipefail
before=$1; after=$2; rounds=${3:-3}
sizes=${SIZES:-8 1M 64M}; ranks=${RANKS:-2 4}; transports=${TRANSPORTS:-tcp shm}
out=$(mktemp -d)
for round in $(seq 1 "$rounds"); do
  order="before after"; [ $((round % 2)) = 0 ] && order="after before"
  for t in $transports; do for np in $ranks; do for size in $sizes; do
    for which in $order; do
      bin=$before; [ "$which" = after ] && bin=$after
      n=${ITERS:-200}; [ "$size" = 1M ] && n=40; [ "$size" = 64M ] && n=4
      "$bin" --np "$np" --transport "$t" -b "$size" -e "$size" -n "$n" -w 2 --json "$out/row.json" >/dev/null 2>&1
      line=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["time_us"])' "$out/row.json" 2>/dev/null)
      rm -f "$out/row.json"
      echo "$t $np $size $which $line" >> "$out/raw"
    done
  done; done; done
done
python3 - "$out/raw" "$sizes" "$ranks" <<'PY'
import sys, statistics, collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    t,np,size,which,us=l.split()
    d[(t,np,size,which)].append(float(us))
sizes=sys.argv[2].split(); ranks=sys.argv[3].split()
print(f"{'transport':9} {'N':>2} {'size':>5} {'before us':>10} {'after us':>10} {'after/before':>12} {'before max/min':>14}")
for t in [t for t in ['tcp','shm'] if any(k[0]==t for k in d)]:
  for np in ranks:
    for size in sizes:
      bs=d[(t,np,size,'before')]; a=statistics.median(d[(t,np,size,'after')]); b=statistics.median(bs)
      print(f"{t:9} {np:>2} {size:>5} {b:10.2f} {a:10.2f} {a/b:12.3f} {max(bs)/min(bs):14.2f}")
PY
