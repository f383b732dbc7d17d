//! A small lab of network namespaces: N "hosts", each with its own address on a
//! bridge and its own host name (each rank runs in a UTS namespace named after its
//! host), so that ranks really talk across (virtual) links that a test can cut or
//! rate-limit, and only ranks of one host share memory. Needs root, iproute2 and
//! util-linux's `unshare`; [`Lab::new`] says why when it cannot be built.
//!
//! Everything lives in the lab's own namespaces (the bridge too): nothing touches the
//! host's network. Namespaces are deleted when the lab is dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringccl::{init_process_group, InitOptions, ProcessGroup};

use super::{after, CHILD_VAR, PORT_PREFIX, RESULT_PREFIX};

static LABS: AtomicUsize = AtomicUsize::new(0);

/// N namespaces `<prefix>0 .. <prefix>N-1` on a bridge in `<prefix>hub`; host `h` has
/// address `10.77.0.(h+1)/24` on its `eth0`, and runs the ranks `host_of` gives it.
pub struct Lab {
    prefix: String,
    n: usize,
    /// The host of each rank.
    host_of: Vec<usize>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Lab {
    /// Builds a lab of `n` hosts with one rank each, or says why it cannot (not root, no
    /// iproute2, no netns support).
    pub fn new(n: usize) -> Result<Lab, String> {
        Lab::with_hosts(&vec![1; n])
    }

    /// Builds a lab of `ranks_per_host.len()` hosts, host `h` running the next
    /// `ranks_per_host[h]` ranks (ranks are numbered host by host).
    pub fn with_hosts(ranks_per_host: &[usize]) -> Result<Lab, String> {
        let host_of: Vec<usize> = ranks_per_host
            .iter()
            .enumerate()
            .flat_map(|(host, &ranks)| std::iter::repeat_n(host, ranks))
            .collect();
        Lab::with_placement(&host_of)
    }

    /// Builds a lab whose rank `r` runs on host `host_of[r]` (hosts `0..=max`), for
    /// launchers that interleave ranks across hosts.
    pub fn with_placement(host_of: &[usize]) -> Result<Lab, String> {
        let n = host_of.iter().max().map_or(0, |&h| h + 1);
        let host_of = host_of.to_vec();
        if Command::new("unshare").arg("--version").output().is_err() {
            return Err("util-linux's unshare is missing".into());
        }
        // SAFETY-free check of root: the effective uid as `id -u` prints it.
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        if uid != "0" {
            return Err(format!("network namespaces need root (uid is {uid:?})"));
        }
        let prefix = format!(
            "rccl{}x{}-",
            std::process::id(),
            LABS.fetch_add(1, Ordering::SeqCst)
        );
        let lab = Lab { prefix, n, host_of };
        let hub = lab.hub();
        ip(&["netns", "add", &hub])?;
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for r in 0..=n {
            let ns = lab.ns(r);
            let hub_side = format!("h{r}");
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &hub_side,
                "netns", &hub,
            ])?;
            ip(&["-n", &hub, "link", "set", &hub_side, "master", "br0"])?;
            ip(&["-n", &hub, "link", "set", &hub_side, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", lab.addr(r)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(lab)
    }

    fn hub(&self) -> String {
        format!("{}hub", self.prefix)
    }

    /// Host `r`'s namespace (host `n` is the stranger's).
    pub fn ns(&self, r: usize) -> String {
        format!("{}{r}", self.prefix)
    }

    /// Runs this test binary's `test_name` on the stranger's host with `env`, and
    /// returns its `RESULT` lines once it exits.
    pub fn run_as_stranger(&self, test_name: &str, env: &[(&str, &str)]) -> Vec<String> {
        let exe = std::env::current_exe().expect("current test binary");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns(self.n)])
            .arg(exe)
            .args([
                "--exact",
                &super::test_path(test_name),
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(env.iter().copied())
            .stderr(Stdio::inherit())
            .output()
            .expect("run the stranger");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| after(l, RESULT_PREFIX).map(str::to_string))
            .collect()
    }

    /// Runs a bash script on the stranger's host (address `10.77.0.(n+1)`), which runs
    /// no rank; returns whether it succeeded.
    pub fn as_stranger(&self, script: &str) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.ns(self.n), "bash", "-c", script])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// A command that runs `program` on host `h`: in its network namespace, and in a
    /// UTS namespace of its own named after the host (add arguments and variables, then
    /// spawn). `ip netns exec`, `unshare` and `sh` each exec the next: the child's pid is
    /// `program`'s.
    pub fn command_on(&self, h: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.ns(h)])
            .args([
                "unshare",
                "--uts",
                "sh",
                "-c",
                "hostname \"$0\" && exec \"$@\"",
            ])
            .arg(self.host_name(h))
            .arg(program);
        command
    }

    /// How many ranks the lab runs.
    pub fn ranks(&self) -> usize {
        self.host_of.len()
    }

    /// The host name of host `h`, which its ranks see.
    pub fn host_name(&self, h: usize) -> String {
        format!("{}host{h}", self.prefix)
    }

    /// Host `r`'s address.
    pub fn addr(&self, r: usize) -> String {
        format!("10.77.0.{}", r + 1)
    }

    /// Gives every host (the stranger's too) a second link, `ifname`, on a network of
    /// its own (another bridge in the hub): host `h` at [`Lab::addr_on`]`(subnet, h)`,
    /// `10.<subnet>.0.(h+1)/24`. The store stays on `eth0`'s network (`10.77.0.0/24`).
    pub fn add_network(&self, ifname: &str, subnet: u8) -> Result<(), String> {
        let hub = self.hub();
        let bridge = format!("br{subnet}");
        ip(&["-n", &hub, "link", "add", &bridge, "type", "bridge"])?;
        ip(&["-n", &hub, "link", "set", &bridge, "up"])?;
        for r in 0..=self.n {
            let ns = self.ns(r);
            let hub_side = format!("n{subnet}x{r}");
            ip(&[
                "-n", &ns, "link", "add", ifname, "type", "veth", "peer", "name", &hub_side,
                "netns", &hub,
            ])?;
            ip(&["-n", &hub, "link", "set", &hub_side, "master", &bridge])?;
            ip(&["-n", &hub, "link", "set", &hub_side, "up"])?;
            let addr = format!("{}/24", self.addr_on(subnet, r));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", ifname])?;
            ip(&["-n", &ns, "link", "set", ifname, "up"])?;
        }
        Ok(())
    }

    /// Host `r`'s address on the network [`Lab::add_network`] made with `subnet`.
    pub fn addr_on(&self, subnet: u8, r: usize) -> String {
        format!("10.{subnet}.0.{}", r + 1)
    }

    /// Cuts host `r`'s link at the bridge: its packets go nowhere, no reset is sent.
    pub fn cut(&self, r: usize) -> Result<(), String> {
        ip(&["-n", &self.hub(), "link", "set", &format!("h{r}"), "down"])
    }

    /// Limits every rank host's outgoing traffic to `rate` (tc tbf), like a real NIC.
    pub fn rate_limit(&self, rate: &str) -> Result<(), String> {
        for r in 0..self.n {
            let out = Command::new("tc")
                .args([
                    "-n",
                    &self.ns(r),
                    "qdisc",
                    "add",
                    "dev",
                    "eth0",
                    "root",
                    "tbf",
                ])
                .args(["rate", rate, "burst", "512kb", "latency", "100ms"])
                .output()
                .map_err(|e| format!("running tc: {e}"))?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).into_owned());
            }
        }
        Ok(())
    }

    /// Starts `test_name` (this test binary, re-executed) as ranks `0..n`, each in its
    /// own namespace, rank 0's store on its own address (port chosen by the OS).
    pub fn spawn(&self, test_name: &str, env: &[(&str, &str)]) -> Ranks {
        self.spawn_with(test_name, env, |_| {})
    }

    /// [`Lab::spawn`], calling `between(store_port)` once rank 0's store is open and
    /// before the other ranks start.
    pub fn spawn_with(
        &self,
        test_name: &str,
        env: &[(&str, &str)],
        between: impl FnOnce(u16),
    ) -> Ranks {
        let (tx, rx) = mpsc::channel();
        let mut ranks = Ranks {
            children: Vec::new(),
            rx,
            tx,
            store_port: 0,
        };
        ranks.start(self, test_name, 0, None, env);
        let deadline = Instant::now() + Duration::from_secs(60);
        let port = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match ranks.rx.recv_timeout(left) {
                Ok(Event::Line(0, line)) => {
                    if let Some(p) = after(&line, PORT_PREFIX) {
                        break p.trim().parse::<u16>().expect("port line");
                    }
                }
                Ok(_) => {}
                Err(_) => panic!("{test_name}: rank 0 did not open its store"),
            }
        };
        between(port);
        ranks.store_port = port;
        for r in 1..self.ranks() {
            ranks.start(self, test_name, r, Some(port), env);
        }
        ranks
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for r in 0..=self.n {
            let _ = ip(&["netns", "del", &self.ns(r)]);
        }
        let _ = ip(&["netns", "del", &self.hub()]);
    }
}

