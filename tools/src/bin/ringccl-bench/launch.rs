//! Spawning the ranks locally (`--np N`): this same binary, once per rank, on loopback.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::progress::{Progress, PROGRESS_PREFIX};

/// Set in the environment of ranks this launcher started.
pub(crate) const CHILD_VAR: &str = "RINGCCL_BENCH_CHILD";
/// Rank 0 prints this followed by the store's port, for the launcher to pass on.
pub(crate) const PORT_PREFIX: &str = "RINGCCL_BENCH_PORT=";
const RUN_LIMIT: Duration = Duration::from_secs(3600);

fn spawn_rank(rank: usize, np: usize, port: u16) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    Command::new(exe)
        .args(std::env::args().skip(1))
        .env(CHILD_VAR, "1")
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", np.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.max(1).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawning rank {rank}: {e}"))
}

/// Starts `np` ranks, forwards rank 0's output, and waits for all of them.
pub(crate) fn launch(np: usize) -> Result<(), String> {
    let (tx, rx) = mpsc::channel::<Option<String>>();
    let mut children = vec![spawn_rank(0, np, 0)?];
    let stdout = children[0].stdout.take().ok_or("no stdout")?;
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    let deadline = Instant::now() + RUN_LIMIT;
    let mut progress = Progress::for_launcher();
    let kill = |children: &mut Vec<Child>| {
        for c in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Some(line)) => {
                if let Some(port) = line.strip_prefix(PORT_PREFIX) {
                    let port: u16 = port.parse().map_err(|e| format!("port line: {e}"))?;
                    for rank in 1..np {
                        let mut child = spawn_rank(rank, np, port)?;
                        // Only rank 0 prints; drain the others anyway.
                        if let Some(out) = child.stdout.take() {
                            thread::spawn(move || {
                                for _ in BufReader::new(out).lines().map_while(Result::ok) {}
                            });
                        }
                        children.push(child);
                    }
                } else if let Some(text) = line.strip_prefix(PROGRESS_PREFIX) {
                    progress.show(text);
                } else {
                    progress.clear();
                    println!("{line}");
                    let _ = std::io::stdout().flush();
                }
            }
            Ok(None) => break,
            Err(_) => {
                kill(&mut children);
                return Err(format!("ranks did not finish within {RUN_LIMIT:?}"));
            }
        }
    }
    progress.clear();
    let mut failed = Vec::new();
    for (rank, child) in children.iter_mut().enumerate() {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => failed.push(format!("rank {rank}: {status}")),
            Err(e) => failed.push(format!("rank {rank}: {e}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}
