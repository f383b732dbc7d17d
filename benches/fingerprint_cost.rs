//! What the NCCL backend's fingerprint check costs per collective: each rank sends its
//! op's description to the next rank over the control connections while NCCL runs, and
//! waits for the previous rank's before the call returns.
//!
//! `cargo bench --bench fingerprint_cost` runs that exchange alone (no NCCL, no GPU) on
//! 2 and 4 ranks as threads of this process, connected over loopback TCP by the real
//! control threads, and prints the median time from posting to a checked answer. Under
//! NCCL it overlaps the collective, so it adds to a call only where it exceeds the
//! collective's own time.

#![deny(unsafe_code)]

use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ringccl_collectives::control::GroupControl;
use ringccl_collectives::{DType, Deadline, OpDesc, ReduceOp};
use ringccl_transports::ControlLink;

fn mesh(n: usize) -> std::io::Result<Vec<Vec<Option<TcpStream>>>> {
    let mut conns: Vec<Vec<Option<TcpStream>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for (a, b) in (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))) {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let out = TcpStream::connect(listener.local_addr()?)?;
        let (inc, _) = listener.accept()?;
        conns[a][b] = Some(out);
        conns[b][a] = Some(inc);
    }
    Ok(conns)
}

fn median_us(n: usize, rounds: u64) -> std::io::Result<f64> {
    let links = mesh(n)?
        .into_iter()
        .enumerate()
        .map(|(rank, c)| {
            let control = GroupControl::new(rank);
            ControlLink::start(rank, c, Duration::from_secs(5), Arc::clone(&control))
                .map(|link| (link, control))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let start = Barrier::new(n);
    let times: Vec<Vec<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = links
            .iter()
            .enumerate()
            .map(|(rank, (_, control))| {
                let start = &start;
                s.spawn(move || {
                    let deadline = Deadline::after(Duration::from_secs(60));
                    let mut times = Vec::new();
                    start.wait();
                    for seq in 1..=rounds {
                        let op = OpDesc::all_reduce(seq, DType::F32, 1024, ReduceOp::Sum);
                        let t = Instant::now();
                        control.post_fingerprint(op);
                        control
                            .check_fingerprint(&op, (rank + n - 1) % n, deadline)
                            .expect("every rank runs the same op");
                        times.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    times
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    let mut all: Vec<f64> = times.into_iter().flatten().collect();
    all.sort_by(f64::total_cmp);
    Ok(all[all.len() / 2])
}

fn main() -> std::io::Result<()> {
    println!("# fingerprint check: post own op, wait for the previous rank's, compare");
    for n in [2, 4] {
        let us = median_us(n, 2000)?;
        println!("N={n}: median {us:.1} us per collective");
    }
    Ok(())
}
