//! Optional shared-secret authentication of every connection (store and rank-to-rank):
//! an HMAC-SHA256 challenge–response in both directions, right after the hello.
//!
//! ```text
//! both sides:  send a fresh 32-byte nonce, read the other's
//! both sides:  send HMAC(token, LABEL | my role | their nonce | my nonce), read theirs
//! both sides:  check the other's proof (constant time)
//! ```
//!
//! The role (the side that connected, or the side that accepted) is part of what is
//! signed, so a proof cannot be reflected back to the side that made it, and fresh nonces
//! on both sides mean a recorded proof is useless later. The token proves that both ends
//! hold it; it does not encrypt or protect the bytes that follow (run jobs on a private
//! network, as with NCCL and gloo).

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::deadline_io::{read_exact_by, write_all_by};

/// Length of a nonce and of a proof.
pub(crate) const AUTH_LEN: usize = 32;
const LABEL: &[u8] = b"ringccl-auth-v1";

/// A shared secret every rank of a job must hold (`InitOptions::auth_token`, or the
/// `RINGCCL_AUTH_TOKEN` environment variable). Its `Debug` output never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(Arc<[u8]>);

impl AuthToken {
    /// Wraps a secret; `None` if it is empty.
    pub fn new(secret: impl AsRef<[u8]>) -> Option<AuthToken> {
        let secret = secret.as_ref();
        (!secret.is_empty()).then(|| AuthToken(Arc::from(secret)))
    }
}

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

/// Which end of the connection a side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The side that connected.
    Initiator,
    /// The side that accepted.
    Acceptor,
}

impl Role {
    fn code(self) -> u8 {
        match self {
            Role::Initiator => b'I',
            Role::Acceptor => b'A',
        }
    }

    fn other(self) -> Role {
        match self {
            Role::Initiator => Role::Acceptor,
            Role::Acceptor => Role::Initiator,
        }
    }
}

/// The MAC over everything a proof binds. `None` cannot happen (HMAC takes keys of any
/// length) and makes every proof fail rather than panic.
fn mac(
    token: &AuthToken,
    prover: Role,
    verifier_nonce: &[u8],
    prover_nonce: &[u8],
) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&token.0).ok()?;
    mac.update(LABEL);
    mac.update(&[prover.code()]);
    mac.update(verifier_nonce);
    mac.update(prover_nonce);
    Some(mac)
}

/// The proof `prover` sends: it binds the token, the prover's role and both nonces.
pub(crate) fn proof(
    token: &AuthToken,
    prover: Role,
    verifier_nonce: &[u8; AUTH_LEN],
    prover_nonce: &[u8; AUTH_LEN],
) -> [u8; AUTH_LEN] {
    mac(token, prover, verifier_nonce, prover_nonce)
        .map_or([0; AUTH_LEN], |mac| mac.finalize().into_bytes().into())
}

/// Checks, in constant time, a proof received from `prover`.
pub(crate) fn verify(
    token: &AuthToken,
    prover: Role,
    verifier_nonce: &[u8; AUTH_LEN],
    prover_nonce: &[u8; AUTH_LEN],
    received: &[u8; AUTH_LEN],
) -> bool {
    mac(token, prover, verifier_nonce, prover_nonce)
        .is_some_and(|mac| mac.verify_slice(received).is_ok())
}

/// 32 bytes from the kernel's random source.
pub(crate) fn fresh_nonce() -> io::Result<[u8; AUTH_LEN]> {
    let mut nonce = [0u8; AUTH_LEN];
    File::open("/dev/urandom")?.read_exact(&mut nonce)?;
    Ok(nonce)
}

