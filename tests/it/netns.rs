//! Multi-host behaviour across real (virtual) links: 4 network namespaces on a bridge,
//! one rank in each, at its own address. Needs root and iproute2; elsewhere each test
//! prints why it skipped.
//!
//! (a) all-reduce, broadcast and barrier work across the hosts;
//! (b) cutting one rank's link mid-operation makes the others fail within the deadline,
//!     naming the lost rank;
//! (c) killing one rank does the same;
//! (d) a stranger sending garbage to the store port (during rendezvous and training) and
//!     to rank 0's data port (while it waits for its peers) leaves the group unharmed;
//! (e) with several ranks per host (2 + 2, 1 + 1, 2 + 1 + 1, and 2 + 2 interleaved), the
//!     ranks of a host share memory, ranks of different hosts use TCP, and the whole
//!     collective matrix is exact and bit-identical on every rank, with the automatic
//!     all-reduce, the hierarchical one forced, and the flat ring forced;
//! (f) with two links per host (`eth0`, which carries the store, and `fast0`),
//!     `RINGCCL_SOCKET_IFNAME` puts every connection between ranks on the link it names
//!     (the published addresses are that link's, and its byte counters carry the
//!     all-reduce), unset they stay on the store's link, and a setting that matches
//!     nothing fails every rank at once, naming the host's interfaces.

use crate::common;

use std::collections::HashSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::matrix::{assert_identical, matrix};
use common::netns::{child_init, Lab};
use common::{child_group, digest, heavy_lock, RESULT_PREFIX};
use ringccl::core::store::StoreClient;
use ringccl::ReduceOp;

const N: usize = 4;

fn lab_or_skip(test: &str) -> Option<Lab> {
    match Lab::new(N) {
        Ok(lab) => Some(lab),
        Err(reason) => {
            println!("{test}: skipped: cannot build network namespaces ({reason})");
            None
        }
    }
}

#[test]
fn collectives_work_across_namespaces() {
    const NAME: &str = "collectives_work_across_namespaces";
    if let Some(pg) = child_group(NAME) {
        let rank = pg.rank();
        let mut x: Vec<f32> = (0..1_000_003).map(|i| ((i + rank) % 7) as f32).collect();
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        let want: Vec<f32> = (0..1_000_003)
            .map(|i| (0..N).map(|r| ((i + r) % 7) as f32).sum())
            .collect();
        assert_eq!(x, want);
        let mut b: Vec<i64> = vec![rank as i64; 100_000];
        pg.broadcast(&mut b, 2).unwrap();
        assert!(b.iter().all(|&v| v == 2));
        pg.barrier().unwrap();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        println!("{RESULT_PREFIX}{:016x}", digest(&bytes));
        return;
    }
    let Some(lab) = lab_or_skip(NAME) else { return };
    let _heavy = heavy_lock();
    let results = lab
        .spawn(NAME, &[("RINGCCL_TRANSPORT", "auto")])
        .finish(Duration::from_secs(300));
    for (rank, (lines, ok)) in results.iter().enumerate() {
        assert!(ok, "rank {rank} failed");
        assert_eq!(lines.len(), 1, "rank {rank}: {lines:?}");
        assert_eq!(lines[0], results[0].0[0], "rank {rank} differs");
    }
}

/// Child side of (b) and (c): all-reduce until something fails, then report it.
fn until_failure(name: &str) -> bool {
    let Some(pg) = child_group(name) else {
        return false;
    };
    let mut x = vec![1.0f32; 4 << 20];
    let mut announced = false;
    loop {
        let started = Instant::now();
        match pg.all_reduce(&mut x, ReduceOp::Sum) {
            Ok(()) => {
                x.fill(1.0);
                if !announced {
                    println!("{RESULT_PREFIX}running");
                    announced = true;
                }
            }
            Err(e) => {
                let after = pg
                    .barrier()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                println!(
                    "{RESULT_PREFIX}failed after {:.1}s: {e} || then: {after}",
                    started.elapsed().as_secs_f64()
                );
                return true;
            }
        }
    }
}

