//! Fuzzing the rendezvous store's decoders: random bytes never panic or allocate by a
//! stranger's number (lengths above the limits are refused at the header), accepted
//! headers are canonical, and the regression corpus in `tests/corpus/store_*` is
//! replayed. A live store is also fed random byte streams and must keep serving, answers
//! random sequences of set / set-if-absent / get as a map would, gives a racing
//! set-if-absent exactly one winner, and once aborted answers everything with the reason.

use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use ringccl_rendezvous::store::protocol::{
    Hello, RequestHeader, ResponseHeader, HELLO_LEN, MAX_KEY_LEN, MAX_VALUE_LEN,
    REQUEST_HEADER_LEN, RESPONSE_HEADER_LEN,
};
use ringccl_rendezvous::store::{StoreClient, StoreServer};
use ringccl_rendezvous::StoreListener;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn hellos(bytes in proptest::array::uniform12(any::<u8>())) {
        if let Ok(hello) = Hello::decode(&bytes) {
            let again = hello.encode();
            prop_assert_eq!(&again[..11], &bytes[..11]);
        }
    }

    #[test]
    fn request_headers(bytes in proptest::array::uniform9(any::<u8>())) {
        if let Ok(header) = RequestHeader::decode(&bytes) {
            prop_assert!(header.key_len <= MAX_KEY_LEN && header.value_len <= MAX_VALUE_LEN);
            prop_assert_eq!(header.encode(), bytes);
        }
    }

    #[test]
    fn response_headers(bytes in proptest::array::uniform5(any::<u8>())) {
        if let Ok(header) = ResponseHeader::decode(&bytes) {
            prop_assert!(header.value_len <= MAX_VALUE_LEN);
            prop_assert_eq!(header.encode(), bytes);
        }
    }
}

fn replay(dir: &str, len: usize, decode: impl Fn(&[u8]) -> bool) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(dir);
    let mut seen = 0;
    for entry in fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("corpus entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = fs::read(&path).expect("corpus file");
        assert_eq!(bytes.len(), len, "{name}");
        match name.split('-').next() {
            Some("ok") => assert!(decode(&bytes), "{name} was refused"),
            Some("err") => assert!(!decode(&bytes), "{name} was accepted"),
            _ => panic!("{name}: corpus files are named ok-* or err-*"),
        }
        seen += 1;
    }
    assert!(seen >= 4, "only {seen} corpus files in {}", dir.display());
}

#[test]
fn the_regression_corpus_is_replayed() {
    replay("store_hello", HELLO_LEN, |b| {
        Hello::decode(b.try_into().unwrap()).is_ok()
    });
    replay("store_request", REQUEST_HEADER_LEN, |b| {
        RequestHeader::decode(b.try_into().unwrap()).is_ok()
    });
    replay("store_response", RESPONSE_HEADER_LEN, |b| {
        ResponseHeader::decode(b.try_into().unwrap()).is_ok()
    });
}

#[test]
fn a_live_store_survives_random_byte_streams() {
    let server = StoreServer::start(StoreListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let addr = server.local_addr();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
    let valid_hello = Hello::CURRENT.encode();
    runner
        .run(
            &(
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..256),
            ),
            |(greet, junk)| {
                let mut stream = TcpStream::connect(addr).unwrap();
                if greet {
                    // Past the hello, so the request decoder sees the junk.
                    let _ = stream.write_all(&valid_hello);
                }
                let _ = stream.write_all(&junk);
                Ok(())
            },
        )
        .unwrap();
    // Still serving.
    let mut client = StoreClient::connect(&[addr], 0, Duration::from_secs(10)).unwrap();
    client.set("after", b"junk").unwrap();
    assert_eq!(client.get("after").unwrap(), Some(b"junk".to_vec()));
}

/// Racing claimants of one key: exactly one sets it, and every other one is told the
/// winner's value.
#[test]
fn set_if_absent_has_exactly_one_winner() {
    let server = StoreServer::start(StoreListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let addr = server.local_addr();
    let answers: Vec<Option<Vec<u8>>> = std::thread::scope(|scope| {
        let racers: Vec<_> = (0..8u8)
            .map(|i| {
                scope.spawn(move || {
                    let mut client =
                        StoreClient::connect(&[addr], 0, Duration::from_secs(30)).unwrap();
                    client.set_if_absent("ringccl/rank/1", &[i]).unwrap()
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let winners: Vec<usize> = (0..8).filter(|&i| answers[i].is_none()).collect();
    assert_eq!(winners.len(), 1, "{answers:?}");
    let winner = [winners[0] as u8];
    assert!(
        answers.iter().flatten().all(|v| v.as_slice() == winner),
        "{answers:?}"
    );
}

/// Once aborted, the store answers every request with the first reason, on every
/// connection, old or new.
#[test]
fn an_aborted_store_answers_everything_with_the_first_reason() {
    let server = StoreServer::start(StoreListener::bind("127.0.0.1:0").unwrap()).unwrap();
    let addr = server.local_addr();
    let mut waiter = StoreClient::connect(&[addr], 2, Duration::from_secs(30)).unwrap();
    let mut aborter = StoreClient::connect(&[addr], 1, Duration::from_secs(30)).unwrap();
    waiter.set("k", b"v").unwrap();
    assert!(waiter.check().is_ok());
    aborter.abort("first reason").unwrap();
    aborter.abort("second reason").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let errors = [
        waiter.check().unwrap_err(),
        waiter.get("k").unwrap_err(),
        waiter.set("k", b"w").unwrap_err(),
        waiter.set_if_absent("new", b"w").unwrap_err(),
        waiter
            .wait("never", deadline, &|| "nobody".into())
            .unwrap_err(),
        StoreClient::connect(&[addr], 3, Duration::from_secs(30))
            .unwrap()
            .get("k")
            .unwrap_err(),
    ];
    for err in errors {
        assert!(
            matches!(&err, ringccl_rendezvous::SetupError::RendezvousAborted { reason, .. } if reason == "first reason"),
            "{err}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random sequences of set, set-if-absent and get on a few keys answer as a map would.
    #[test]
    fn a_live_store_behaves_like_a_map(
        ops in proptest::collection::vec((0u8..3, 0u8..3, any::<u8>()), 1..40)
    ) {
        let server = StoreServer::start(StoreListener::bind("127.0.0.1:0").unwrap()).unwrap();
        let mut client = StoreClient::connect(&[server.local_addr()], 0, Duration::from_secs(30)).unwrap();
        let mut model = std::collections::HashMap::new();
        for (op, key, value) in ops {
            let name = format!("k{key}");
            match op {
                0 => {
                    client.set(&name, &[value]).unwrap();
                    model.insert(name, vec![value]);
                }
                1 => {
                    let expected = model.get(&name).cloned();
                    prop_assert_eq!(client.set_if_absent(&name, &[value]).unwrap(), expected.clone());
                    model.entry(name).or_insert(vec![value]);
                }
                _ => prop_assert_eq!(client.get(&name).unwrap(), model.get(&name).cloned()),
            }
        }
    }
}
