#!/usr/bin/env bash
# Side-by-side figures: ringccl (gloo backend), PyTorch gloo and OpenMPI over TCP, on the
# same machine, in the same run, with the same method (median of the slowest rank's
# per-iteration time; float32 sum): all-reduce at 8 B, 1 MiB and 64 MiB, barrier, and
# 64 MiB broadcast, for N = 2 and 4, repeated REPS times, interleaved.
#
# Usage: scripts/compare-peers.sh [REPS]      (default 3)
# Needs: ../shared/peers beside this checkout; PyTorch in $PY (default /tmp/torchenv/bin/python)
#        and OpenMPI (mpicc, mpirun) for the peers -- see ../shared/peers/README.md.
#        Missing peers are skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
PY=${PY:-/tmp/torchenv/bin/python}
PEERS=${PEERS:-../shared/peers}
OUT=${OUT:-target/compare-peers}
mkdir -p "$OUT"
cargo build --release --bin ringccl-bench >/dev/null 2>&1
BENCH=target/release/ringccl-bench
MPI_BIN=""
if command -v mpicc >/dev/null && command -v mpirun >/dev/null && [ -f "$PEERS/mpi_allreduce.c" ]; then
  MPI_BIN="$OUT/mpi_allreduce"
  mpicc -O2 -o "$MPI_BIN" "$PEERS/mpi_allreduce.c"
else
  echo "skipping OpenMPI: mpicc/mpirun or $PEERS/mpi_allreduce.c not found" >&2
fi
if ! [ -x "$PY" ] || ! [ -f "$PEERS/torch_gloo_allreduce.py" ]; then
  echo "skipping PyTorch gloo: $PY or $PEERS/torch_gloo_allreduce.py not found" >&2
fi
for r in $(seq 1 "$REPS"); do
  for N in 2 4; do
    {
      for s in 8 1M 64M; do timeout 300 "$BENCH" --np "$N" -b "$s" -e "$s" | grep -v '^# Out\|^# Avg'; done
      timeout 300 "$BENCH" --np "$N" --coll barrier | grep -v '^# Out\|^# Avg'
      timeout 300 "$BENCH" --np "$N" --coll broadcast -b 64M -e 64M | grep -v '^# Out\|^# Avg'
    } >>"$OUT/ringccl_N${N}.txt" 2>&1 || echo "ringccl N=$N failed" >&2
    {
      for s in 8 1M 64M; do timeout 300 "$BENCH" --np "$N" --transport shm -b "$s" -e "$s" | grep -v '^# Out\|^# Avg'; done
      timeout 300 "$BENCH" --np "$N" --transport shm --coll barrier | grep -v '^# Out\|^# Avg'
      timeout 300 "$BENCH" --np "$N" --transport shm --coll broadcast -b 64M -e 64M | grep -v '^# Out\|^# Avg'
    } >>"$OUT/ringccl_shm_N${N}.txt" 2>&1 || echo "ringccl shm N=$N failed" >&2
    if [ -x "$PY" ] && [ -f "$PEERS/torch_gloo_allreduce.py" ]; then
      timeout 600 "$PY" "$PEERS/torch_gloo_allreduce.py" --nproc "$N" --sizes 8,1048576,67108864 \
        >>"$OUT/torch_N${N}.txt" 2>&1 || echo "torch gloo N=$N failed" >&2
    fi
    if [ -n "$MPI_BIN" ]; then
      timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca oob_tcp_if_include lo \
        -np "$N" --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo "$MPI_BIN" 1.0 mpi-tcp \
        >>"$OUT/mpi_tcp_N${N}.txt" 2>&1 || echo "mpi N=$N failed" >&2
    fi
  done
done
python3 scripts/summarize-peers.py "$OUT"