/// Runs (b) or (c): waits until all ranks run, breaks rank 3 with `break_it`, and
/// checks that ranks 0..3 fail within the deadline naming rank 3.
fn lose_rank_three(name: &str, break_it: impl FnOnce(&Lab, &mut common::netns::Ranks)) {
    let Some(lab) = lab_or_skip(name) else { return };
    let _heavy = heavy_lock();
    let deadline = 15.0;
    let mut ranks = lab.spawn(
        name,
        &[
            ("RINGCCL_TRANSPORT", "tcp"),
            ("RINGCCL_TEST_TIMEOUT", &deadline.to_string()),
        ],
    );
    let mut running = 0;
    while running < N {
        let (_, line) = ranks
            .next_result(Duration::from_secs(120))
            .expect("every rank starts all-reducing");
        assert_eq!(line, "running");
        running += 1;
    }
    let broken_at = Instant::now();
    break_it(&lab, &mut ranks);
    let mut failed = 0;
    while failed < N - 1 {
        let (rank, line) = ranks
            .next_result(Duration::from_secs_f64(deadline * 3.0))
            .expect("the surviving ranks report a failure");
        if rank == 3 {
            continue;
        }
        println!("rank {rank}: {line}");
        assert!(line.starts_with("failed"), "rank {rank}: {line}");
        assert!(
            line.contains("rank 3"),
            "rank {rank} does not name rank 3: {line}"
        );
        assert!(
            line.contains("broken"),
            "rank {rank}: later calls must fail at once: {line}"
        );
        failed += 1;
    }
    let took = broken_at.elapsed().as_secs_f64();
    assert!(
        took < deadline * 1.5 + 5.0,
        "failures took {took:.1}s (deadline {deadline}s)"
    );
}

#[test]
fn cutting_a_link_fails_the_others_within_the_deadline_naming_the_rank() {
    const NAME: &str = "cutting_a_link_fails_the_others_within_the_deadline_naming_the_rank";
    if until_failure(NAME) {
        return;
    }
    lose_rank_three(NAME, |lab, _| lab.cut(3).expect("cut rank 3's link"));
}

#[test]
fn killing_a_rank_fails_the_others_naming_it() {
    const NAME: &str = "killing_a_rank_fails_the_others_naming_it";
    if until_failure(NAME) {
        return;
    }
    lose_rank_three(NAME, |_, ranks| ranks.kill(3));
}

#[test]
fn strangers_with_garbage_do_not_disturb_the_group() {
    const NAME: &str = "strangers_with_garbage_do_not_disturb_the_group";
    if let Ok(store) = std::env::var("RINGCCL_TEST_STRANGER_STORE") {
        // The stranger: read rank 0's data address from the (unauthenticated) store and
        // hit that listener while rank 0 waits for its peers.
        let store = store.parse().unwrap();
        let mut client =
            StoreClient::connect(&[store], 99, Duration::from_secs(30)).expect("store");
        let raw = client
            .wait(
                "ringccl/addr/0",
                Instant::now() + Duration::from_secs(30),
                &|| "rank 0's address".into(),
            )
            .expect("rank 0 publishes its address");
        let data: SocketAddr = String::from_utf8_lossy(&raw).parse().unwrap();
        let mut hits = 0;
        for payload in [
            &b"\x16\x03\x01 garbage that is no hello at all"[..],
            &b"RCCLPEER\x09\x00\x00\x00 wrong version"[..],
            &[0xFF; 28][..],
        ] {
            if let Ok(mut s) = TcpStream::connect_timeout(&data, Duration::from_secs(5)) {
                let _ = s.write_all(payload);
                hits += 1;
            }
        }
        println!("{RESULT_PREFIX}hit {hits} at {data}");
        return;
    }
    if let Some(pg) = child_group(NAME) {
        for round in 0..20 {
            let mut x = vec![pg.rank() as f64 + round as f64; 10_000];
            pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            assert!(x.iter().all(|&v| v == 6.0 + 4.0 * round as f64));
        }
        println!("{RESULT_PREFIX}ok");
        return;
    }
    let Some(lab) = lab_or_skip(NAME) else { return };
    let _heavy = heavy_lock();
    let store = lab.addr(0);
    // Garbage, an HTTP request, an oversized store request, random bytes and a silent
    // port-scanner connection, from a fifth host on the same network. The store closes
    // a refused connection at once (with unread bytes: a reset), so the stranger's shell
    // must survive writing to it (SIGPIPE ignored).
    let attack = |port: u16| {
        format!(
            "trap '' PIPE; t=/dev/tcp/{store}/{port}; \
             printf 'GET / HTTP/1.0\\r\\n\\r\\n' > $t; \
             printf 'RCCLSTOR\\x02\\x00\\x00\\x00\\x01\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff' > $t; \
             head -c 65536 /dev/urandom > $t; \
             exec 3<>$t; sleep 0.2; exit 0"
        )
    };
    let mut ranks = lab.spawn_with(NAME, &[("RINGCCL_TRANSPORT", "tcp")], |port| {
        assert!(
            lab.as_stranger(&attack(port)),
            "the stranger could not reach the store"
        );
        // Rank 0's data listener is open now (its peers have not started yet).
        let store = format!("{store}:{port}");
        let said = lab.run_as_stranger(NAME, &[("RINGCCL_TEST_STRANGER_STORE", &store)]);
        assert!(
            said.iter().any(|l| l.starts_with("hit 3")),
            "the stranger did not reach rank 0's data port: {said:?}"
        );
    });
    // Again while the group trains.
    assert!(lab.as_stranger(&attack(ranks.store_port)));
    let _ = &mut ranks;
    let results = ranks.finish(Duration::from_secs(300));
    for (rank, (lines, ok)) in results.iter().enumerate() {
        assert!(
            *ok && lines == &vec!["ok".to_string()],
            "rank {rank}: {lines:?}"
        );
    }
}

