#!/usr/bin/env bash
# Usage: scripts/bench-recorder-cost.sh [ROUNDS]
# What the flight recorder costs a small collective, end to end. ringccl-bench is built
# twice from this working tree: as it is ("on"), and with every recorder hook on the
# call path emptied by scripts/flight-off.py ("off", built in a copy of the tree, with
# its own target directory). bench-before-after.sh then runs them paired, off before on,
# the first binary alternating by round; a second run pairs "on" with a copy of itself,
# whose ratio is the noise floor the first must be read against.
# SIZES (default 8), RANKS (default 2), TRANSPORTS and ITERS (default 50000) as for
# bench-before-after.sh; ROUNDS defaults to 16.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-16}
target=${CARGO_TARGET_DIR:-$root/target}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --quiet --release -p ringccl-tools --bin ringccl-bench --manifest-path "$root/Cargo.toml"
cp "$target/release/ringccl-bench" "$work/on"
cp "$target/release/ringccl-bench" "$work/on-again"

mkdir "$work/tree"
(cd "$root" && git ls-files --cached --others --exclude-standard -z |
  xargs -0 cp --parents -t "$work/tree")
(cd "$work/tree" && python3 "$root/scripts/flight-off.py")
CARGO_TARGET_DIR="$target/recorder-off" cargo build --quiet --release -p ringccl-tools --bin ringccl-bench \
  --manifest-path "$work/tree/Cargo.toml"
cp "$target/recorder-off/release/ringccl-bench" "$work/off"

export SIZES=${SIZES:-8} RANKS=${RANKS:-2} ITERS=${ITERS:-50000}
echo "# recorder off (before) vs on (after)"
"$root/scripts/bench-before-after.sh" "$work/off" "$work/on" "$rounds"
echo "# noise floor: on vs the same binary again"
"$root/scripts/bench-before-after.sh" "$work/on" "$work/on-again" "$rounds"
