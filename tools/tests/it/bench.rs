//! The `ringccl-bench` binary: a correct sweep reports no wrong elements, an injected
//! fault is counted, JSON rows match, it runs under `ringrun`, an unavailable backend is
//! a clear error, and `RINGCCL_DEBUG` sets what the library logs to stderr.

use crate::common;

use std::process::{Command, Output};

use common::{heavy_lock, text};

const BENCH: &str = env!("CARGO_BIN_EXE_ringccl-bench");
const RINGRUN: &str = env!("CARGO_BIN_EXE_ringrun");

fn bench(args: &[&str], fault: bool) -> Output {
    let mut cmd = Command::new(BENCH);
    cmd.args(args);
    if fault {
        cmd.env("RINGCCL_BENCH_INJECT_FAULT", "1");
    }
    cmd.output().expect("run ringccl-bench")
}

/// The table's rows: (size, type, redop, #wrong).
fn rows(stdout: &str) -> Vec<(usize, String, String, i64)> {
    let parse = |line: &str| -> Option<(usize, String, String, i64)> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 11 {
            return None;
        }
        Some((
            f[0].parse().ok()?,
            f[2].to_string(),
            f[3].to_string(),
            f[8].parse().ok()?,
        ))
    };
    stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(parse)
        .collect()
}

#[test]
fn every_type_and_op_checks_out_with_zero_wrong() {
    let _guard = heavy_lock();
    let json = std::env::temp_dir().join(format!("ringccl-bench-{}.json", std::process::id()));
    let out = bench(
        &[
            "--np",
            "2",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "64",
            "-n",
            "3",
            "-w",
            "1",
            "-d",
            "all",
            "-o",
            "all",
            "--json",
            json.to_str().unwrap(),
        ],
        false,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let table = rows(&stdout);
    // 8 types x 5 ops - 4 integer means; sizes 8, 512, 32768 and the end point 65536.
    assert_eq!(table.len(), (8 * 5 - 4) * 4, "{stdout}");
    assert!(table.iter().all(|r| r.3 == 0), "{stdout}");
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    let lines = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(lines.lines().count(), table.len());
    assert!(lines
        .lines()
        .all(|l| l.starts_with("{\"coll\":\"all_reduce\"") && l.contains("\"wrong\":0")));
    // Every line is one JSON object with exactly the documented fields.
    let mut fields = [
        "coll",
        "backend",
        "nranks",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
        "loop_us",
        "iters",
    ];
    fields.sort_unstable();
    for line in lines.lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON row");
        let mut keys: Vec<&str> = row
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, fields, "{line}");
        assert!(row["time_us"].as_f64().is_some_and(|t| t > 0.0), "{line}");
    }
}

#[test]
fn other_collectives_check_out_too() {
    let _guard = heavy_lock();
    for coll in [
        "broadcast",
        "reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "all_reduce_bucketed",
        "barrier",
    ] {
        let out = bench(
            &[
                "--np",
                "3",
                "--coll",
                coll,
                "-b",
                "64",
                "-e",
                "256K",
                "-f",
                "64",
                "-n",
                "3",
                "-w",
                "1",
                "--tensors",
                "7",
            ],
            false,
        );
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{coll}: {stdout}{}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains("# Out of bounds values : 0 OK"),
            "{coll}: {stdout}"
        );
        assert!(!rows(&stdout).is_empty(), "{coll}: {stdout}");
    }
}

/// `--stream-ordered` times stream-ordered device calls (measured by gpu-check.sh); on
/// host buffers it has nothing to time and says so instead of timing something else.
#[test]
fn stream_ordered_timing_on_host_buffers_is_refused() {
    let out = bench(
        &[
            "--np",
            "1",
            "--memory",
            "host",
            "--stream-ordered",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "2",
        ],
        false,
    );
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("--stream-ordered needs device buffers"),
        "{all}"
    );
}

