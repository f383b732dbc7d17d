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
#   1. tests/it/nccl.rs: NCCL at world size 1, every op and dtype, host and device buffers;
#      gloo with device buffers at 2, 3 and 4 ranks sharing the GPU; init failure paths;
#      two NCCL ranks on one GPU fail cleanly (NCCL refuses that) or work; and
#      tools/tests/it/nccl.rs: the benchmark under NCCL.
#   2. ringccl-bench --backend nccl (device memory, as nccl-tests), every dtype and op.
#   3. ringccl-bench --backend nccl (blocking, and --stream-ordered) beside PyTorch's own
#      NCCL all-reduce (sync each, and loop), both at world
#      size 1 on this GPU in the same run, and the ratio of their per-call times.
#   4. ringccl-bench --backend gloo --memory device at 2 and 4 ranks.
#   5. tests/it/device_ddp.rs (device DDP bit for bit against host DDP, NCCL's deadline) and
#      examples/ddp_gpu: the MLP trained on the GPU against host DDP, and the overlap.
# and prints a summary (PASS, FAIL, or SKIP with the reason a test gave for running
# nothing); the exit status is non-zero if any step failed. Each test and each
# step runs on its own with a limit (GPU_CHECK_STEP_LIMIT, 150 s): a step still running
# then has every thread's stack printed (cuda-gdb) and is killed. GPU_CHECK_SKIP, a
# regular expression, skips the steps whose names it matches; GPU_CHECK_ONLY runs only
# those it matches (to split a run across calls to a machine lent for a few minutes).
# Step names: "test <name>", "ddp_gpu ...", "bench ...", "nccl timeline".
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/.gpu-check"
mode=${1:-all}
# The packages whose test binary (`it`) holds GPU checks, and the modules that hold them.
PACKAGES="ringccl ringccl-tools"
SUITES="nccl device_ddp"

