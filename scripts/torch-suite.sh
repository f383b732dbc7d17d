#!/usr/bin/env bash
# torch's DistributedTest suite on ringccl and on gloo, on this machine, one after the
# other; prints each backend's pass / skip / fail counts and keeps the logs in
# target/torch-suite/. About 40 minutes per backend on 2 cores.
#
#   scripts/torch-suite.sh                 # both backends, 2 ranks
#   scripts/torch-suite.sh ringccl         # one backend
#   WORLD_SIZE=3 scripts/torch-suite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python="${RINGCCL_PYTHON:-$(scripts/python-env.sh)}"
out=target/torch-suite
mkdir -p "$out"
for backend in "${@:-ringccl gloo}"; do
  for b in $backend; do
    log="$out/$b-ws${WORLD_SIZE:-2}.log"
    echo "== torch DistributedTest on $b (WORLD_SIZE=${WORLD_SIZE:-2}); log: $log"
    BACKEND=$b WORLD_SIZE=${WORLD_SIZE:-2} "$python" -m pytest -q -rfs -p no:cacheprovider \
      python/suite/torch_distributed_suite.py >"$log" 2>&1 || true
    tail -1 "$log"
  done
done
