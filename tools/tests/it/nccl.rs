//! The benchmark under the `"nccl"` backend: on a machine with CUDA and NCCL it runs and
//! checks out; elsewhere it fails with an error that says what is missing, never a panic.

#![cfg(feature = "nccl")]

use crate::common;

use std::process::Command;

use common::heavy_lock;
use ringccl::NcclBackend;

/// The benchmark binary; `RINGCCL_BENCH_BIN` overrides it where the tests run from a
/// copy (scripts/gpu-check.sh on a GPU machine without a toolchain).
fn bench_bin() -> String {
    std::env::var("RINGCCL_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ringccl-bench").into())
}

#[test]
fn the_benchmark_runs_under_nccl_or_says_why_not() {
    let _heavy = heavy_lock();
    let out = Command::new(bench_bin())
        .args([
            "--np",
            "1",
            "--backend",
            "nccl",
            "-b",
            "8",
            "-e",
            "64K",
            "-n",
            "3",
            "-w",
            "1",
        ])
        .output()
        .expect("run ringccl-bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    if NcclBackend::probe().is_ok() {
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("Out of bounds values : 0 OK"), "{stdout}");
        assert!(
            stdout.contains("backend nccl, 1 ranks, device memory"),
            "{stdout}"
        );
    } else {
        assert!(!out.status.success(), "{stdout}");
        assert!(stderr.contains("not available"), "{stderr}");
        assert!(stderr.contains("LD_LIBRARY_PATH"), "{stderr}");
    }
}
