#!/usr/bin/env bash
# DDP overlap figures: step time of a ~25M-parameter MLP (examples/ddp_mlp.rs) with
# gradients marked as backward produces them (overlap on) against all marked after
# backward (overlap off), at 2 and 4 ranks on loopback gloo. Runs interleave on/off so
# both see the same machine load; prints one line per run and the median ratio.
#
#   scripts/ddp-overlap.sh [repetitions=3] [transport=auto|tcp|shm]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
transport=${2:-auto}
cargo build --release --quiet -p ringccl --example ddp_mlp -p ringccl-tools --bin ringrun
# 2048 inputs, 6 hidden layers of 2048, 1 output: 25.2M parameters (100 MB of f32 gradients).
model=(--input 2048 --hidden 2048 --layers 6 --dataset 256 --steps 6 --print-every 1000)
declare -A times
for np in 2 4; do
    b=$((32 / np))
    for rep in $(seq 1 "$reps"); do
        for overlap in on off; do
            line=$(RINGCCL_TRANSPORT=$transport target/release/ringrun --nproc-per-node "$np" \
                target/release/examples/ddp_mlp --local-batch "$b" --overlap "$overlap" "${model[@]}" |
                grep -o 'step_time_ms=[0-9.]*' | cut -d= -f2)
            echo "np=$np local_batch=$b overlap=$overlap rep=$rep step_time_ms=$line"
            times[$np,$overlap]+="$line "
        done
    done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| ranks | local batch | overlap on (ms) | overlap off (ms) | off / on |"
echo "|---|---|---|---|---|"
for np in 2 4; do
    on=$(echo "${times[$np,on]}" | median)
    off=$(echo "${times[$np,off]}" | median)
    echo "| $np | $((32 / np)) | $on | $off | $(awk -v a="$off" -v b="$on" 'BEGIN {printf "%.2f", a / b}') |"
done
