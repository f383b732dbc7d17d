#!/usr/bin/env bash
# The candle data-parallel example (examples/candle_ddp, its own crate): builds ringrun and
# the example (release), trains at 1 rank x 64 samples, and with the same global batch at
# 4 x 16 three ways: DDP over processes (ringrun), DDP over threads (--replicas 4) and
# DataParallel (--mode dp --replicas 4). Fails unless every run ends with the 1-rank
# run's final_params_l2 up to float rounding (relative difference < 1e-5). Extra
# arguments go to every run, e.g.
#
#   scripts/candle-example.sh [--steps 30] [--seed 0] [--lr 0.1]
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

cargo build --quiet -p ringccl-tools --bin ringrun
cargo build --release --quiet --manifest-path examples/candle_ddp/Cargo.toml
ringrun=target/debug/ringrun
example=examples/candle_ddp/target/release/candle-ddp-example

# Runs `command...`, echoes its output to stderr, prints its final_params_l2.
l2_of() {
    local what=$1
    shift
    local out
    out=$("$@")
    echo "$out" >&2
    local value
    value=$(grep -o 'final_params_l2=[^[:space:]]*' <<<"$out" | tail -n 1 | cut -d= -f2 || true)
    if [[ -z $value ]]; then
        echo "candle-example: no final_params_l2 line from $what" >&2
        return 1
    fi
    echo "$value"
}

# Fails unless $2 agrees with the reference $1 to a relative 1e-5.
agrees() {
    # Rust prints e.g. 3.82117816e0, which awk reads as a number.
    awk -v a="$1" -v b="$2" -v what="$3" 'BEGIN {
        d = a - b; if (d < 0) d = -d
        m = (a < 0 ? -a : a); n = (b < 0 ? -b : b); if (n > m) m = n
        rel = (m > 0) ? d / m : 0
        printf "%s: final_params_l2 %s, relative difference %.3e (tolerance 1e-5)\n", what, b, rel
        if (!(rel < 1e-5)) { print "candle-example: FAIL: " what " disagrees with 1 rank x 64"; exit 1 }
    }'
}

echo "== 1 rank x local batch 64" >&2
reference=$(l2_of "1 rank x 64" "$ringrun" --nproc-per-node 1 "$example" --local-batch 64 "$@")
echo "== DDP, 4 processes x local batch 16" >&2
processes=$(l2_of "4 processes" "$ringrun" --nproc-per-node 4 "$example" --local-batch 16 "$@")
echo "== DDP, 4 threads x local batch 16" >&2
threads=$(l2_of "4 threads" "$example" --replicas 4 --local-batch 16 "$@")
echo "== DataParallel, 4 replicas x local batch 16" >&2
dp=$(l2_of "DataParallel" "$example" --mode dp --replicas 4 --local-batch 16 "$@")

echo "1 rank x 64: final_params_l2 $reference"
agrees "$reference" "$processes" "DDP 4 processes x 16"
agrees "$reference" "$threads" "DDP 4 threads x 16"
agrees "$reference" "$dp" "DataParallel 4 x 16"
echo "candle-example: OK"
