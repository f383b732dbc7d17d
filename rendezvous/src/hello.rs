//! The handshake that opens every rank-to-rank connection. Pure encode/decode.

use std::fmt;

use bytes::{Buf, BufMut, TryGetError};

const PEER_MAGIC: [u8; 8] = *b"RCCLPEER";
/// Version of the peer protocol (handshake plus frames).
pub(crate) const PEER_VERSION: u16 = 1;
pub(crate) const PEER_HELLO_LEN: usize = 28;

/// Which of a pair's two connections this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Channel {
    /// Frames of the collectives (or, under shared memory and NCCL, liveness only).
    Data = 0,
    /// Control messages: abort notices and "what are you doing?" questions.
    Control = 1,
}

/// Who is on the other end of a rank-to-rank connection, and which connection it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerHello {
    pub(crate) job_id: u64,
    pub(crate) world_size: u32,
    pub(crate) rank: u32,
    /// Whether the sender requires the shared-secret challenge–response next.
    pub(crate) authenticated: bool,
    pub(crate) channel: Channel,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HelloError {
    BadMagic,
    Version(u16),
    Job { theirs: u64, ours: u64 },
    WorldSize { theirs: u32, ours: u32 },
    Rank { theirs: u32, expected: String },
    Flags(u8),
    Channel(u8),
    Auth(String),
    Truncated { requested: usize, available: usize },
}

impl From<TryGetError> for HelloError {
    fn from(e: TryGetError) -> HelloError {
        HelloError::Truncated {
            requested: e.requested,
            available: e.available,
        }
    }
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
            HelloError::Channel(code) => write!(f, "unknown channel {code}"),
            HelloError::Auth(reason) => f.write_str(reason),
            HelloError::Truncated {
                requested,
                available,
            } => write!(
                f,
                "hello cut short: {available} bytes left where a field needs {requested}"
            ),
        }
    }
}

impl PeerHello {
    pub(crate) fn encode(&self) -> [u8; PEER_HELLO_LEN] {
        let mut out = [0u8; PEER_HELLO_LEN];
        let mut w = &mut out[..];
        w.put_slice(&PEER_MAGIC);
        w.put_u16_le(PEER_VERSION);
        w.put_u8(u8::from(self.authenticated));
        w.put_u8(self.channel as u8);
        w.put_u32_le(self.world_size);
        w.put_u32_le(self.rank);
        w.put_u64_le(self.job_id);
        debug_assert!(w.is_empty());
        out
    }

    /// Decodes a peer's hello and checks it belongs to the same job and world as `ours`.
    /// The rank and the channel are returned for the caller to check.
    pub(crate) fn decode_checked(
        bytes: &[u8; PEER_HELLO_LEN],
        ours: &PeerHello,
    ) -> Result<PeerHello, HelloError> {
        let mut r = &bytes[..];
        let mut magic = [0u8; PEER_MAGIC.len()];
        r.try_copy_to_slice(&mut magic)?;
        if magic != PEER_MAGIC {
            return Err(HelloError::BadMagic);
        }
        let version = r.try_get_u16_le()?;
        if version != PEER_VERSION {
            return Err(HelloError::Version(version));
        }
        let authenticated = match r.try_get_u8()? {
            0 => false,
            1 => true,
            other => return Err(HelloError::Flags(other)),
        };
        if let Some(reason) = crate::auth::mismatch_reason(ours.authenticated, authenticated) {
            return Err(HelloError::Auth(reason));
        }
        let channel = match r.try_get_u8()? {
            0 => Channel::Data,
            1 => Channel::Control,
            other => return Err(HelloError::Channel(other)),
        };
        let theirs = PeerHello {
            world_size: r.try_get_u32_le()?,
            rank: r.try_get_u32_le()?,
            job_id: r.try_get_u64_le()?,
            authenticated,
            channel,
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
        channel: Channel::Data,
    };

    #[test]
    fn accepts_a_peer_of_the_same_job() {
        let theirs = PeerHello { rank: 3, ..OURS };
        assert_eq!(
            PeerHello::decode_checked(&theirs.encode(), &OURS),
            Ok(theirs)
        );
    }

    /// The layout, pinned byte for byte: magic, version, flags, channel, world size,
    /// rank, job id (little-endian).
    #[test]
    fn the_layout_is_pinned_byte_for_byte() {
        let hello = PeerHello {
            job_id: 0x0102_0304_0506_0708,
            world_size: 0x1122_3344,
            rank: 0x5566_7788,
            authenticated: true,
            channel: Channel::Control,
        };
        let mut expected = Vec::from(*b"RCCLPEER");
        expected.extend([1, 0, 1, 1]);
        expected.extend([0x44, 0x33, 0x22, 0x11, 0x88, 0x77, 0x66, 0x55]);
        expected.extend([8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(hello.encode().as_slice(), expected.as_slice());
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
        let mut bytes = PeerHello { rank: 2, ..OURS }.encode();
        bytes[11] = 2;
        assert_eq!(
            PeerHello::decode_checked(&bytes, &OURS),
            Err(HelloError::Channel(2))
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
                proptest::prop_assert_eq!(hello.encode(), bytes);
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