#[test]
fn an_injected_fault_is_counted_as_wrong() {
    let _guard = heavy_lock();
    for coll in ["all_reduce", "broadcast", "all_gather"] {
        let out = bench(
            &[
                "--np", "2", "--coll", coll, "-b", "1K", "-e", "1K", "-n", "2",
            ],
            true,
        );
        let stdout = text(&out.stdout);
        assert!(
            !out.status.success(),
            "{coll}: a corrupted result must fail the run"
        );
        let table = rows(&stdout);
        assert!(table.iter().any(|r| r.3 > 0), "{coll}: {stdout}");
        assert!(stdout.contains("FAILED"), "{coll}: {stdout}");
    }
}

#[test]
fn runs_as_ranks_under_ringrun() {
    let _guard = heavy_lock();
    let out = Command::new(RINGRUN)
        .args([
            "--nproc-per-node",
            "2",
            "--",
            BENCH,
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "8",
            "-n",
            "3",
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("[rank 0] # Out of bounds values : 0 OK"),
        "{stdout}"
    );
    assert!(stdout.contains("backend gloo, 2 ranks"), "{stdout}");
}

#[test]
fn ringccl_debug_sets_what_the_library_logs() {
    let _guard = heavy_lock();
    let stderr_with = |level: Option<&str>| {
        let mut cmd = Command::new(BENCH);
        cmd.args(["--np", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]);
        cmd.env_remove("RINGCCL_DEBUG");
        if let Some(level) = level {
            cmd.env("RINGCCL_DEBUG", level);
        }
        let out = cmd.output().expect("run ringccl-bench");
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{level:?}: {stderr}");
        stderr
    };
    let debug = stderr_with(Some("Debug"));
    assert!(debug.contains("DEBUG"), "{debug}");
    assert!(debug.contains("connected to a lower rank"), "{debug}");
    assert!(debug.contains("every rank joined"), "{debug}");
    assert!(
        debug.contains("gloo call done") && debug.contains("op #1 all_reduce(sum"),
        "no per-call line: {debug}"
    );
    // The start-up summary, once per rank: transport per peer, address, thresholds, auth.
    let info = stderr_with(Some("info"));
    let ready: Vec<&str> = info
        .lines()
        .filter(|l| l.contains("process group ready"))
        .collect();
    assert_eq!(ready.len(), 2, "{info}");
    for line in ready {
        for field in [
            "peers=",
            "address=127.0.0.1",
            "recursive_doubling_up_to=",
            "auth=false",
        ] {
            assert!(line.contains(field), "{field} missing: {line}");
        }
        assert!(line.contains(",self") || line.contains("self,"), "{line}");
    }
    assert!(!info.contains("DEBUG"), "{info}");

    let default = stderr_with(None);
    assert!(!default.contains("every rank joined"), "{default}");
    assert!(!default.contains("DEBUG"), "{default}");

    let unknown = stderr_with(Some("loud"));
    assert!(
        unknown.contains("RINGCCL_DEBUG=\"loud\" is not one of"),
        "{unknown}"
    );
    assert!(!unknown.contains("every rank joined"), "{unknown}");
}

/// Progress never lands in the table: with stdout and stderr going to pipes there is no
/// progress at all; on a terminal each progress line is erased before the next row.
#[test]
fn progress_appears_only_on_a_terminal_and_never_inside_the_table() {
    let _guard = heavy_lock();
    let args = [
        "--np", "2", "-b", "8", "-e", "1K", "-f", "2", "-n", "3", "-w", "1",
    ];
    let out = bench(&args, false);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(rows(&stdout).len(), 8, "{stdout}");
    assert!(!stdout.contains("RINGCCL_BENCH_PROGRESS") && !stdout.contains("(1/8)"));
    assert!(
        !stderr.contains("(1/8)"),
        "progress went to a non-terminal: {stderr}"
    );

    // On a pseudo-terminal (util-linux `script`), stdout and stderr share it.
    let script = Command::new("script").arg("--version").output();
    if !script.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped the terminal half: `script` (util-linux) is not installed");
        return;
    }
    let command = format!("{BENCH} {}", args.join(" "));
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("run script");
    assert!(out.status.success(), "{}", text(&out.stdout));
    let screen = text(&out.stdout);
    assert!(
        screen.contains("(8/8)"),
        "no progress on the terminal: {screen:?}"
    );
    // Every table row starts right after an erased line, never after progress text.
    let table_rows: Vec<&str> = screen
        .split(['\n'])
        .filter(|l| l.contains("float") && l.contains("sum"))
        .collect();
    assert_eq!(table_rows.len(), 8, "{screen:?}");
    for row in table_rows {
        let last_piece = row.rsplit("\x1b[2K").next().unwrap_or(row);
        assert!(
            !last_piece.contains("ringccl-bench:"),
            "progress shares a line with a row: {row:?}"
        );
        assert_eq!(
            rows(last_piece.trim_start_matches('\r')).len(),
            1,
            "row not intact: {row:?}"
        );
    }
}

