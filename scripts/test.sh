#!/usr/bin/env bash
# The test command: every Rust test of the workspace, then the PyTorch tests (which
# skip, saying so, where no Python has torch; scripts/python-env.sh makes one).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
scripts/python-tests.sh