#[test]
fn ranks_share_memory_within_a_host_and_use_tcp_across_hosts() {
    const NAME: &str = "ranks_share_memory_within_a_host_and_use_tcp_across_hosts";
    if let Some(pg) = child_group(NAME) {
        let peers: Vec<&str> = (0..pg.world_size())
            .map(|peer| pg.peer_transport(peer))
            .collect();
        println!("{RESULT_PREFIX}peers {}", peers.join(","));
        for line in matrix(&pg) {
            println!("{RESULT_PREFIX}{line}");
        }
        // The async and bucketed all-reduces take the same path.
        let (rank, n) = (pg.rank(), pg.world_size());
        let work = pg.all_reduce_async(vec![(rank + 1) as f32; 300_001], ReduceOp::Sum);
        let summed = work.and_then(|w| w.wait()).expect("async all-reduce");
        let want = (n * (n + 1) / 2) as f32;
        assert!(summed.iter().all(|&v| v == want), "async all-reduce");
        let (mut a, mut b) = (vec![rank as i32; 100_000], vec![1i32; 70_001]);
        pg.all_reduce_bucketed(&mut [&mut a[..], &mut b[..]], ReduceOp::Sum, 256 << 10)
            .expect("bucketed all-reduce");
        let ranks_sum = (n * (n - 1) / 2) as i32;
        assert!(a.iter().all(|&v| v == ranks_sum) && b.iter().all(|&v| v == n as i32));
        let bytes: Vec<u8> = summed.iter().flat_map(|v| v.to_le_bytes()).collect();
        println!("{RESULT_PREFIX}async and bucketed {:016x}", digest(&bytes));
        // Which all-reduce algorithms ran, as the flight recorder saw them.
        let mut algorithms: Vec<String> = pg
            .flight_recorder()
            .map(|f| f.snapshot("test").entries)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.kind == "all_reduce")
            .filter_map(|e| e.algorithm)
            .collect();
        algorithms.sort();
        algorithms.dedup();
        println!(
            "{RESULT_PREFIX}all-reduce algorithms {}",
            algorithms.join(",")
        );
        return;
    }
    // The automatic choice (the hierarchical all-reduce above 8 KiB where hosts hold
    // several ranks), the hierarchical one forced at every size, and ranks interleaved
    // across hosts with the flat ring forced (it goes host by host).
    // With TCP forced, the ranks still learn where they run, and the hierarchical
    // all-reduce runs over TCP alone.
    for (host_of, transport, algo) in [
        (&[0, 0, 1, 1][..], "auto", "auto"),
        (&[0, 1], "auto", "auto"),
        (&[0, 0, 1, 2], "auto", "auto"),
        (&[0, 0, 1, 1], "auto", "hierarchical"),
        (&[0, 0, 1, 2], "auto", "hierarchical"),
        (&[0, 1, 0, 1], "auto", "ring"),
        (&[0, 0, 1, 1], "tcp", "auto"),
    ] {
        let lab = match Lab::with_placement(host_of) {
            Ok(lab) => lab,
            Err(reason) => {
                println!("{NAME}: skipped: cannot build network namespaces ({reason})");
                return;
            }
        };
        let _heavy = heavy_lock();
        let started = Instant::now();
        let results = lab
            .spawn(
                NAME,
                &[("RINGCCL_TRANSPORT", transport), ("RINGCCL_ALGO", algo)],
            )
            .finish(Duration::from_secs(600));
        let mut cases = Vec::new();
        for (rank, (lines, ok)) in results.into_iter().enumerate() {
            assert!(ok, "hosts {host_of:?}, {algo}: rank {rank} failed");
            let expected: Vec<&str> = host_of
                .iter()
                .enumerate()
                .map(|(peer, &host)| match peer {
                    p if p == rank => "self",
                    _ if host == host_of[rank] && transport == "auto" => "shm",
                    _ => "tcp",
                })
                .collect();
            assert_eq!(
                lines.first().map(String::as_str),
                Some(format!("peers {}", expected.join(",")).as_str()),
                "hosts {host_of:?}: rank {rank}"
            );
            cases.push(lines[1..].to_vec());
        }
        assert_identical(&cases);
        let ran = cases[0].last().cloned().unwrap_or_default();
        let shared_host = host_of.len() > host_of.iter().collect::<HashSet<_>>().len();
        let hierarchical = shared_host && algo != "ring";
        assert_eq!(
            ran.contains("hierarchical"),
            hierarchical,
            "hosts {host_of:?}, {transport}, {algo}: {ran}"
        );
        println!(
            "hosts of ranks {host_of:?}, {transport}, {algo} ({ran}): {} cases bit-identical on every rank in {:?}",
            cases[0].len(),
            started.elapsed()
        );
    }
}