build() {
    command -v cargo >/dev/null || { echo "gpu-check: cargo is needed to build" >&2; exit 2; }
    mkdir -p "$out"
    (cd "$here" && cargo build --release -p ringccl-tools --bin ringccl-bench \
        -p ringccl --example ddp_gpu) || exit 1
    local package test_bin
    for package in $PACKAGES; do
        test_bin=$(cd "$here" && cargo test --release -p "$package" --test it --no-run 2>&1 |
            grep -o "target/release/deps/it-[0-9a-f]*" | tail -1)
        [ -n "$test_bin" ] || { echo "gpu-check: could not build $package's tests" >&2; exit 1; }
        cp "$here/$test_bin" "$out/$package-tests"
    done
    cp "$here/target/release/ringccl-bench" "$out/ringccl-bench"
    cp "$here/target/release/examples/ddp_gpu" "$out/ddp_gpu"
    # Keep the symbols (names in the stacks of a hang), drop the debug info (size).
    (cd "$out" && strip --strip-debug ./*-tests ringccl-bench ddp_gpu 2>/dev/null) || true
    cp "$0" "$out/gpu-check.sh"
    cp "$here/scripts/torch_nccl_allreduce.py" "$out/"
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
# Each step gets at most this many seconds; one still running then has every thread's
# stack printed (cuda-gdb, where the machine has it) and is killed, so a hang becomes a
# diagnosis instead of a lost run.
limit=${GPU_CHECK_STEP_LIMIT:-150}

descendants() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do
        echo "$child"
        descendants "$child"
    done
}

stacks() {
    local gdb p
    gdb=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
    [ -n "$gdb" ] || { echo "gpu-check: no cuda-gdb here to print the stacks"; return; }
    for p in "$@"; do
        echo "--- stacks of process $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-160)"
        timeout 60 "$gdb" -p "$p" -batch -ex 'set pagination off' -ex 'thread apply all bt 25' 2>&1 |
            grep -E '^(Thread|#)' | head -300
    done
}

bounded() {
    "$@" &
    local pid=$! waited=0 all
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$waited" -ge "$limit" ]; then
            echo "gpu-check: HANG: still running after ${limit}s: $*"
            all="$pid $(descendants "$pid")"
            # shellcheck disable=SC2086 # one word per process id
            stacks $all
            # shellcheck disable=SC2086
            kill -9 $all 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 1
        waited=$((waited + 1))
    done
    wait "$pid"
}

step() {
    local name=$1
    shift
    if [ -n "${GPU_CHECK_SKIP:-}" ] && [[ $name =~ $GPU_CHECK_SKIP ]]; then
        summary+=("SKIP  $name (GPU_CHECK_SKIP)")
        return
    fi
    if [ -n "${GPU_CHECK_ONLY:-}" ] && ! [[ $name =~ $GPU_CHECK_ONLY ]]; then
        summary+=("SKIP  $name (not in GPU_CHECK_ONLY)")
        return
    fi
    echo
    echo "=== $name: $*"
    local log started=$SECONDS
    log="$out/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_').log"
    if bounded "$@" 2>&1 | tee "$log"; then
        # A test that found nothing to run on (no NCCL, one GPU where it needs two)
        # passes without checking anything: the summary says so, with its reason.
        local skip
        skip=$(grep -m1 -E '(^|[a-z0-9_]: )skipped: ' "$log" | grep -o 'skipped: .*' | cut -c10-170)
        if [ -n "$skip" ]; then
            summary+=("SKIP  $name ($skip)")
        else
            summary+=("PASS  $name ($((SECONDS - started)) s)")
        fi
    else
        summary+=("FAIL  $name ($((SECONDS - started)) s; log: $log)")
    fi
    # The lines worth pasting: skips, footers, oks, hangs, ratios.
    grep -E 'skipped|Out of bounds|Avg bus bandwidth|test result|: ok|failed cleanly|backend nccl|backend gloo|HANG|LOST|ratio|panicked|max_param_diff|reference:|step_ms|after ' "$log" |
        sed 's/^/    /' >>"$out/summary.txt"
}

# ringccl-bench --backend nccl and PyTorch's NCCL all-reduce, both at world size 1 on
# this GPU, one after the other; prints the ratio of their per-call times per size.
versus_torch() {
    local py
    py=$(command -v python3 || command -v python) || { echo "skipped: no python"; return 0; }
    "$py" -c 'import torch' 2>/dev/null || { echo "skipped: no PyTorch"; return 0; }
    "$py" "$out/torch_nccl_allreduce.py" --min 8 --max 67108864 --factor 8 >"$out/torch.txt" || return 1
    rm -f "$out/ringccl.json"
    "$out/ringccl-bench" --backend nccl --np 1 -b 8 -e 64M -f 8 --budget 0.3 \
        --json "$out/ringccl.json" || return 1
    rm -f "$out/ringccl-stream.json"
    "$out/ringccl-bench" --backend nccl --np 1 -b 8 -e 64M -f 8 --budget 0.3 \
        --stream-ordered --json "$out/ringccl-stream.json" || return 1
    cat "$out/torch.txt"
    "$py" - "$out/torch.txt" "$out/ringccl.json" "$out/ringccl-stream.json" <<'EOF'
import json, sys
torch = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if parts and parts[0].isdigit():
        torch[int(parts[0])] = (float(parts[1]), float(parts[2]))
def compare(path, column, title):
    print(f"{'bytes':>12} {'ringccl us':>11} {'torch us':>9} {'ratio':>6}  ({title}; above 1: ringccl faster)")
    worst = None
    for line in open(path):
        row = json.loads(line)
        t = torch.get(row["size"])
        if t is None:
            continue
        ratio = t[column] / row["time_us"]
        worst = ratio if worst is None else min(worst, ratio)
        print(f"{row['size']:>12} {row['time_us']:>11.2f} {t[column]:>9.2f} {ratio:>6.2f}")
    print(f"ratio worst over sizes ({title}): {worst:.2f}" if worst else "ratio: no common sizes")
compare(sys.argv[2], 0, "torch sync-each / ringccl blocking")
compare(sys.argv[3], 1, "torch loop / ringccl --stream-ordered loop")
EOF
}

# A backward slowed to 25 ms per layer (5 layers, 13M parameters, 2 ranks under gloo
# staging device buckets): with buckets marked as produced the step should cost about the
# backward alone; marked after backward, the backward plus the all-reduces. $1: where the
# extra time goes, host (drain the stream, sleep) or gpu (a spinning kernel: the host
# runs ahead, so a staging copy that waited for the whole stream would lose the overlap).
overlap() {
    local on off slow_on=${1:-host}
    on=$("$out/ddp_gpu" --backend gloo --replicas 2 --hidden 1600 --layers 5 --input 64 \
        --steps 8 --slow-backward-ms 25 --slow-backward-on "$slow_on" --overlap on) || return 1
    off=$("$out/ddp_gpu" --backend gloo --replicas 2 --hidden 1600 --layers 5 --input 64 \
        --steps 8 --slow-backward-ms 25 --slow-backward-on "$slow_on" --overlap off) || return 1
    echo "$on"
    echo "$off"
    local s_on b_on s_off
    s_on=$(echo "$on" | sed -n 's/^step_ms=\([0-9.]*\).*/\1/p')
    b_on=$(echo "$on" | sed -n 's/.* backward_ms=\([0-9.]*\) .*/\1/p')
    s_off=$(echo "$off" | sed -n 's/^step_ms=\([0-9.]*\).*/\1/p')
    awk -v s="$s_on" -v b="$b_on" -v o="$s_off" 'BEGIN {
        printf "overlap ratio: step %.1f ms with overlap, %.1f ms without, backward %.1f ms: step/backward %.2f (overlap on), %.2f (off)\n", s, o, b, s / b, o / b
        # The check: buckets marked as produced must beat buckets marked at the end.
        if (!(s < o)) { print "overlap LOST: the step with overlap is no faster than without"; exit 1 } }'
}

