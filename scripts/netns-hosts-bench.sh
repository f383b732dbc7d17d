#!/usr/bin/env bash
# The hierarchical all-reduce against the flat ring, across hosts with several ranks
# each: HOSTS network namespaces on a bridge, each with its own host name and its egress
# rate-limited with tc tbf (default 1gbit), running RANKS_PER_HOST ranks of ringccl-bench
# (default 2 x 2). Ranks of a host share memory; hosts talk over TCP. The two algorithms
# run interleaved, REPS times each, at 64 MiB; busbw uses the nccl-tests formula with
# N = all ranks, and is printed as a multiple of the per-host link rate. A flat ring
# cannot exceed 1.0x here; the hierarchical limit is 2(N-1)/N / (2(M-1)/M) (1.5x at 2x2).
#
#   sudo scripts/netns-hosts-bench.sh [rate=1gbit] [reps=3]      (HOSTS=2 RANKS_PER_HOST=2,
#                                                                 or LAYOUT="2 1 1";
#                                                                 TRANSPORT=tcp: TCP inside a
#                                                                 host too)
#
# Needs root, iproute2 and util-linux's unshare. Uses only its own namespaces
# (rchosts<pid>-*) and addresses (10.79.0.0/24) and removes them on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1gbit}
reps=${2:-3}
hosts=${HOSTS:-2}
per_host=${RANKS_PER_HOST:-2}
transport=${TRANSPORT:-auto}
# LAYOUT="2 1 1": ranks per host, uneven (overrides HOSTS and RANKS_PER_HOST).
read -r -a layout <<< "${LAYOUT:-$(printf "$per_host %.0s" $(seq 1 "$hosts"))}"
hosts=${#layout[@]}
host_of=() local_of=() local_size=()
for h in "${!layout[@]}"; do
    for l in $(seq 0 $((layout[h] - 1))); do
        host_of+=("$h") local_of+=("$l") local_size+=("${layout[h]}")
    done
done
n=${#host_of[@]}
[ "$(id -u)" = 0 ] || { echo "netns-hosts-bench: needs root" >&2; exit 2; }
for tool in ip tc unshare; do
    command -v $tool >/dev/null || { echo "netns-hosts-bench: needs $tool" >&2; exit 2; }
done

cargo build --release --quiet -p ringccl-tools --bin ringccl-bench
bench=$PWD/target/release/ringccl-bench
. scripts/netns-lib.sh
p=rchosts$$-
trap 'netns_cleanup $p' EXIT
netns_hosts $p 10.79.0 "$hosts" "$rate"
link=$(link_rate "$rate") || exit 2

# rank R ALGO ARGS...: rank R of ringccl-bench in its host's namespace, under the host's
# name, with RINGCCL_ALGO=ALGO. Each namespace is fresh, so a fixed port inside host 0's
# is always free.
rank() {
    local r=$1 algo=$2 h=${host_of[$1]}
    shift 2
    ip netns exec ${p}$h unshare --uts sh -c 'hostname "$0" && exec "$@"' "${p}host$h" \
        env RANK=$r WORLD_SIZE=$n LOCAL_RANK=${local_of[r]} LOCAL_WORLD_SIZE=${local_size[r]} \
        MASTER_ADDR=10.79.0.1 MASTER_PORT=29500 RINGCCL_ALGO=$algo \
        RINGCCL_TRANSPORT=$transport "$bench" "$@"
}

# run ALGO ARGS...: every rank; prints rank 0's output.
run() {
    local pids=() r
    for r in $(seq 1 $((n - 1))); do
        rank $r "$@" >/dev/null &
        pids+=($!)
    done
    rank 0 "$@"
    wait "${pids[@]}"
}

echo "# ranks per host: ${layout[*]}; egress $rate per host (link rate $link GB/s); transport $transport (auto: shm inside a host, tcp across)"
declare -A busbw
for rep in $(seq 1 "$reps"); do
    for algo in ring hierarchical; do
        out=$(run $algo -b 64M -e 64M -n 3 -w 1)
        row=$(echo "$out" | awk '!/^#/ && NF >= 8' | tail -1)
        echo "rep $rep $algo: $row"
        busbw[$algo]+="$(echo "$row" | awk '{print $8}') "
    done
done
median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| algorithm | busbw (GB/s, median of $reps) | link rate (GB/s) | busbw / link |"
echo "|---|---|---|---|"
for algo in ring hierarchical; do
    med=$(median "${busbw[$algo]}")
    echo "| $algo | $med | $link | $(awk -v b="$med" -v l="$link" 'BEGIN {printf "%.2fx", b / l}') |"
done

# SWEEP=1: every algorithm once over 8 B to 64 MiB, time per call side by side (the
# crossovers behind Auto's rule in docs/benchmarks.md).
if [ "${SWEEP:-0}" = 1 ]; then
    echo
    echo "# sweep: time per call (us) by algorithm"
    algos="recursive_doubling halving_doubling ring hierarchical auto"
    for algo in $algos; do
        run $algo -b 8 -e 64M -f 8 -n 5 -w 1 | awk '!/^#/ && NF >= 8 {print $1, $6}' > "/tmp/${p}$algo"
    done
    printf '%12s' bytes; for algo in $algos; do printf ' %18s' $algo; done; echo
    paste -d' ' $(for algo in $algos; do echo "/tmp/${p}$algo"; done) |
        awk '{printf "%12s", $1; for (i = 2; i <= NF; i += 2) printf " %18s", $i; print ""}'
    rm -f /tmp/${p}*
fi
