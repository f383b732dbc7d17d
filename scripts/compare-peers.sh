#!/usr/bin/env bash
# Side-by-side figures, in one run, interleaved: ringccl over TCP and over shared memory
# (each transport forced, never `auto`), OpenMPI over TCP and over shared memory, and
# PyTorch gloo; all-reduce 8 B to 64 MiB, barrier and 64 MiB broadcast, N = 2 and 4;
# medians of REPS runs, with time ratios. This delegates to the peers' own
# side_by_side.sh, so that ringccl and its peers are measured by one script, one method.
#
# Usage: scripts/compare-peers.sh [REPS]      (default 3; about 10 minutes)
# Needs: the peers' scripts in $PEERS (default ../shared/peers beside this checkout),
#        OpenMPI (mpicc, mpirun) and PyTorch in $PY (default /tmp/torchenv/bin/python);
#        see the peers' README for their set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${PEERS:-../shared/peers}
if ! [ -f "$PEERS/side_by_side.sh" ]; then
  echo "compare-peers: $PEERS/side_by_side.sh not found; set PEERS to the peers' scripts" >&2
  exit 2
fi
exec bash "$PEERS/side_by_side.sh" . "${1:-3}"