run() {
    [ -x "$out/ringccl-tests" ] || { echo "gpu-check: run '$0 build' first" >&2; exit 2; }
    : >"$out/summary.txt"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    find_nccl
    export RINGCCL_BENCH_BIN="$out/ringccl-bench"
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    # One step per test, so that a hang costs one step, not the run.
    local package suites tests t
    suites=$(echo "$SUITES" | sed 's/ /|/g')
    for package in $PACKAGES; do
        tests=$("$out/$package-tests" --list 2>/dev/null | sed -n 's/: test$//p' |
            grep -E "^($suites)::")
        # A binary that cannot even list its tests (a loader error, a crash at start)
        # must not pass by running nothing.
        [ -n "$tests" ] || summary+=("FAIL  list the $package tests (none listed: run '$out/$package-tests --list')")
        for t in $tests; do
            step "test $t" "$out/$package-tests" --exact "$t" --test-threads=1 --nocapture
        done
    done
    # Device DDP trains the MLP on the GPU; the same run trains it on the host with host
    # DDP and compares the parameters.
    step "ddp_gpu nccl world size 1 against host DDP" "$out/ddp_gpu" --backend nccl \
        --replicas 1 --reference on --steps 30
    step "ddp_gpu gloo 4 ranks sharing the GPU against host DDP" "$out/ddp_gpu" --backend gloo \
        --replicas 4 --reference on --steps 30
    step "ddp_gpu overlap" overlap
    step "ddp_gpu overlap, slow backward on the GPU" overlap gpu
    step "bench nccl all types and ops" "$out/ringccl-bench" --backend nccl --np 1 \
        -b 8 -e 64M -f 64 -d all -o all -w 2 --budget 0.1
    step "bench nccl versus torch" versus_torch
    step "bench gloo device memory 2 ranks" "$out/ringccl-bench" --backend gloo --memory device \
        --np 2 -b 8 -e 16M -f 16 --budget 0.3
    step "bench gloo device memory 4 ranks" "$out/ringccl-bench" --backend gloo --memory device \
        --np 4 -b 8 -e 16M -f 16 -d all --budget 0.1
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
