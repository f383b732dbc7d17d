//! # ringccl-tools
//!
//! The command-line tools of [ringccl](ringccl): the `ringrun` launcher and the
//! `ringccl-bench` benchmark (`cargo install --path tools` installs both), and the
//! library that `ringrun` diagnoses hangs with.
//!
//! ## A tour
//!
//! - **`ringrun`** (`src/bin/ringrun/`): starts the ranks of a job on this node with
//!   torchrun's environment variables, forwards signals, restarts a failed job
//!   (`--max-restarts`), merges the ranks' timelines (`--trace`), watches for hangs
//!   (`--hang-timeout`) and diagnoses them; `ringrun diagnose DIR` does so offline.
//! - **`ringccl-bench`** (`src/bin/ringccl-bench/`): the collective microbenchmark, in
//!   nccl-tests' format, with every result checked element for element; `cargo bench
//!   --bench allreduce` runs its default sweep.
//! - **[`diagnose`]**: the analysis across ranks of the flight recorder's dumps and
//!   beacons ([`ringccl::flight`]), which says who is stuck where and why. The library
//!   writes the dumps; only the tools read them, so the analysis lives here.
//!
//! ```
//! use ringccl::flight::dump::FlightDump;
//! use ringccl_tools::diagnose::{diagnose, Evidence};
//!
//! let mut evidence = Evidence::at(10_000_000);
//! evidence.dumps.push(FlightDump::empty(0, 2, "main", "requested"));
//! assert_eq!(diagnose(&evidence).groups[0].missing, [1]);
//! ```

#![deny(unsafe_code)]

pub mod diagnose;
