#!/usr/bin/env bash
# Every GPU check of the "nccl" backend and of device buffers, in one command.
#
#   scripts/gpu-check.sh            build (needs cargo) and run here, on a machine with a GPU
#   scripts/gpu-check.sh build      build release binaries into .gpu-check/ (no GPU needed)
#   scripts/gpu-check.sh run        run the binaries in .gpu-check/ (needs a GPU, no cargo):
#                                   for a GPU machine without a Rust toolchain, carry the
#                                   folder there and run this
#
# It finds NCCL (the system's, or pip's nvidia-nccl-cu* wheel, whose libnccl.so.2 it links
# as libnccl.so in a private folder put first on LD_LIBRARY_PATH) and runs:
#   1. tests/nccl.rs: NCCL at world size 1, every op and dtype, host and device buffers;
#      gloo with device buffers at 2, 3 and 4 ranks sharing the GPU; init failure paths;
#      two NCCL ranks on one GPU fail cleanly (NCCL refuses that) or work.
#   2. ringccl-bench --backend nccl (device memory, as nccl-tests), every dtype and op.
#   3. ringccl-bench --backend gloo --memory device at 2 and 4 ranks.
# and prints a summary; the exit status is non-zero if any step failed.
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/.gpu-check"
mode=${1:-all}

build() {
    command -v cargo >/dev/null || { echo "gpu-check: cargo is needed to build" >&2; exit 2; }
    mkdir -p "$out"
    (cd "$here" && cargo build --release --bin ringccl-bench) || exit 1
    local test_bin
    test_bin=$(cd "$here" && cargo test --release --test nccl --no-run 2>&1 |
        grep -o 'target/release/deps/nccl-[0-9a-f]*' | tail -1)
    [ -n "$test_bin" ] || { echo "gpu-check: could not build tests/nccl.rs" >&2; exit 1; }
    cp "$here/$test_bin" "$out/nccl-tests"
    cp "$here/target/release/ringccl-bench" "$out/ringccl-bench"
    strip "$out/nccl-tests" "$out/ringccl-bench" 2>/dev/null || true
    cp "$0" "$out/gpu-check.sh"
    echo "gpu-check: built $(du -sh "$out" | cut -f1) into $out"
}

find_nccl() {
    # A loadable libnccl.so already? Then nothing to do.
    if ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
        echo "gpu-check: system libnccl.so found by the loader"
        return
    fi
    local lib=""
    for py in python3 python; do
        command -v "$py" >/dev/null || continue
        lib=$("$py" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for root in roots:
    for hit in glob.glob(os.path.join(root, "nvidia", "nccl", "lib", "libnccl.so*")):
        print(hit)
        raise SystemExit
EOF
        )
        [ -n "$lib" ] && break
    done
    if [ -z "$lib" ]; then
        lib=$(find / -xdev -name 'libnccl.so*' -path '*nvidia/nccl/lib*' 2>/dev/null | head -1)
    fi
    if [ -z "$lib" ]; then
        echo "gpu-check: no NCCL found (the NCCL steps will report it)"
        return
    fi
    local links="${TMPDIR:-/tmp}/ringccl-nccl-lib"
    mkdir -p "$links"
    ln -sf "$lib" "$links/libnccl.so"
    export LD_LIBRARY_PATH="$links:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu-check: using pip's NCCL $lib (linked as $links/libnccl.so)"
}

summary=()
step() {
    local name=$1
    shift
    echo
    echo "=== $name: $*"
    local log="$out/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_').log"
    if "$@" 2>&1 | tee "$log"; then
        summary+=("PASS  $name")
    else
        summary+=("FAIL  $name (log: $log)")
    fi
    # The lines worth pasting: skips, footers, oks.
    grep -E 'skipped|Out of bounds|Avg bus bandwidth|test result|: ok|failed cleanly|backend nccl|backend gloo' "$log" |
        sed 's/^/    /' >>"$out/summary.txt"
}

run() {
    [ -x "$out/nccl-tests" ] || { echo "gpu-check: run '$0 build' first" >&2; exit 2; }
    : >"$out/summary.txt"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    find_nccl
    export RINGCCL_BENCH_BIN="$out/ringccl-bench"
    step "nccl tests" "$out/nccl-tests" --test-threads=1 --nocapture
    step "bench nccl all types and ops" "$out/ringccl-bench" --backend nccl --np 1 \
        -b 8 -e 64M -f 8 -d all -o all -w 2 --budget 0.3
    step "bench nccl float sum sweep" "$out/ringccl-bench" --backend nccl --np 1 -b 8 -e 256M -f 4
    step "bench gloo device memory 2 ranks" "$out/ringccl-bench" --backend gloo --memory device \
        --np 2 -b 8 -e 16M -f 16 --budget 0.3
    step "bench gloo device memory 4 ranks" "$out/ringccl-bench" --backend gloo --memory device \
        --np 4 -b 8 -e 16M -f 16 -d all --budget 0.2
    # NCCL calls on the timeline: one span per call, algorithm "device library".
    trace_dir="$out/trace"
    rm -rf "$trace_dir"
    step "nccl timeline" sh -c "RINGCCL_TRACE='$trace_dir' '$out/ringccl-bench' --backend nccl \
        --np 1 -b 8 -e 1K -n 20 && grep -l 'device library' '$trace_dir'/*.json"
    echo
    echo "=== gpu-check summary"
    printf '%s\n' "${summary[@]}"
    cat "$out/summary.txt"
    printf '%s\n' "${summary[@]}" | grep -q '^FAIL' && exit 1
    exit 0
}

case "$mode" in
build) build ;;
run) run ;;
all) build && run ;;
*) echo "usage: $0 [build|run]" >&2; exit 2 ;;
esac
