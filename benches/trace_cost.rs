//! What the timeline (`RINGCCL_TRACE`) costs per collective on the calling thread.
//!
//! `cargo bench --bench trace_cost` runs 8-byte all-reduces on a group of one (the
//! `"gloo"` engine over the in-memory transport: no peers, so the call is nothing but the
//! runner's and engine's own work) with tracing off and on, and prints the median time
//! per call over batches of 4,000 calls. With tracing on, each call reads the clock twice,
//! totals its bytes per peer and queues one span; the writer thread turns spans into JSON
//! between batches (it gets 150 ms to drain, as it would between bursts in a real job),
//! so every timed span is queued, none dropped. Off, the group has no hooks attached.

#![deny(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::{
    Backend, BufferMut, Deadline, GroupRunner, HostBackend, HostConfig, HostEngine, MemoryConfig,
    MemoryTransport, ReduceOp,
};
use ringccl_observe::timeline::{CollectiveTrace, TraceFile};
use ringccl_observe::Observers;

const BATCH: usize = 4000;
const BATCHES: usize = 25;

fn backend(trace: Option<CollectiveTrace>) -> HostBackend<MemoryTransport> {
    let transport = MemoryTransport::mesh(1, MemoryConfig::default()).remove(0);
    let engine = HostEngine::new(transport, HostConfig::default());
    let mut backend = GroupRunner::with_engine("gloo", 0, 1, Duration::from_secs(60), engine);
    if let Some(trace) = trace {
        backend.attach_hooks(Arc::new(Observers::new(None, Some(trace))));
    }
    backend
}

/// Median nanoseconds per call over the batches.
fn per_call_ns(backend: &dyn Backend) -> f64 {
    let mut x = [1.0f32, 2.0];
    let mut per_call = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let started = Instant::now();
        for _ in 0..BATCH {
            let deadline = Deadline::after(Duration::from_secs(60));
            backend
                .all_reduce(BufferMut::from_slice(&mut x), ReduceOp::Sum, deadline)
                .expect("a group of one cannot fail");
        }
        per_call.push(started.elapsed().as_nanos() as f64 / BATCH as f64);
        std::thread::sleep(Duration::from_millis(150));
    }
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

fn main() -> std::io::Result<()> {
    println!(
        "# 8-byte all_reduce on a group of one, median ns per call ({BATCHES} x {BATCH} calls)"
    );
    let off = per_call_ns(&backend(None));
    let file = TraceFile::to_writer(std::io::sink(), 0)?;
    let traced = backend(Some(CollectiveTrace::new(
        file.new_row("collectives"),
        "memory",
    )));
    let on = per_call_ns(&traced);
    let dropped = file.dropped();
    println!("tracing off: {off:.0} ns");
    println!(
        "tracing on:  {on:.0} ns  (+{:.0} ns per call; {dropped} spans dropped)",
        on - off
    );
    println!(
        "writer thread: {:.0} ns per span (JSON, into a sink)",
        writer_ns()?
    );
    Ok(())
}

/// The writer thread's time per span: a batch queued at once into a new file, then the
/// file closed, which waits until the writer has written them all.
fn writer_ns() -> std::io::Result<f64> {
    let mut x = [1.0f32, 2.0];
    let mut per_span = Vec::new();
    for _ in 0..BATCHES {
        let file = TraceFile::to_writer(std::io::sink(), 0)?;
        let traced = backend(Some(CollectiveTrace::new(
            file.new_row("collectives"),
            "memory",
        )));
        for _ in 0..BATCH {
            let deadline = Deadline::after(Duration::from_secs(60));
            let _ = traced.all_reduce(BufferMut::from_slice(&mut x), ReduceOp::Sum, deadline);
        }
        let started = Instant::now();
        file.close();
        per_span.push(started.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    per_span.sort_by(f64::total_cmp);
    Ok(per_span[per_span.len() / 2])
}
