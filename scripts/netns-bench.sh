#!/usr/bin/env bash
# The ring all-reduce against the physical limit of a ring: 4 ranks, each in its own
# network namespace on a bridge, every host's egress rate-limited with tc tbf (default
# 1gbit). A ring all-reduce can at best keep every link busy, so busbw <= link rate;
# this prints busbw at 64 MiB (and a sweep) as a fraction of the link rate.
#
#   sudo scripts/netns-bench.sh [rate=1gbit] [repetitions=3]
#
# Needs root and iproute2. Uses only its own namespaces (rcbench-*) and addresses
# (10.78.0.0/24) and removes them on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1gbit}
reps=${2:-3}
n=4
[ "$(id -u)" = 0 ] || { echo "netns-bench: needs root" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "netns-bench: needs iproute2 (ip, tc)" >&2; exit 2; }

cargo build --release --quiet -p ringccl-tools --bin ringccl-bench
bench=$PWD/target/release/ringccl-bench
. scripts/netns-lib.sh
p=rcbench$$-
trap 'netns_cleanup $p' EXIT
netns_hosts $p 10.78.0 $n "$rate"
link=$(link_rate "$rate") || exit 2

run() {
    # Each namespace is fresh, so a fixed port inside rank 0's is always free.
    local pids=() r
    for r in $(seq 1 $((n - 1))); do
        ip netns exec ${p}$r env RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=10.78.0.1 MASTER_PORT=29500 \
            "$bench" "$@" >/dev/null &
        pids+=($!)
    done
    ip netns exec ${p}0 env RANK=0 WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=10.78.0.1 MASTER_PORT=29500 \
        "$bench" "$@"
    wait "${pids[@]}"
}

echo "# $n ranks, one per namespace, egress $rate per host (link rate $link GB/s), transport tcp"
declare -a busbw
for rep in $(seq 1 "$reps"); do
    out=$(run -b 64M -e 64M -n 5 -w 1 --transport tcp)
    echo "$out" | grep -v '^#' | sed "s/^/rep $rep: /"
    busbw+=("$(echo "$out" | awk '!/^#/ && NF >= 8 {print $8}' | tail -1)")
done
med=$(printf '%s\n' "${busbw[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo
echo "| size | busbw (GB/s, median of $reps) | link rate (GB/s) | fraction of link |"
echo "|---|---|---|---|"
echo "| 64 MiB | $med | $link | $(awk -v b="$med" -v l="$link" 'BEGIN {printf "%.1f%%", 100 * b / l}') |"
echo
echo "# sweep (one run)"
run -b 1M -e 64M -f 4 -n 3 -w 1 --transport tcp