/// The second network of (f): `fast0` on every host, at `10.78.0.(h+1)`.
const FAST_NET: u8 = 78;

/// Bytes this host has sent on `link` so far (its own network namespace's counter).
fn tx_bytes(link: &str) -> u64 {
    let path = format!("/sys/class/net/{link}/statistics/tx_bytes");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_socket_interface_setting_moves_the_connections_to_the_named_link() {
    const NAME: &str = "the_socket_interface_setting_moves_the_connections_to_the_named_link";
    const HOSTS: usize = 3;
    const ELEMENTS: usize = 1 << 20;
    const BYTES: u64 = 4 * ELEMENTS as u64;
    let started = Instant::now();
    if let Some((joined, store)) = child_init(NAME, |opts| opts) {
        let pg = match joined {
            Ok(pg) => pg,
            Err(e) => {
                let took = started.elapsed().as_secs_f64();
                println!("{RESULT_PREFIX}failed after {took:.1}s: {e}");
                return;
            }
        };
        // Where every rank listens, as its peers read it from the store.
        let store = store.parse().expect("the store's address");
        let mut client =
            StoreClient::connect(&[store], 99, Duration::from_secs(30)).expect("store");
        let deadline = Instant::now() + Duration::from_secs(30);
        let addrs: Vec<String> = (0..pg.world_size())
            .map(|r| {
                let raw = client
                    .wait(&format!("ringccl/addr/{r}"), deadline, &|| {
                        format!("rank {r}'s address")
                    })
                    .expect("every rank published its address");
                let addr: SocketAddr = String::from_utf8_lossy(&raw).parse().expect("address");
                addr.ip().to_string()
            })
            .collect();
        println!("{RESULT_PREFIX}addrs {}", addrs.join(" "));
        // Which link the data takes.
        pg.barrier().expect("barrier");
        let before = (tx_bytes("eth0"), tx_bytes("fast0"));
        let mut x = vec![1.0f32; ELEMENTS];
        pg.all_reduce(&mut x, ReduceOp::Sum).expect("all-reduce");
        // Once every rank is past the all-reduce, all of this rank's bytes have left.
        pg.barrier().expect("barrier");
        let after = (tx_bytes("eth0"), tx_bytes("fast0"));
        assert!(x.iter().all(|&v| v == HOSTS as f32));
        println!(
            "{RESULT_PREFIX}tx eth0 {} fast0 {}",
            after.0 - before.0,
            after.1 - before.1
        );
        return;
    }
    let lab = match Lab::new(HOSTS) {
        Ok(lab) => lab,
        Err(reason) => {
            println!("{NAME}: skipped: cannot build network namespaces ({reason})");
            return;
        }
    };
    lab.add_network("fast0", FAST_NET)
        .expect("a second link on every host");
    let _heavy = heavy_lock();
    // (setting, the link expected to carry the connections, its network)
    for (spec, link, net) in [
        ("fast", "fast0", FAST_NET),
        ("^lo,eth", "fast0", FAST_NET),
        ("=eth0", "eth0", 77),
        // Blank is unset (and overrides the variable should the test's caller set it).
        ("", "eth0", 77),
    ] {
        let run = Instant::now();
        let env = [
            ("RINGCCL_TRANSPORT", "tcp"),
            ("RINGCCL_TEST_TIMEOUT", "60"),
            ("RINGCCL_SOCKET_IFNAME", spec),
        ];
        let results = lab.spawn(NAME, &env).finish(Duration::from_secs(120));
        let other = if link == "eth0" { "fast0" } else { "eth0" };
        let mut counted = Vec::new();
        for (rank, (lines, ok)) in results.iter().enumerate() {
            assert!(*ok && lines.len() == 2, "{spec:?}: rank {rank}: {lines:?}");
            let published: Vec<&str> = lines[0]
                .strip_prefix("addrs ")
                .unwrap_or_default()
                .split(' ')
                .collect();
            let expected: Vec<String> = (0..HOSTS)
                .map(|h| format!("10.{net}.0.{}", h + 1))
                .collect();
            assert_eq!(published, expected, "{spec:?}: rank {rank} read {lines:?}");
            let sent: Vec<u64> = lines[1].split(' ').filter_map(|w| w.parse().ok()).collect();
            let (on_link, on_other) = match link {
                "eth0" => (sent[0], sent[1]),
                _ => (sent[1], sent[0]),
            };
            assert!(
                on_link >= BYTES && on_other < BYTES / 8,
                "{spec:?}: rank {rank} sent {on_link} bytes on {link} and {on_other} on {other} \
                 for a {BYTES}-byte all-reduce"
            );
            counted.push(format!("{on_link}/{on_other}"));
        }
        println!(
            "RINGCCL_SOCKET_IFNAME={spec:?}: every connection on {link} (10.{net}.0.0/24); \
             bytes sent on {link}/{other} by each rank: {}; in {:?}",
            counted.join(", "),
            run.elapsed()
        );
    }
    // A setting that matches nothing (an exact name that is only a prefix here).
    let env = [
        ("RINGCCL_TRANSPORT", "tcp"),
        ("RINGCCL_TEST_TIMEOUT", "60"),
        ("RINGCCL_SOCKET_IFNAME", "=fast"),
    ];
    let results = lab.spawn(NAME, &env).finish(Duration::from_secs(120));
    for (rank, (lines, ok)) in results.iter().enumerate() {
        assert!(*ok && lines.len() == 1, "rank {rank}: {lines:?}");
        let line = &lines[0];
        println!("rank {rank}: {line}");
        let took: f64 = line
            .strip_prefix("failed after ")
            .and_then(|rest| rest.split('s').next())
            .and_then(|secs| secs.parse().ok())
            .unwrap_or_else(|| panic!("rank {rank} should fail: {line}"));
        assert!(
            took < 15.0,
            "rank {rank} failed only after {took}s (deadline 60 s)"
        );
        for needed in [
            "RINGCCL_SOCKET_IFNAME=\"=fast\" matches no usable network interface",
            "lo (127.0.0.1",
            "eth0 (10.77.0.",
            "fast0 (10.78.0.",
        ] {
            assert!(
                line.contains(needed),
                "rank {rank} lacks {needed:?}: {line}"
            );
        }
    }
}