/// Runs the exchange on `stream` as `role`, by `deadline`. The error says what failed,
/// in words meant for the log or an error message.
pub(crate) fn authenticate(
    stream: &TcpStream,
    token: &AuthToken,
    role: Role,
    deadline: Instant,
) -> Result<(), String> {
    let mine = fresh_nonce().map_err(|e| {
        if crate::fd_limit::is_exhaustion(&e) {
            format!(
                "cannot read /dev/urandom: out of file descriptors: {}",
                crate::fd_limit::explain(&e)
            )
        } else {
            format!("cannot read /dev/urandom: {e}")
        }
    })?;
    write_all_by(stream, &mine, deadline).map_err(|e| format!("sending the auth nonce: {e}"))?;
    let mut theirs = [0u8; AUTH_LEN];
    read_exact_by(stream, &mut theirs, deadline)
        .map_err(|e| format!("reading the auth nonce: {e}"))?;
    if theirs == mine {
        return Err("the peer echoed our nonce back (a reflection attempt?)".into());
    }
    write_all_by(stream, &proof(token, role, &theirs, &mine), deadline)
        .map_err(|e| format!("sending the auth proof: {e}"))?;
    let mut received = [0u8; AUTH_LEN];
    read_exact_by(stream, &mut received, deadline)
        .map_err(|e| format!("reading the auth proof (the peer may have rejected ours: is RINGCCL_AUTH_TOKEN the same on every rank?): {e}"))?;
    if verify(token, role.other(), &mine, &theirs, &received) {
        Ok(())
    } else {
        Err("wrong auth token: the peer does not know this job's RINGCCL_AUTH_TOKEN".into())
    }
}

/// What to say when one side wants authentication and the other does not.
pub(crate) fn mismatch_reason(ours: bool, theirs: bool) -> Option<String> {
    match (ours, theirs) {
        (true, false) => Some(
            "this side requires an auth token (RINGCCL_AUTH_TOKEN) but the peer sent none: \
             set the same token on every rank"
                .into(),
        ),
        (false, true) => Some(
            "the peer requires an auth token but this side has none: set \
             RINGCCL_AUTH_TOKEN (or InitOptions::auth_token) on every rank"
                .into(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> AuthToken {
        AuthToken::new(s).unwrap()
    }

    #[test]
    fn a_proof_verifies_only_with_the_same_token_role_and_nonces() {
        let (a, b) = ([1u8; AUTH_LEN], [2u8; AUTH_LEN]);
        let t = token("s3cret");
        let p = proof(&t, Role::Initiator, &b, &a);
        assert!(verify(&t, Role::Initiator, &b, &a, &p));
        assert!(!verify(&token("other"), Role::Initiator, &b, &a, &p));
        assert!(
            !verify(&t, Role::Acceptor, &b, &a, &p),
            "no reflection across roles"
        );
        assert!(
            !verify(&t, Role::Initiator, &a, &b, &p),
            "nonces are ordered"
        );
        assert!(
            !verify(&t, Role::Initiator, &[3; AUTH_LEN], &a, &p),
            "fresh nonce"
        );
        let mut flipped = p;
        flipped[7] ^= 1;
        assert!(!verify(&t, Role::Initiator, &b, &a, &flipped));
    }

    #[test]
    fn tokens_are_never_printed_and_never_empty() {
        assert_eq!(format!("{:?}", token("hunter2")), "AuthToken(<redacted>)");
        assert!(AuthToken::new("").is_none());
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(fresh_nonce().unwrap(), fresh_nonce().unwrap());
    }

    #[test]
    fn both_ends_of_a_socket_agree_and_a_wrong_token_fails_on_both() {
        use std::net::TcpListener;
        use std::time::Duration;
        for (left, right, ok) in [("same", "same", true), ("one", "two", false)] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let acceptor = std::thread::spawn(move || {
                let (stream, _) = listener.accept().unwrap();
                authenticate(&stream, &token(right), Role::Acceptor, deadline)
            });
            let stream = TcpStream::connect(addr).unwrap();
            let mine = authenticate(&stream, &token(left), Role::Initiator, deadline);
            let theirs = acceptor.join().unwrap();
            assert_eq!(mine.is_ok(), ok, "{mine:?}");
            assert_eq!(theirs.is_ok(), ok, "{theirs:?}");
            if !ok {
                assert!(mine.unwrap_err().contains("wrong auth token"));
            }
        }
    }
}
