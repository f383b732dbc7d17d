#!/usr/bin/env bash
# Usage: scripts/shared-vs-peers.sh [ROUNDS]
# All-reduce (f32 sum, in place) between processes of this host, interleaved round by
# round: ringccl over shared memory with ordinary buffers (the rings), ringccl with shared
# buffers (--memory shared: peers' buffers read in place), ringccl's ranks as threads of
# one process (--transport memory), and OpenMPI over shared memory; plus memcpy's copy
# rate (-O3 -march=native) for the same 64 MiB. Each figure is the median over iterations
# of the slowest rank's time; the table gives the median over rounds and the ratios.
# RANKS (default "2 4") and SIZES (default "8 64K 1M 16M 64M") narrow the sweep.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
command -v mpicc >/dev/null || { echo "skipped: mpicc not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 0; }
cargo build --quiet --release -p ringccl-tools --bin ringccl-bench --manifest-path "$root/Cargo.toml"
bench=${CARGO_TARGET_DIR:-$root/target}/release/ringccl-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/mpi.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long bytes = atol(argv[1]); int iters = atoi(argv[2]);
    long count = bytes / 4 > 0 ? bytes / 4 : 1;
    float *buf = malloc(count * 4);
    for (long i = 0; i < count; i++) buf[i] = 1.0f;
    double *t = malloc(iters * sizeof(double)), *slowest = malloc(iters * sizeof(double));
    for (int i = 0; i < 5; i++) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < iters; i++) {
        double a = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t[i] = MPI_Wtime() - a;
    }
    MPI_Allreduce(t, slowest, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(slowest, iters, sizeof(double), cmp);
    if (rank == 0) printf("%.2f\n", slowest[iters / 2] * 1e6);
    MPI_Finalize();
    return 0;
}
C
cat > "$out/memcpy.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(void) {
    size_t n = 64ul << 20;
    char *a = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(a, 1, n); memset(b, 2, n);
    double t[21];
    for (int i = 0; i < 21; i++) { double s = now(); memcpy(b, a, n); t[i] = now() - s; a[i] = b[i + 1]; }
    qsort(t, 21, sizeof(double), cmp);
    printf("%.3f\n", n / t[10] / 1e9);
    return 0;
}
C
mpicc -O2 -o "$out/mpi" "$out/mpi.c"
gcc -O3 -march=native -o "$out/memcpy" "$out/memcpy.c"
bytes() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
iters() { case $1 in 8) echo 20000;; 64K) echo 2000;; 1M) echo 200;; 16M) echo 20;; *) echo 8;; esac; }
ringccl() { # NP SIZE ARGS...
  local np=$1 size=$2; shift 2
  "$bench" --np "$np" -b "$size" -e "$size" -n "$(iters "$size")" -w 3 --json "$out/row.json" "$@" >/dev/null 2>&1
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["time_us"])' "$out/row.json"
  rm -f "$out/row.json"
}
for round in $(seq 1 "$rounds"); do
  echo "memcpy 0 - $("$out/memcpy")" >> "$out/raw"
  for np in ${RANKS:-2 4}; do for size in ${SIZES:-8 64K 1M 16M 64M}; do
    echo "rings $np $size $(ringccl "$np" "$size" --transport shm)" >> "$out/raw"
    echo "shared $np $size $(ringccl "$np" "$size" --transport shm --memory shared)" >> "$out/raw"
    echo "threads $np $size $(ringccl "$np" "$size" --transport memory)" >> "$out/raw"
    echo "openmpi $np $size $(timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none \
      --mca oob_tcp_if_include lo -np "$np" "$out/mpi" "$(bytes "$size")" "$(iters "$size")")" >> "$out/raw"
  done; done
done
python3 - "$out/raw" <<'PY'
import sys, statistics, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    what, np, size, us = line.split()
    d[(what, int(np), size)].append(float(us))
copy = statistics.median(d[('memcpy', 0, '-')])
print(f"memcpy copy rate (64 MiB, -O3 -march=native): {copy:.2f} GB/s")
print("| N | size | rings µs | shared µs | threads µs | OpenMPI µs | shared/OpenMPI | shared/threads | shared busbw/memcpy |")
print("|---|---|---|---|---|---|---|---|---|")
unit = {'K': 1 << 10, 'M': 1 << 20}
for (what, np, size) in sorted((k for k in d if k[0] == 'rings'), key=lambda k: (k[1], int(k[2][:-1]) * unit.get(k[2][-1], 1) if k[2][-1] in unit else int(k[2]))):
    m = {w: statistics.median(d[(w, np, size)]) for w in ('rings', 'shared', 'threads', 'openmpi')}
    b = int(size[:-1]) * unit[size[-1]] if size[-1] in unit else int(size)
    busbw = b / m['shared'] / 1e3 * 2 * (np - 1) / np
    print(f"| {np} | {size} | {m['rings']:.1f} | {m['shared']:.1f} | {m['threads']:.1f} | {m['openmpi']:.1f} | "
          f"{m['shared'] / m['openmpi']:.2f} | {m['shared'] / m['threads']:.2f} | {busbw / copy:.2f} |")
PY
