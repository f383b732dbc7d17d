//! What the always-on collective-mismatch check costs: every frame carries a 32-byte
//! header naming its collective (sequence number, kind, dtype, count, op, root, algorithm),
//! which the sender encodes and the receiver decodes and compares with its own call.
//!
//! `cargo bench --bench header_cost` times encode + decode + compare per frame and
//! multiplies by the frames one rank handles in an 8 B and a 64 MiB all-reduce at N=4
//! (from the real schedules). Compare the products with the all-reduce times in
//! docs/benchmarks.md; the wire overhead is the header bytes over the payload bytes.

#![deny(unsafe_code)]

use std::hint::black_box;
use std::time::Instant;

use ringccl_collectives::schedule::{recursive_doubling_all_reduce, ring_all_reduce};
use ringccl_collectives::wire::{Algorithm, FrameHeader, FRAME_HEADER_LEN};
use ringccl_collectives::{DType, OpDesc, ReduceOp};

fn ns_per_frame() -> f64 {
    let expected = OpDesc::all_reduce(17, DType::F32, 16 << 20, ReduceOp::Sum);
    let rounds = 20_000_000u64;
    let mut mismatches = 0u64;
    let started = Instant::now();
    for _ in 0..rounds {
        let header = FrameHeader {
            op: OpDesc {
                seq: black_box(17),
                ..expected
            },
            algorithm: Algorithm::Ring,
            payload_len: black_box(256 << 10),
        };
        let raw: [u8; FRAME_HEADER_LEN] = black_box(header.encode());
        match FrameHeader::decode(&raw) {
            Ok(h) if h.op == expected && h.algorithm == Algorithm::Ring => {}
            _ => mismatches += 1,
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(mismatches, 0);
    elapsed * 1e9 / rounds as f64
}

fn main() {
    let ns = ns_per_frame();
    println!("# header: encode + decode + compare = {ns:.1} ns per frame (one frame sent and one received cost one each)");
    println!(
        "# {:>10} {:>5} {:>10} {:>14} {:>16}",
        "size(B)", "N", "frames", "check(us)", "wire overhead"
    );
    let n = 4;
    for (bytes, rd) in [(8usize, true), (64usize << 20, false)] {
        let count = bytes / 4;
        let schedule = if rd {
            recursive_doubling_all_reduce(0, n, count, 4, 256 << 10)
        } else {
            ring_all_reduce(0, n, count, 4, 256 << 10)
        };
        let frames = schedule.sends.len() + schedule.recvs.len();
        let payload: usize = schedule.sends.iter().map(|s| s.range.len() * 4).sum();
        let headers = schedule.sends.len() * FRAME_HEADER_LEN;
        println!(
            "  {bytes:>10} {n:>5} {frames:>10} {:>14.3} {:>15.4}%",
            frames as f64 * ns / 1e3,
            100.0 * headers as f64 / payload.max(1) as f64
        );
    }
}
