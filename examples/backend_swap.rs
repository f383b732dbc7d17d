//! One program, either backend: the backend is a command-line word and nothing else
//! changes.
//!
//! ```sh
//! cargo build --examples
//! ringrun --nproc-per-node 2 target/debug/examples/backend_swap gloo
//! ringrun --nproc-per-node 1 target/debug/examples/backend_swap nccl   # on a GPU machine
//! ```
//!
//! It averages a host buffer, and — where a GPU is visible — a buffer in GPU memory, then
//! checks both against the expected mean on every rank.

use ringccl::{init_process_group, InitOptions, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = std::env::args().nth(1).unwrap_or_else(|| "gloo".into());
    let opts = InitOptions::from_env()?;
    let local_rank = opts.local_rank.unwrap_or(opts.rank);
    let pg = init_process_group(&backend, opts)?;
    let (rank, n) = (pg.rank(), pg.world_size());
    // Rank r contributes r + 1; the mean over n ranks is (n + 1) / 2.
    let mean = (n as f32 + 1.0) / 2.0;

    let mut host = vec![rank as f32 + 1.0; 1 << 16];
    pg.all_reduce(&mut host, ReduceOp::Avg)?;
    assert!(host.iter().all(|&x| x == mean), "host buffer: {}", host[0]);
    #[cfg_attr(not(feature = "nccl"), allow(unused_mut))]
    let mut done = format!("host buffer averaged to {mean}");

    #[cfg(feature = "nccl")]
    if let Ok(devices) = ringccl::cuda_device_count() {
        use ringccl::cudarc::driver::CudaContext;
        let device = pg.cuda_device().unwrap_or(local_rank % devices);
        let stream = CudaContext::new(device)?.default_stream();
        let mut grads = stream.clone_htod(&vec![rank as f32 + 1.0; 1 << 16])?;
        pg.all_reduce_device(&mut grads, ReduceOp::Avg)?;
        let back = stream.clone_dtoh(&grads)?;
        assert!(
            back.iter().all(|&x| x == mean),
            "device buffer: {}",
            back[0]
        );
        done.push_str(&format!(", device buffer on cuda:{device} too"));
    }
    let _ = local_rank;
    println!("rank {rank}/{n} ({}): {done}", pg.backend());
    pg.barrier()?;
    Ok(())
}
