#!/usr/bin/env bash
# DataParallel vs DDP over threads vs DDP over processes, at 1, 2 and 4 replicas, with
# the same trainer (examples/ddp_mlp.rs) and the same local batch per replica: the
# median step time and the peak resident memory (summed over the processes under
# ringrun). Prints a markdown table.
#
#   scripts/dp-vs-ddp.sh [--candle] [steps] [extra trainer arguments...]
#
# The default model: 256 inputs, 4 hidden layers of 512 (about 0.9M parameters).
# --candle: the candle example (examples/candle_ddp) instead, 256 inputs, one hidden
# layer of 2048 (about 0.5M parameters), candle's autograd computing the gradients, each
# replica's candle on one thread.
set -euo pipefail
cd "$(dirname "$0")/.."
candle=false
if [ "${1:-}" = --candle ]; then
  candle=true
  shift
fi
steps=${1:-30}
shift || true
cargo build --release -q -p ringccl-tools --bin ringrun
if $candle; then
  cargo build --release -q --manifest-path examples/candle_ddp/Cargo.toml
  mlp=examples/candle_ddp/target/release/candle-ddp-example
  model=(--input 256 --hidden 2048 --dataset 4096 --local-batch 16 --lr 0.01 --steps "$steps" --print-every 1000 "$@")
  # One thread per replica, as the seeds' DataParallel has: candle's matmuls would
  # otherwise start a thread per core in every replica.
  export RAYON_NUM_THREADS=1
  # candle allocates and frees megabyte tensors every step; on the main thread glibc
  # grows and trims its heap each time (page faults), on other threads it does not.
  # Padding the heap's top takes that difference out of the 1-replica rows.
  export MALLOC_TOP_PAD_=$((64 << 20))
else
  cargo build --release -q --example ddp_mlp
  mlp=target/release/examples/ddp_mlp
  model=(--input 256 --hidden 512 --layers 4 --local-batch 16 --steps "$steps" --print-every 1000 "$@")
fi
ringrun=target/release/ringrun

field() { grep -o "$1=[^ ]*" | head -n 1 | cut -d= -f2; }

echo "| replicas | set-up | step time (ms) | peak RSS (MiB) | final_params_l2 |"
echo "|---|---|---|---|---|"
for r in 1 2 4; do
  for setup in dp threads processes; do
    case $setup in
      dp) out=$("$mlp" --mode dp --replicas "$r" "${model[@]}" 2>&1) ;;
      threads) out=$("$mlp" --mode ddp --replicas "$r" "${model[@]}" 2>&1) ;;
      processes) out=$("$ringrun" --nproc-per-node "$r" "$mlp" "${model[@]}" 2>&1) ;;
    esac
    echo "| $r | $setup | $(field step_time_ms <<<"$out") | $(field peak_rss_mb <<<"$out") | $(field final_params_l2 <<<"$out") |"
    if [ "$setup" = dp ]; then
      grep -o "dp_phases_ms.*" <<<"$out" | sed "s/^/  dp $r replicas: /" >&2 || true
    fi
  done
done
