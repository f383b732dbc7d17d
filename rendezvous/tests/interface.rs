//! `MeshConfig::socket_ifname` on this host: the ranks listen on (and connect to) the
//! interface it names rather than the one the store is reached through, a setting that
//! matches nothing fails every rank at once with the host's interfaces named, and the
//! store connection's family is kept. (Across hosts with two links each: the facade's
//! `tests/netns.rs`.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use ringccl_rendezvous::{connect_mesh, MeshConfig, MeshConnections, SetupError, StoreListener};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A rank's connections or error, and how long start-up took.
type Outcome = (Result<MeshConnections, SetupError>, Duration);

/// Connects `n` ranks (threads) through a store on `store_ip`, rank `r` with
/// `socket_ifname(r)`; returns each rank's connections or error, and how long it took.
fn mesh(
    store_ip: IpAddr,
    n: usize,
    socket_ifname: impl Fn(usize) -> Option<String>,
) -> Option<Vec<Outcome>> {
    let listener = match StoreListener::bind(&SocketAddr::new(store_ip, 0).to_string()) {
        Ok(listener) => listener,
        Err(e) => {
            println!("skipped: cannot listen on {store_ip} ({e})");
            return None;
        }
    };
    let master = listener.local_addr().expect("store address").to_string();
    let mut listener = Some(listener);
    let deadline = Instant::now() + TIMEOUT;
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let mut config = MeshConfig::new(rank, n, &master, TIMEOUT);
            config.socket_ifname = socket_ifname(rank);
            if rank == 0 {
                config.store_listener = listener.take();
            }
            thread::spawn(move || {
                let started = Instant::now();
                let result = connect_mesh(config)
                    .and_then(|mesh| mesh.finish(deadline))
                    .map(|(connections, _store)| connections);
                (result, started.elapsed())
            })
        })
        .collect();
    Some(
        ranks
            .into_iter()
            .map(|r| r.join().expect("rank thread"))
            .collect(),
    )
}

/// The local addresses of rank `rank`'s data and control connections.
fn local_ips(connections: &MeshConnections) -> Vec<IpAddr> {
    connections
        .data
        .iter()
        .chain(&connections.control)
        .flatten()
        .map(|c| c.local_addr().expect("local address").ip())
        .collect()
}

/// An address of this host other than loopback, the one it would use to reach
/// `towards` (no packet is sent), if it has a route there.
fn routed_ip(towards: &str) -> Option<IpAddr> {
    let any = if towards.starts_with('[') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(towards).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn the_named_interface_carries_the_connections_not_the_stores_route() {
    // The store on this host's outward address, the ranks told to use loopback: every
    // connection between them is then local to 127.0.0.1, none to the store's address.
    let Some(outward) = routed_ip("198.51.100.1:9") else {
        println!("skipped: this host has no IPv4 address besides loopback");
        return;
    };
    let Some(results) = mesh(outward, 3, |_| Some("=lo".into())) else {
        return;
    };
    for (rank, (result, _)) in results.into_iter().enumerate() {
        let connections = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let ips = local_ips(&connections);
        assert_eq!(ips.len(), 4, "rank {rank}: {ips:?}");
        assert!(
            ips.iter().all(|&ip| ip == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "rank {rank} (store at {outward}): {ips:?}"
        );
    }
    // Unset, they listen where the store is reached.
    let Some(results) = mesh(outward, 2, |_| None) else {
        return;
    };
    for (rank, (result, _)) in results.into_iter().enumerate() {
        let connections = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let ips = local_ips(&connections);
        assert!(ips.iter().all(|&ip| ip == outward), "rank {rank}: {ips:?}");
    }
}

#[test]
fn the_store_connections_family_is_kept() {
    // lo has 127.0.0.1 and ::1: a store reached over IPv6 makes the ranks listen on ::1.
    let Some(results) = mesh(IpAddr::V6(Ipv6Addr::LOCALHOST), 2, |_| Some("lo".into())) else {
        return;
    };
    for (rank, (result, _)) in results.into_iter().enumerate() {
        let connections = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let ips = local_ips(&connections);
        assert!(
            !ips.is_empty() && ips.iter().all(|&ip| ip == IpAddr::V6(Ipv6Addr::LOCALHOST)),
            "rank {rank}: {ips:?}"
        );
    }
}

#[test]
fn a_setting_matching_nothing_fails_every_rank_at_once_naming_the_interfaces() {
    let Some(results) = mesh(IpAddr::V4(Ipv4Addr::LOCALHOST), 3, |_| {
        Some("=no-such-nic0".to_string())
    }) else {
        return;
    };
    for (rank, (result, took)) in results.into_iter().enumerate() {
        let err = result.expect_err("start-up must fail");
        let message = err.to_string();
        println!("rank {rank} after {took:?}: {message}");
        assert!(
            took < Duration::from_secs(15),
            "rank {rank} took {took:?} (deadline {TIMEOUT:?}): {message}"
        );
        assert!(
            matches!(&err, SetupError::NoMatchingInterface { rank: r, spec, found }
                if *r == rank && spec == "=no-such-nic0" && found.contains("lo (127.0.0.1")),
            "rank {rank}: {message}"
        );
        assert!(
            message.starts_with(&format!(
                "rank {rank}: RINGCCL_SOCKET_IFNAME=\"=no-such-nic0\" matches no usable network interface; \
                 this host has "
            )),
            "{message}"
        );
    }
}

#[test]
fn a_malformed_setting_is_refused_before_anything_connects() {
    // No store runs at this address: validation must fail first.
    let mut config = MeshConfig::new(1, 2, "127.0.0.1:9", TIMEOUT);
    config.socket_ifname = Some("eth0,^lo".into());
    let started = Instant::now();
    let err = connect_mesh(config).expect_err("malformed");
    assert!(started.elapsed() < Duration::from_secs(5));
    let message = err.to_string();
    assert!(matches!(err, SetupError::InvalidArgument(_)), "{message}");
    assert!(
        message.contains("RINGCCL_SOCKET_IFNAME")
            && message.contains("may only open the whole list"),
        "{message}"
    );
}
