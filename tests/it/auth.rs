//! `RINGCCL_AUTH_TOKEN` / `InitOptions::auth_token`: ranks that share the token form a
//! group; a rank with a wrong token or none is refused with a message that says why; a
//! client without the token cannot use the rendezvous store.

use crate::common;

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use common::{heavy_lock, run_threads_with, GROUP_TIMEOUT};
use ringccl::core::store::{StoreClient, StoreServer};
use ringccl::{init_process_group, AuthToken, InitOptions, ReduceOp, StoreListener};

#[test]
fn ranks_that_share_the_token_form_a_group() {
    let _heavy = heavy_lock();
    let sums = run_threads_with(
        3,
        GROUP_TIMEOUT,
        |opts| opts.auth_token("correct horse battery staple"),
        |pg| {
            let mut x = [pg.rank() as f32 + 1.0; 5];
            pg.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            x[0]
        },
    );
    assert_eq!(sums, vec![6.0; 3]);
}

/// Starts 3 ranks (threads) whose tokens are `tokens[rank]`; returns each init's result
/// as a string.
fn join_with(tokens: [Option<&'static str>; 3]) -> Vec<Result<(), String>> {
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut listener = Some(listener);
    thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let mut opts = InitOptions::new(rank, 3, &addr)
                    .timeout(Duration::from_secs(8))
                    .transport(ringccl::TransportKind::Tcp);
                if let Some(token) = tokens[rank] {
                    opts = opts.auth_token(token);
                }
                if rank == 0 {
                    opts = opts.store_listener(listener.take().unwrap());
                }
                s.spawn(move || {
                    init_process_group("gloo", opts)
                        .and_then(|pg| pg.barrier())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_rank_with_the_wrong_token_is_refused_and_says_why() {
    // No heavy lock: the ranks mostly wait for the deadline.
    let results = join_with([Some("right"), Some("right"), Some("wrong")]);
    let err = results[2].as_ref().unwrap_err();
    assert!(
        err.contains("rank 2") && err.contains("auth token"),
        "{err}"
    );
    assert!(results[0].is_err() && results[1].is_err(), "{results:?}");
}

#[test]
fn a_rank_without_a_token_is_refused_and_told_to_set_one() {
    // No heavy lock: the ranks mostly wait for the deadline.
    let results = join_with([Some("right"), Some("right"), None]);
    let err = results[2].as_ref().unwrap_err();
    assert!(err.contains("RINGCCL_AUTH_TOKEN"), "{err}");
    assert!(err.contains("requires an auth token"), "{err}");
}

#[test]
fn the_store_serves_only_clients_that_hold_the_token() {
    // The store is a start-up building block: it reports start-up's own error type.
    use ringccl::SetupError as Error;
    let listener = StoreListener::bind("127.0.0.1:0").unwrap();
    let token = AuthToken::new("s3cret");
    let server = StoreServer::start_authenticated(listener, token.clone()).unwrap();
    let addrs: Vec<SocketAddr> = vec![server.local_addr()];
    let limit = Duration::from_secs(5);

    let err = StoreClient::connect(&addrs, 1, limit).unwrap_err();
    assert!(matches!(err, Error::Handshake { .. }), "{err}");
    assert!(err.to_string().contains("RINGCCL_AUTH_TOKEN"), "{err}");

    let err =
        StoreClient::connect_authenticated(&addrs, 1, limit, AuthToken::new("guess")).unwrap_err();
    assert!(err.to_string().contains("auth"), "{err}");

    let mut client = StoreClient::connect_authenticated(&addrs, 1, limit, token).unwrap();
    client.set("k", b"v").unwrap();
    assert_eq!(client.get("k").unwrap(), Some(b"v".to_vec()));
}
