#!/usr/bin/env bash
# The long soak: random collectives (random sizes up to ~1M elements, all 8 types, all
# operators, random roots, async) across 4 ranks for SECONDS (default 60), checking every
# result exactly, bit-identity across ranks, and flat resident memory. CI runs a 6 s
# version of the same test.
#
#   scripts/soak.sh [seconds=60]
set -euo pipefail
cd "$(dirname "$0")/.."
RINGCCL_SOAK_SECS=${1:-60} cargo test --release -p ringccl --test it soak:: -- --nocapture 2>&1 |
    grep -E '^soak:|test result|panicked|assert'
