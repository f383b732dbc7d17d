#!/usr/bin/env bash
# Barrier latency against OpenMPI's MPI_Barrier, interleaved: REPS times, OpenMPI's loop
# then ringccl-bench's, each reporting the median over iterations of the slowest rank's
# time (the shared side-by-side script's figure). Prints every repetition and the medians.
# Usage: scripts/barrier-vs-mpi.sh [N] [shm|tcp] [REPS]   (needs mpicc and mpirun)
set -euo pipefail
N=${1:-4}; T=${2:-shm}; REPS=${3:-8}
cd "$(dirname "$0")/.."
command -v mpicc >/dev/null || { echo "skipped: mpicc not found (OpenMPI's setup is in ../shared/peers/README.md)"; exit 0; }
cargo build --release -p ringccl-tools --bin ringccl-bench >/dev/null 2>&1
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/barrier.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#define ITERS 20000
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    static double t[ITERS], slowest[ITERS];
    for (int i = 0; i < 1000; i++) MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < ITERS; i++) { double a = MPI_Wtime(); MPI_Barrier(MPI_COMM_WORLD); t[i] = MPI_Wtime() - a; }
    MPI_Allreduce(t, slowest, ITERS, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(slowest, ITERS, sizeof(double), cmp);
    if (rank == 0) printf("%.2f\n", slowest[ITERS / 2] * 1e6);
    MPI_Finalize();
    return 0;
}
C
mpicc -O2 -o "$WORK/barrier" "$WORK/barrier.c"
MPI_TRANSPORT=()
[ "$T" = tcp ] && MPI_TRANSPORT=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
for r in $(seq "$REPS"); do
  mpi=$(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca oob_tcp_if_include lo \
        "${MPI_TRANSPORT[@]}" -np "$N" "$WORK/barrier")
  ours=$(target/release/ringccl-bench --np "$N" --transport "$T" --coll barrier --json "$WORK/r.json" >/dev/null 2>&1 \
         && python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['time_us'])" "$WORK/r.json")
  echo "rep $r: OpenMPI $mpi us, ringccl $ours us"
  echo "$mpi $ours" >> "$WORK/all"
done
python3 - "$WORK/all" "$N" "$T" <<'PY'
import statistics, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
mpi = statistics.median(r[0] for r in rows); ours = statistics.median(r[1] for r in rows)
print(f"barrier, N={sys.argv[2]}, {sys.argv[3]}: OpenMPI {mpi:.2f} us, ringccl {ours:.2f} us, ratio {ours / mpi:.2f}x (medians of {len(rows)})")
PY
