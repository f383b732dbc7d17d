//! The ddp_mlp example in its set-ups: DataParallel, DDP over threads, DDP over processes
//! under ringrun, and one process; they must agree.

use crate::common;

use std::process::Command;

use common::{example, final_params_l2, heavy_lock};

/// Runs ddp_mlp (directly, or under ringrun with `nproc`) and returns its stdout.
fn mlp(nproc: Option<usize>, args: &[&str]) -> String {
    let mut command = match nproc {
        Some(n) => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_ringrun"));
            c.args(["--nproc-per-node", &n.to_string()])
                .arg(example("ddp_mlp"));
            c
        }
        None => Command::new(example("ddp_mlp")),
    };
    let out = command
        .args(args)
        .args(["--steps", "50"])
        .output()
        .expect("run ddp_mlp");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn field<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.split(&format!("{name}=")).nth(1))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {name}= in {stdout}"))
}

#[test]
fn the_mlp_example_agrees_in_dp_ddp_threads_and_one_process() {
    let _heavy = heavy_lock();
    let one = mlp(Some(1), &["--local-batch", "64"]);
    let dp = mlp(
        None,
        &["--mode", "dp", "--replicas", "4", "--local-batch", "16"],
    );
    let threads = mlp(
        None,
        &["--mode", "ddp", "--replicas", "4", "--local-batch", "16"],
    );
    let l2 = |s: &str| final_params_l2(s).expect("final_params_l2");
    for (name, run) in [("dp", &dp), ("ddp threads", &threads)] {
        let (got, want) = (l2(run), l2(&one));
        assert!(
            ((got - want) / want).abs() < 1e-6,
            "{name}: {got} vs {want}"
        );
        assert_eq!(
            field(run, "final_params_l2"),
            field(&one, "final_params_l2"),
            "{name}"
        );
    }
    assert!(dp.contains("dp_phases_ms"), "{dp}");
    // One replica of DP is one process at the same batch, bit for bit.
    let dp_one = mlp(None, &["--mode", "dp", "--local-batch", "64"]);
    assert_eq!(
        field(&dp_one, "final_params_fnv"),
        field(&one, "final_params_fnv")
    );
    // DDP over threads and over processes run the same schedule: the same bits.
    let processes = mlp(Some(4), &["--local-batch", "16"]);
    assert_eq!(
        field(&threads, "final_params_fnv"),
        field(&processes, "final_params_fnv")
    );
}
