//! Start-up in the ways real jobs start: ranks before the master, addresses other than
//! 127.0.0.1, IPv6.

use crate::common;

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use common::{heavy_lock, run_threads_on};
use ringccl::core::store::StoreClient;
use ringccl::{init_process_group, InitOptions, ReduceOp, StoreListener};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn ranks_that_start_before_the_master_wait_for_it() {
    let _guard = heavy_lock();
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let early: Vec<_> = (1..4)
        .map(|rank| {
            let addr = addr.clone();
            thread::spawn(move || {
                let pg =
                    init_process_group("gloo", InitOptions::new(rank, 4, &addr).timeout(TIMEOUT))?;
                let mut x = [rank as i32];
                pg.all_reduce(&mut x, ReduceOp::Sum)?;
                Ok::<_, ringccl::Error>(x[0])
            })
        })
        .collect();
    // The store is not served until rank 0 starts, well after the others.
    thread::sleep(Duration::from_millis(500));
    let pg = init_process_group(
        "gloo",
        InitOptions::new(0, 4, &addr)
            .timeout(TIMEOUT)
            .store_listener(listener),
    )
    .unwrap();
    let mut x = [0i32];
    pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!(x[0], 6);
    for handle in early {
        assert_eq!(handle.join().unwrap().unwrap(), 6);
    }
}

#[test]
fn ranks_publish_the_address_they_reach_the_master_from() {
    // Every rank must publish the source address this host uses to reach the master
    // (what the routing table picks), never a wildcard. With the master on 127.0.0.2,
    // Linux picks 127.0.0.1 as the source: the published address must follow the route,
    // not simply copy MASTER_ADDR.
    let Ok(listener) = StoreListener::bind("127.0.0.2:0") else {
        eprintln!("skipped: 127.0.0.2 is not usable on this machine");
        return;
    };
    let store_addr = listener.local_addr().unwrap();
    let _guard = heavy_lock();
    let published = run_threads_on(listener, 3, TIMEOUT, |pg| {
        let mut x = vec![1u8; 5];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, vec![3u8; 5]);
        // Read the published addresses while rank 0's store is still up.
        let addrs = (pg.rank() == 0).then(|| {
            let mut client = StoreClient::connect(&[store_addr], 0, TIMEOUT).unwrap();
            (0..3)
                .map(|r| {
                    let raw = client.get(&format!("ringccl/addr/{r}")).unwrap().unwrap();
                    String::from_utf8(raw)
                        .unwrap()
                        .parse::<SocketAddr>()
                        .unwrap()
                })
                .collect::<Vec<_>>()
        });
        pg.barrier().unwrap();
        addrs
    });
    let route_src = std::net::TcpStream::connect(store_addr)
        .map(|s| s.local_addr().unwrap().ip())
        .ok();
    let addrs = published[0].as_ref().unwrap();
    for addr in addrs {
        assert!(!addr.ip().is_unspecified() && addr.port() != 0, "{addrs:?}");
        if let Some(src) = route_src {
            assert_eq!(addr.ip(), src, "{addrs:?}");
        }
    }
}

#[test]
fn works_over_ipv6_loopback() {
    let Ok(listener) = StoreListener::bind("[::1]:0") else {
        eprintln!("skipped: no IPv6 loopback on this machine");
        return;
    };
    let _guard = heavy_lock();
    let sums = run_threads_on(listener, 2, TIMEOUT, |pg| {
        let mut x = vec![pg.rank() as i64 + 1; 3];
        pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        x
    });
    assert_eq!(sums, vec![vec![3i64; 3]; 2]);
}
