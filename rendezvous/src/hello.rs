//! The handshake that opens every rank-to-rank connection. Pure encode/decode.

use std::fmt;

const PEER_MAGIC: [u8; 8] = *b"RCCLPEER";
/// Version of the peer protocol (handshake plus frames).
pub(crate) const PEER_VERSION: u16 = 1;
pub(crate) const PEER_HELLO_LEN: usize = 28;

/// Who is on the other end of a data connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerHello {
    pub(crate) job_id: u64,
    pub(crate) world_size: u32,
    pub(crate) rank: u32,
    /// Whether the sender requires the shared-secret challenge–response next.
    pub(crate) authenticated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HelloError {
    BadMagic,
    Version(u16),
    Job { theirs: u64, ours: u64 },
    WorldSize { theirs: u32, ours: u32 },
    Rank { theirs: u32, expected: String },
    Flags(u8),
    Auth(String),
}

impl fmt::Display for HelloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelloError::BadMagic => f.write_str("bad magic bytes: not a ringccl rank"),
            HelloError::Version(v) => write!(
                f,
                "peer protocol version {v}, this build speaks {PEER_VERSION}: run the same ringccl version on every rank"
            ),
            HelloError::Job { theirs, ours } => write!(
                f,
                "peer belongs to job {theirs:016x}, this rank to job {ours:016x}: two jobs share MASTER_ADDR/MASTER_PORT?"
            ),
            HelloError::WorldSize { theirs, ours } => write!(
                f,
                "peer was started with WORLD_SIZE={theirs}, this rank with WORLD_SIZE={ours}"
            ),
            HelloError::Rank { theirs, expected } => {
                write!(f, "peer says it is rank {theirs}, expected {expected}")
            }
            HelloError::Flags(flags) => write!(f, "unknown flags {flags:#04x}"),
            HelloError::Auth(reason) => f.write_str(reason),
        }
    }
}

impl PeerHello {
    pub(crate) fn encode(&self) -> [u8; PEER_HELLO_LEN] {
        let mut out = [0u8; PEER_HELLO_LEN];
        out[..8].copy_from_slice(&PEER_MAGIC);
        out[8..10].copy_from_slice(&PEER_VERSION.to_le_bytes());
        out[10] = u8::from(self.authenticated);
        out[12..16].copy_from_slice(&self.world_size.to_le_bytes());
        out[16..20].copy_from_slice(&self.rank.to_le_bytes());
        out[20..28].copy_from_slice(&self.job_id.to_le_bytes());
        out
    }

    /// Decodes a peer's hello and checks it belongs to the same job and world as `ours`.
    /// The rank is returned for the caller to check.
    pub(crate) fn decode_checked(
        bytes: &[u8; PEER_HELLO_LEN],
        ours: &PeerHello,
    ) -> Result<PeerHello, HelloError> {
        if bytes[..8] != PEER_MAGIC {
            return Err(HelloError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != PEER_VERSION {
            return Err(HelloError::Version(version));
        }
        let authenticated = match bytes[10] {
            0 => false,
            1 => true,
            other => return Err(HelloError::Flags(other)),
        };
        if let Some(reason) = crate::auth::mismatch_reason(ours.authenticated, authenticated) {
            return Err(HelloError::Auth(reason));
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut job = [0u8; 8];
        job.copy_from_slice(&bytes[20..28]);
        let theirs = PeerHello {
            world_size: u32_at(12),
            rank: u32_at(16),
            job_id: u64::from_le_bytes(job),
            authenticated,
        };
        if theirs.job_id != ours.job_id {
            return Err(HelloError::Job {
                theirs: theirs.job_id,
                ours: ours.job_id,
            });
        }
        if theirs.world_size != ours.world_size {
            return Err(HelloError::WorldSize {
                theirs: theirs.world_size,
                ours: ours.world_size,
            });
        }
        if theirs.rank >= ours.world_size || theirs.rank == ours.rank {
            return Err(HelloError::Rank {
                theirs: theirs.rank,
                expected: format!("another rank below {}", ours.world_size),
            });
        }
        Ok(theirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: PeerHello = PeerHello {
        job_id: 0xdead_beef,
        world_size: 4,
        rank: 1,
        authenticated: false,
    };

    #[test]
    fn accepts_a_peer_of_the_same_job() {
        let theirs = PeerHello { rank: 3, ..OURS };
        assert_eq!(
            PeerHello::decode_checked(&theirs.encode(), &OURS),
            Ok(theirs)
        );
    }

    #[test]
    fn rejects_strangers() {
        let check = |h: PeerHello| PeerHello::decode_checked(&h.encode(), &OURS);
        assert!(matches!(
            check(PeerHello {
                job_id: 1,
                rank: 2,
                ..OURS
            }),
            Err(HelloError::Job { .. })
        ));
        assert!(matches!(
            check(PeerHello {
                world_size: 8,
                rank: 2,
                ..OURS
            }),
            Err(HelloError::WorldSize { .. })
        ));
        assert!(matches!(
            check(PeerHello { rank: 4, ..OURS }),
            Err(HelloError::Rank { .. })
        ));
        assert!(matches!(check(OURS), Err(HelloError::Rank { .. })));
        let mut bytes = PeerHello { rank: 2, ..OURS }.encode();
        bytes[8] = 7;
        assert_eq!(
            PeerHello::decode_checked(&bytes, &OURS),
            Err(HelloError::Version(7))
        );
        assert_eq!(
            PeerHello::decode_checked(&[b'x'; PEER_HELLO_LEN], &OURS),
            Err(HelloError::BadMagic)
        );
        let with_token = PeerHello {
            rank: 2,
            authenticated: true,
            ..OURS
        };
        assert!(matches!(
            PeerHello::decode_checked(&with_token.encode(), &OURS),
            Err(HelloError::Auth(_))
        ));
        let mut bytes = with_token.encode();
        bytes[10] = 9;
        assert_eq!(
            PeerHello::decode_checked(&bytes, &OURS),
            Err(HelloError::Flags(9))
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        #[test]
        fn random_hellos_never_panic_and_accepted_ones_are_canonical(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), PEER_HELLO_LEN)
        ) {
            let bytes: [u8; PEER_HELLO_LEN] = bytes.try_into().unwrap();
            if let Ok(hello) = PeerHello::decode_checked(&bytes, &OURS) {
                let mut again = hello.encode();
                again[11] = bytes[11]; // the one byte the decoder ignores
                proptest::prop_assert_eq!(again, bytes);
            }
        }
    }

    #[test]
    fn the_regression_corpus_is_replayed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/peer_hello");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes: [u8; PEER_HELLO_LEN] = std::fs::read(&path).unwrap().try_into().unwrap();
            let result = PeerHello::decode_checked(&bytes, &OURS);
            match name.split('-').next() {
                Some("ok") => assert!(result.is_ok(), "{name}: {result:?}"),
                Some("err") => assert!(result.is_err(), "{name}: accepted"),
                _ => panic!("{name}"),
            }
            seen += 1;
        }
        assert!(seen >= 8);
    }
}