/// A free port on loopback, for a launcher that takes the store's port by variable (it
/// is released before the ranks start, a race every such launcher shares).
fn free_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener
        .local_addr()
        .expect("local address")
        .port()
        .to_string()
}

/// Whether `stdout` holds exactly one result table, of a group of `ranks`.
fn one_table_of(stdout: &str, ranks: usize) -> bool {
    let headers = stdout.matches("backend gloo, ").count();
    headers == 1 && stdout.contains(&format!("backend gloo, {ranks} ranks"))
}

#[test]
fn runs_as_ranks_under_mpirun() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        println!("runs_as_ranks_under_mpirun: skipped: no mpirun on this machine");
        return;
    }
    let _guard = heavy_lock();
    // mpirun starts every rank at once, so rank 0 cannot announce the port it bound: the
    // port is one the kernel just gave out, and another test may take it meanwhile. The
    // bench then says so ("already in use"), and the run is tried again on a new port.
    let run = || {
        Command::new("mpirun")
            .args(["-np", "2", "--oversubscribe", "-x", "MASTER_ADDR=127.0.0.1"])
            .args(["-x", &format!("MASTER_PORT={}", free_port())])
            .args([BENCH, "-b", "8", "-e", "4K", "-f", "8", "-n", "3"])
            // mpirun refuses root unless told; harmless otherwise.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env_remove("RANK")
            .output()
            .expect("run mpirun")
    };
    let mut out = run();
    for _ in 0..3 {
        if out.status.success() || !text(&out.stderr).contains("is already in use") {
            break;
        }
        out = run();
    }
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        one_table_of(&stdout, 2),
        "each process must be one rank of one group: {stdout}"
    );
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
}

#[test]
fn runs_as_ranks_under_slurm_and_launches_its_own_in_a_batch_script() {
    let _guard = heavy_lock();
    let port = free_port();
    // srun's variables for a two-task step on this host.
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(BENCH)
                .args(["-b", "8", "-e", "4K", "-f", "8", "-n", "3"])
                .env_remove("RANK")
                .env_remove("WORLD_SIZE")
                .env("SLURM_PROCID", rank.to_string())
                .env("SLURM_LOCALID", rank.to_string())
                .env("SLURM_NTASKS", "2")
                .env("SLURM_STEP_ID", "0")
                .env("SLURM_JOB_NODELIST", "localhost")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let outs: Vec<Output> = ranks
        .into_iter()
        .map(|r| r.wait_with_output().expect("rank output"))
        .collect();
    for (rank, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "rank {rank}: {}", text(&out.stderr));
    }
    let stdout = text(&outs[0].stdout);
    assert!(
        one_table_of(&stdout, 2),
        "srun's tasks must form one group: {stdout}"
    );
    // A batch script has SLURM_PROCID but no step: the bench launches its own ranks.
    let out = Command::new(BENCH)
        .args(["-b", "8", "-e", "8", "-n", "1"])
        .env_remove("RANK")
        .env("SLURM_PROCID", "0")
        .env("SLURM_NTASKS", "2")
        .output()
        .expect("run the bench");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(one_table_of(&stdout, 4), "{stdout}");
}
