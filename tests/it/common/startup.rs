//! The rank program of the start-up tests: this test binary re-executed as a plain
//! program that calls `init_process_group` and nothing else (no `tracing` subscriber, no
//! logging set-up), started directly ([`spawn_rank`]) or under `ringrun`; and reading
//! what it prints as it comes.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringccl::{init_process_group, InitOptions, StoreListener};

/// Set in a child: it is a rank, not the test.
pub const CHILD: &str = "RINGCCL_STARTUP_TEST_CHILD";

/// What rank 0 prints once it hosts the store on a free port.
pub const PORT_PREFIX: &str = "STARTUP_PORT=";

/// In a child: joins the group from the environment as a user's program would (rank 0
/// without MASTER_PORT hosts the store on a free port and prints it), prints `JOINED`
/// or the error, and exits. Returns false in the test process itself.
pub fn run_as_rank() -> bool {
    if std::env::var_os(CHILD).is_none() {
        return false;
    }
    let env = |k: &str| std::env::var(k).ok();
    let result = if env("RANK").as_deref() == Some("0") && env("MASTER_PORT").is_none() {
        let listener = StoreListener::bind("127.0.0.1:0").expect("bind store listener");
        let port = listener
            .local_addr()
            .expect("store address")
            .port()
            .to_string();
        println!("{PORT_PREFIX}{port}");
        InitOptions::from_vars(|k| match k {
            "MASTER_PORT" => Some(port.clone()),
            _ => env(k),
        })
        .map(|opts| opts.store_listener(listener))
    } else {
        InitOptions::from_env()
    }
    .and_then(|opts| init_process_group("gloo", opts));
    match result {
        Ok(pg) => {
            println!("JOINED rank {}", pg.rank());
            pg.barrier().expect("barrier");
        }
        Err(e) => println!("ERROR {e}"),
    }
    true
}

/// A rank of this test binary (`test` names the test it runs in), its output piped.
pub fn spawn_rank(test: &str, rank: usize, world_size: usize, env: &[(&str, &str)]) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            &super::test_path(test),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world_size.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("RINGCCL_TRANSPORT", "tcp")
        .env_remove("MASTER_PORT")
        .env_remove("RINGCCL_DEBUG")
        .env_remove("RINGCCL_STARTUP_REPORT")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a rank")
}

/// Lines of a child's stdout and stderr, as they come, tagged with when they came.
pub struct Lines {
    rx: mpsc::Receiver<(Instant, String)>,
    seen: Vec<String>,
}

impl Lines {
    pub fn of(child: &mut Child) -> Lines {
        let (tx, rx) = mpsc::channel();
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped stdout"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped stderr"));
        for stream in [out, err] {
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send((Instant::now(), line)).is_err() {
                        return;
                    }
                }
            });
        }
        Lines {
            rx,
            seen: Vec::new(),
        }
    }

    /// The first line containing `needle` and when it came, waiting until `until`.
    pub fn wait_for(&mut self, needle: &str, until: Instant) -> Option<(Instant, String)> {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return Some((Instant::now(), line.clone()));
        }
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            let (at, line) = self.rx.recv_timeout(left).ok()?;
            self.seen.push(line.clone());
            if line.contains(needle) {
                return Some((at, line));
            }
        }
    }

    pub fn all(&mut self) -> String {
        while let Ok((_, line)) = self.rx.try_recv() {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}

/// Kills a child on every path out of a test.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The port rank 0 announced.
pub fn announced_port(lines: &mut Lines) -> String {
    let (_, line) = lines
        .wait_for(PORT_PREFIX, Instant::now() + Duration::from_secs(60))
        .unwrap_or_else(|| panic!("rank 0 announced no port:\n{}", lines.all()));
    line.split(PORT_PREFIX)
        .nth(1)
        .expect("port")
        .trim()
        .to_string()
}
