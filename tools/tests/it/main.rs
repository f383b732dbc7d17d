//! The tests of the `ringrun` launcher and the `ringccl-bench` benchmark, in one binary
//! (`cargo test -p ringccl-tools --test it`), a module per file: they need the binaries,
//! which cargo builds for the tests of the package that owns them. The harness is the
//! library's integration tests' (`tests/it/common/`): `common::heavy_lock` serialises
//! the multi-rank tests, and a child process re-runs one test of this binary by its full
//! name (`common::test_path`).

#[path = "../../../tests/it/common/mod.rs"]
mod common;

mod bench;
mod data_parallel;
mod ddp;
mod fault_tolerance;
mod nccl;
mod netns;
mod ringrun;
mod ringrun_cleanup;
mod ringrun_diagnose;
mod startup;
mod trace;
