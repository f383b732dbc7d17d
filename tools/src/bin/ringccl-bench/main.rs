//! `ringccl-bench`: collective microbenchmark in the nccl-tests format.
//!
//! With no arguments it runs the embedded default: the gloo backend on loopback, 4 ranks
//! spawned locally, float32 sum all-reduce from 8 B to 64 MiB in steps of ×4. It prints
//! `size(B) count(elements) type redop root time(us) algbw(GB/s) busbw(GB/s) #wrong` per
//! size (plus `loop(us)` and `iters`) and an "Avg bus bandwidth" footer.
//!
//! `--transport memory` runs the ranks (`--np`, default 4) as threads of this one process,
//! connected in memory (`ringccl::local_groups`), to compare with the shared-memory
//! transport between processes.
//!
//! Under a launcher (no `--np`) each process is one rank: `ringrun` or `torchrun` (RANK
//! set), OpenMPI's `mpirun` (with MASTER_ADDR and MASTER_PORT passed by `-x`), Slurm's
//! `srun` (see `InitOptions::launched_as_rank`).
//!
//! Method (the same as `shared/peers`' scripts, so figures compare side by side): per size,
//! warm-up calls, then `-n` iterations or, by default, a calibrated ~`--budget` seconds of
//! back-to-back calls. `time` is the median over iterations of the slowest rank's time for
//! that iteration; `loop` is the slowest rank's loop time divided by the iterations.
//! algbw = bytes / time; busbw uses the nccl-tests factors (all-reduce 2(N−1)/N;
//! all-gather, reduce-scatter, all-to-all (N−1)/N; broadcast, reduce 1). `#wrong` counts,
//! over all ranks, the elements that differ from the exact expected result after `-c`
//! check iterations with rank-dependent, exactly representable inputs.

#![deny(unsafe_code)]

mod args;
mod bench_op;
mod check;
#[cfg(feature = "nccl")]
mod device;
mod elements;
mod launch;
mod measure;
mod memory;
mod overlap;
mod progress;
mod rank;
mod report;
mod sweep;

use std::process::ExitCode;

use args::Args;
use clap::Parser;
use launch::{launch, CHILD_VAR};
use rank::{run_rank, run_threads, IN_PROCESS};
use ringccl::InitOptions;

pub(crate) fn main() -> ExitCode {
    ringccl::logging::init_from_env();
    let args = Args::parse();
    let result = if args.transport.as_deref() == Some(IN_PROCESS) {
        run_threads(&args, args.np.unwrap_or(4))
    } else if std::env::var_os(CHILD_VAR).is_some() {
        run_rank(&args, true)
    } else if let Some(np) = args.np {
        if np == 0 {
            Err("--np must be at least 1".into())
        } else {
            launch(np)
        }
    } else if InitOptions::launched_as_rank() {
        run_rank(&args, false)
    } else {
        launch(4)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringccl-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
