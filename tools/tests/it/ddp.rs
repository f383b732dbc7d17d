//! DDP over processes: the ddp_mlp example under ringrun gives the same parameters for
//! every split of the same global batch.

use crate::common;

use std::process::Command;

use common::{example, final_params_l2, heavy_lock};

const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");

fn final_l2(np: usize, local_batch: usize) -> f64 {
    let out = Command::new(RINGRUN)
        .args(["--nproc-per-node", &np.to_string()])
        .arg(example("ddp_mlp"))
        .args(["--local-batch", &local_batch.to_string(), "--steps", "50"])
        .env("RINGCCL_TRANSPORT", "tcp")
        .output()
        .expect("run ringrun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    final_params_l2(&stdout).unwrap_or_else(|| panic!("no final_params_l2 figure: {stdout}"))
}

#[test]
fn the_mlp_example_gives_the_same_parameters_at_4x16_and_1x64() {
    let _heavy = heavy_lock();
    let four = final_l2(4, 16);
    let one = final_l2(1, 64);
    assert!(
        ((four - one) / one).abs() < 1e-6,
        "4x16 gave {four}, 1x64 gave {one}"
    );
    let two = final_l2(2, 32);
    assert!(((two - one) / one).abs() < 1e-6, "2x32 gave {two}");
}
