#!/usr/bin/env bash
# The candle data-parallel example (examples/candle_ddp, its own crate): builds ringrun and
# the example (release), trains at 4 ranks x 16 samples and at 1 rank x 64 samples (the
# same global batch), and fails unless both runs end with the same final_params_l2 up to
# float rounding (relative difference < 1e-5). Extra arguments go to both runs, e.g.
#
#   scripts/candle-example.sh [--steps 30] [--seed 0] [--lr 0.1]
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

cargo build --quiet --bin ringrun
cargo build --release --quiet --manifest-path examples/candle_ddp/Cargo.toml
ringrun=target/debug/ringrun
example=examples/candle_ddp/target/release/candle-ddp-example

# Runs the example under ringrun, echoes its output to stderr, prints its final_params_l2.
l2_of() {
    local nproc=$1 batch=$2
    shift 2
    local out
    out=$("$ringrun" --nproc-per-node "$nproc" "$example" --local-batch "$batch" "$@")
    echo "$out" >&2
    local value
    value=$(grep -o 'final_params_l2=[^[:space:]]*' <<<"$out" | tail -n 1 | cut -d= -f2 || true)
    if [[ -z $value ]]; then
        echo "candle-example: no final_params_l2 line from the ${nproc}-rank run" >&2
        return 1
    fi
    echo "$value"
}

echo "== 4 ranks x local batch 16" >&2
l2_4x16=$(l2_of 4 16 "$@")
echo "== 1 rank x local batch 64" >&2
l2_1x64=$(l2_of 1 64 "$@")

echo "final_params_l2 4x16: $l2_4x16"
echo "final_params_l2 1x64: $l2_1x64"
# Rust prints e.g. 3.82117816e0, which awk reads as a number.
awk -v a="$l2_4x16" -v b="$l2_1x64" 'BEGIN {
    d = a - b; if (d < 0) d = -d
    m = (a < 0 ? -a : a); n = (b < 0 ? -b : b); if (n > m) m = n
    rel = (m > 0) ? d / m : 0
    printf "relative difference: %.3e (tolerance 1e-5)\n", rel
    if (!(rel < 1e-5)) { print "candle-example: FAIL: the runs disagree"; exit 1 }
    print "candle-example: OK"
}'