/// In a rank that [`Lab::spawn`] started for `test_name`: joins the group with the
/// options the environment gives (as [`super::child_group`] does), adjusted by `tweak`,
/// and returns the outcome with the store's address (for reading what the ranks
/// published); in the parent, `None`.
pub fn child_init(
    test_name: &str,
    tweak: impl FnOnce(InitOptions) -> InitOptions,
) -> Option<(Result<ProcessGroup, ringccl::Error>, String)> {
    if std::env::var(CHILD_VAR).ok()? != test_name {
        return None;
    }
    let opts = super::child_options(PORT_PREFIX);
    let store = opts.master.clone();
    let timeout = std::env::var("RINGCCL_TEST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(super::GROUP_TIMEOUT, Duration::from_secs_f64);
    Some((
        init_process_group("gloo", tweak(opts.timeout(timeout))),
        store,
    ))
}

/// What a rank process said.
pub enum Event {
    /// A line of its standard output.
    Line(usize, String),
    /// Its standard output closed (it exited).
    Closed(usize),
}

/// Rank processes running in a lab.
pub struct Ranks {
    children: Vec<Child>,
    rx: mpsc::Receiver<Event>,
    tx: mpsc::Sender<Event>,
    /// Rank 0's store port.
    pub store_port: u16,
}

impl Ranks {
    fn start(
        &mut self,
        lab: &Lab,
        test_name: &str,
        rank: usize,
        port: Option<u16>,
        env: &[(&str, &str)],
    ) {
        let exe = std::env::current_exe().expect("current test binary");
        let host = lab.host_of[rank];
        let mut child = lab
            .command_on(host, exe)
            .args([
                "--exact",
                &super::test_path(test_name),
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(env.iter().copied())
            .env(CHILD_VAR, test_name)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", lab.ranks().to_string())
            .env("MASTER_ADDR", lab.addr(0))
            .env("MASTER_PORT", port.unwrap_or(0).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a rank in its namespace");
        let stdout = child.stdout.take().expect("piped stdout");
        let tx = self.tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(Event::Line(rank, line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Event::Closed(rank));
        });
        self.children.push(child);
    }

    /// The next `RESULT` line of any rank, or `None` after `timeout`.
    pub fn next_result(&mut self, timeout: Duration) -> Option<(usize, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Event::Line(rank, line)) => {
                    if let Some(result) = after(&line, RESULT_PREFIX) {
                        return Some((rank, result.to_string()));
                    }
                }
                Ok(Event::Closed(_)) => {}
                Err(_) => return None,
            }
        }
    }

    /// Kills rank `rank`'s process (SIGKILL).
    pub fn kill(&mut self, rank: usize) {
        let _ = self.children[rank].kill();
    }

    /// Collects every `RESULT` line until all ranks exited (killing them all after
    /// `timeout`); returns them by rank with each rank's success.
    pub fn finish(mut self, timeout: Duration) -> Vec<(Vec<String>, bool)> {
        let n = self.children.len();
        let mut results = vec![Vec::new(); n];
        let mut open = n;
        let deadline = Instant::now() + timeout;
        while open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Event::Line(rank, line)) => {
                    if let Some(result) = after(&line, RESULT_PREFIX) {
                        results[rank].push(result.to_string());
                    }
                }
                Ok(Event::Closed(_)) => open -= 1,
                Err(_) => break,
            }
        }
        self.children
            .iter_mut()
            .zip(results)
            .map(|(child, lines)| {
                let _ = child.kill();
                let ok = child.wait().map(|s| s.success()).unwrap_or(false);
                (lines, ok)
            })
            .collect()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
