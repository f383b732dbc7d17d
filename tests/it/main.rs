//! ringccl's integration tests, in one binary: one link instead of one per file, and
//! `common::heavy_lock` serialises the multi-rank tests of every file. A child process
//! re-runs one test of this binary by its full name (`common::test_path`).
//!
//! The tests of the `ringrun` and `ringccl-bench` binaries are the `ringccl-tools`
//! package's (`tools/tests/it/`), which shares `common` with this binary.
//!
//! `tests/env.rs` stays a binary of its own: it changes the process environment, which
//! would race with every other test here.

mod common;

mod abort;
mod async_ops;
mod auth;
mod blame;
mod collectives;
mod data_parallel;
mod ddp;
mod ddp_api;
mod deadlines;
mod device_ddp;
mod errors;
mod flight;
mod foreign_store;
mod groups;
mod idle_cpu;
mod local_groups;
mod module_graph;
mod nccl;
mod netns;
mod one_copy;
mod p2p_deadlock;
mod rendezvous;
mod rendezvous_hostile;
mod setup_crash;
mod shared_buffers;
mod shm;
mod shm_hostile;
mod soak;
mod startup;
mod threads;
mod trace;
