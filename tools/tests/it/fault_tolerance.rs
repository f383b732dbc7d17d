//! Training that survives a crash: ddp_mlp with snapshots under `ringrun --max-restarts
//! 3`, one rank SIGKILLed at a random moment, must end with the same parameters, bit for
//! bit, as a run nobody killed.

use crate::common;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{example, heavy_lock};

const RANKS: usize = 3;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ringccl-ft-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn start(checkpoints: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ringrun"))
        .args([
            "--nproc-per-node",
            &RANKS.to_string(),
            "--max-restarts",
            "3",
        ])
        .arg(example("ddp_mlp"))
        .args([
            "--steps",
            "400",
            "--local-batch",
            "8",
            "--hidden",
            "96",
            "--layers",
            "3",
        ])
        .args([
            "--momentum",
            "0.9",
            "--print-every",
            "100",
            "--checkpoint-every",
            "25",
        ])
        .arg("--checkpoint")
        .arg(checkpoints)
        .env("RINGCCL_TIMEOUT", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ringrun")
}

fn finish(child: Child) -> (Output, String) {
    let out = child.wait_with_output().expect("wait for ringrun");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

fn fnv(text: &str) -> String {
    text.lines()
        .find_map(|l| l.split("final_params_fnv=").nth(1))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no final_params_fnv line in:\n{text}"))
}

/// The worker processes of ringrun `parent` and their ranks (from their RANK variable).
fn workers(parent: u32) -> Vec<(u32, usize)> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let rank = environ
                .split(|&b| b == 0)
                .find_map(|var| var.strip_prefix(b"RANK="))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
            if let Some(rank) = rank {
                found.push((pid, rank));
            }
        }
    }
    found
}

#[test]
fn a_rank_killed_at_a_random_moment_resumes_to_the_same_bits() {
    let _heavy = heavy_lock();
    let reference_dir = scratch("reference");
    let started = Instant::now();
    let (out, reference) = finish(start(&reference_dir));
    let wall = started.elapsed();
    assert!(
        out.status.success(),
        "the uninterrupted run failed:\n{reference}"
    );
    let want = fnv(&reference);

    let random = RandomState::new().hash_one(std::process::id());
    let victim = (random % RANKS as u64) as usize;
    // Anywhere from start-up to the last steps of the reference run's length.
    let fraction = 0.05 + 0.85 * ((random >> 8) % 1000) as f64 / 1000.0;
    let at = wall.mul_f64(fraction);
    eprintln!("killing rank {victim} after {at:?} (the uninterrupted run took {wall:?})");

    let dir = scratch("killed");
    let mut killed = None;
    for attempt in 0..3 {
        let _ = std::fs::remove_dir_all(&dir);
        let child = start(&dir);
        let delay = at.mul_f64(0.5f64.powi(attempt));
        let deadline = Instant::now() + delay;
        while Instant::now() < deadline {
            thread::sleep(Duration::from_millis(2));
        }
        let target = workers(child.id())
            .into_iter()
            .find(|&(_, rank)| rank == victim);
        if let Some((pid, _)) = target {
            // A pid just read from /proc; at worst the worker has exited since.
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            let saved = std::fs::read_dir(&dir)
                .map(|entries| {
                    entries
                        .flatten()
                        .any(|e| e.file_name().to_string_lossy().ends_with(".ckpt"))
                })
                .unwrap_or(false);
            killed = Some((child, delay, saved));
            break;
        }
        // Too early (not started) or too late (finished): try again sooner.
        let (_, text) = finish(child);
        eprintln!("attempt {attempt}: no rank {victim} to kill after {delay:?}\n{text}");
    }
    let (child, delay, saved) = killed.expect("could not catch a worker alive to kill");
    let (out, text) = finish(child);
    for line in text
        .lines()
        .filter(|l| l.contains("resumed") || l.contains("restarting"))
    {
        eprintln!("{line}");
    }
    if saved {
        assert!(
            text.contains("resumed from the snapshot of step"),
            "a snapshot existed when rank {victim} was killed, but no rank resumed:\n{text}"
        );
    }
    assert!(
        out.status.success(),
        "the killed run did not recover:\n{text}"
    );
    assert!(
        text.contains("restarting the job"),
        "rank {victim} killed after {delay:?}, but ringrun restarted nothing:\n{text}"
    );
    assert_eq!(
        fnv(&text),
        want,
        "rank {victim} killed after {delay:?}: the final parameters differ from the \
         uninterrupted run's\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&reference_dir);
}
