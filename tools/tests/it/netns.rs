//! ringrun across hosts: network namespaces on a bridge, one ringrun per host. Needs root
//! and iproute2; elsewhere the test prints why it skipped.

use crate::common;

use std::time::{Duration, Instant};

use common::netns::Lab;
use common::{example, final_params_l2, heavy_lock, text};

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");

/// `ringrun --nnodes 2` started on each of two hosts (2 ranks each) runs one job: the
/// ddp_mlp example ends with the parameters of a single-host run of the same global
/// batch. Then, in a long benchmark, a rank killed on host 1 stops host 0's ranks too,
/// with a message naming the lost rank and its host. (The store's port is ringrun's default: each lab
/// host is a fresh network namespace, where nothing else listens.)
#[test]
fn ringrun_across_two_hosts_runs_one_job_and_a_lost_rank_stops_both() {
    const NAME: &str = "ringrun_across_two_hosts_runs_one_job_and_a_lost_rank_stops_both";
    let lab = match Lab::with_hosts(&[2, 2]) {
        Ok(lab) => lab,
        Err(reason) => {
            println!("{NAME}: skipped: cannot build network namespaces ({reason})");
            return;
        }
    };
    let _heavy = heavy_lock();
    let example = example("ddp_mlp");
    let node = |k: usize, program: &dyn AsRef<std::ffi::OsStr>, args: &[&str]| {
        let mut command = lab.command_on(k, RINGRUN);
        command
            .args(["--nproc-per-node", "2", "--nnodes", "2"])
            .args(["--node-rank", &k.to_string(), "--master-addr", &lab.addr(0)])
            .arg(program)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command.spawn().expect("start ringrun")
    };
    let mlp = ["--local-batch", "16", "--steps", "30"];
    let nodes = [node(0, &example, &mlp), node(1, &example, &mlp)];
    let outs: Vec<_> = nodes
        .into_iter()
        .map(|n| n.wait_with_output().expect("ringrun's output"))
        .collect();
    for (k, out) in outs.iter().enumerate() {
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "node {k}: {stdout}{stderr}");
    }
    let across = final_params_l2(&text(&outs[0].stdout)).expect("rank 0 prints final_params_l2");
    let single = std::process::Command::new(RINGRUN)
        .args(["--nproc-per-node", "1"])
        .arg(&example)
        .args(["--local-batch", "64", "--steps", "30"])
        .output()
        .expect("run ringrun on one host");
    let alone =
        final_params_l2(&text(&single.stdout)).expect("the single run prints final_params_l2");
    assert!(
        ((across - alone) / alone).abs() < 1e-6,
        "2 hosts x 2 ranks gave {across}, one rank {alone}"
    );

    // A long benchmark; then one of host 1's ranks is killed.
    let bench = env!("CARGO_BIN_EXE_ringccl-bench");
    let long = ["-b", "64M", "-e", "64M", "-n", "100000", "-w", "1"];
    let nodes = [node(0, &bench, &long), node(1, &bench, &long)];
    std::thread::sleep(Duration::from_secs(3));
    let ringrun_1 = nodes[1].id().to_string();
    // One of its ranks (not its watchdog).
    let children = std::process::Command::new("pgrep")
        .args(["-P", &ringrun_1, "-f", "ringccl-bench"])
        .output()
        .expect("run pgrep");
    let victim = text(&children.stdout)
        .lines()
        .next()
        .map(str::to_string)
        .expect("host 1's ringrun has rank processes");
    let killed = Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &victim])
        .status()
        .expect("run kill")
        .success());
    // Both must end on their own; after two minutes they are stopped and the test fails.
    let pids: Vec<String> = nodes.iter().map(|n| n.id().to_string()).collect();
    let (ended, outs) = std::sync::mpsc::channel();
    for n in nodes {
        let ended = ended.clone();
        std::thread::spawn(move || {
            let out = n.wait_with_output().expect("ringrun ends");
            let _ = ended.send((out.status, text(&out.stdout) + &text(&out.stderr)));
        });
    }
    let mut outs: Vec<_> = (0..2)
        .filter_map(|_| outs.recv_timeout(Duration::from_secs(120)).ok())
        .collect();
    if outs.len() < 2 {
        for pid in &pids {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid])
                .status();
        }
        panic!("a ringrun still ran two minutes after the kill: {outs:?}");
    }
    // Host 0's first: it is the one that names the rank lost elsewhere.
    outs.sort_by_key(|(_, out)| !out.contains("[rank 0]"));
    let stopped = killed.elapsed();
    for (k, (status, out)) in outs.iter().enumerate() {
        assert!(!status.success(), "node {k} should fail: {out}");
    }
    let host_0 = &outs[0].1;
    assert!(
        host_0.contains("lost rank 2") || host_0.contains("lost rank 3"),
        "host 0's ranks must name the lost rank: {host_0}"
    );
    assert!(
        host_0.contains(&format!("host {} ({})", lab.host_name(1), lab.addr(1))),
        "host 0's ranks must name the lost rank's host: {host_0}"
    );
    assert!(
        stopped < Duration::from_secs(60),
        "both stopped after {stopped:?}"
    );
    println!("both hosts stopped {stopped:?} after the kill; host 0 said:\n{host_0}");
}
