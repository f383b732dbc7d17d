//! `cargo bench --bench allreduce`: the `ringccl-bench` binary's default run (gloo on
//! loopback, 4 ranks spawned locally, float32 sum all-reduce from 8 B to 64 MiB). Flags go
//! after `--`, as for the binary (`ringccl-bench --help`).

#![deny(unsafe_code)]

#[path = "../src/bin/ringccl-bench/main.rs"]
mod ringccl_bench;

fn main() -> std::process::ExitCode {
    ringccl_bench::main()
}
