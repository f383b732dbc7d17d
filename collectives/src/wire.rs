//! The frame header that precedes every payload exchanged between ranks.
//!
//! Pure encode/decode: no I/O. Every message of a collective carries the full description
//! of the call it belongs to, so two ranks that disagree about which collective they are
//! in (a different order of calls, a different count, root or operator) find out on the
//! first message instead of hanging or silently mixing data.
//!
//! Layout (32 bytes, little-endian):
//!
//! | bytes  | field                                   |
//! |--------|-----------------------------------------|
//! | 0..2   | magic `b"RC"`                           |
//! | 2      | wire version                            |
//! | 3      | collective kind code                    |
//! | 4      | dtype code, `0xFF` for none             |
//! | 5      | reduce-op code, `0xFF` for none         |
//! | 6      | algorithm code (see [`Algorithm`])      |
//! | 7      | reserved, zero                          |
//! | 8..16  | sequence number                         |
//! | 16..24 | element count of the call               |
//! | 24..28 | root rank, `u32::MAX` for none          |
//! | 28..32 | payload length in bytes                 |

use std::fmt;

use crate::{CollectiveKind, DType, OpDesc, ReduceOp};

/// Largest payload one frame may carry (the length field is 32 bits; chunks are capped
/// well below it).
pub const MAX_FRAME_PAYLOAD: usize = 1 << 30;
/// Size of an encoded [`FrameHeader`].
pub const FRAME_HEADER_LEN: usize = 32;
const MAGIC: [u8; 2] = *b"RC";
/// Version of the frame layout; bumped on any incompatible change.
pub const WIRE_VERSION: u8 = 1;
const NONE8: u8 = 0xFF;
const NONE32: u32 = u32::MAX;

/// Which schedule a frame belongs to. Ranks that picked different algorithms for the
/// same call (different settings) get a clear error instead of garbage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Ring (all-reduce, reduce, reduce-scatter, all-gather).
    Ring,
    /// Recursive doubling all-reduce.
    RecursiveDoubling,
    /// Binomial-tree broadcast.
    BinomialTree,
    /// Pipelined-chain broadcast.
    Chain,
    /// Dissemination barrier.
    Dissemination,
    /// Pairwise exchange (all-to-all).
    Pairwise,
    /// Point-to-point.
    Direct,
}

impl Algorithm {
    const ALL: [Algorithm; 7] = [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::BinomialTree,
        Algorithm::Chain,
        Algorithm::Dissemination,
        Algorithm::Pairwise,
        Algorithm::Direct,
    ];

    /// Stable one-byte code used on the wire.
    pub const fn code(self) -> u8 {
        match self {
            Algorithm::Ring => 0,
            Algorithm::RecursiveDoubling => 1,
            Algorithm::BinomialTree => 2,
            Algorithm::Chain => 3,
            Algorithm::Dissemination => 4,
            Algorithm::Pairwise => 5,
            Algorithm::Direct => 6,
        }
    }

    /// Inverse of [`Algorithm::code`].
    pub fn from_code(code: u8) -> Option<Algorithm> {
        Algorithm::ALL.get(usize::from(code)).copied()
    }

    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive doubling",
            Algorithm::BinomialTree => "binomial tree",
            Algorithm::Chain => "chain",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Pairwise => "pairwise exchange",
            Algorithm::Direct => "direct",
        }
    }
}

/// The header in front of one payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The collective call this frame belongs to.
    pub op: OpDesc,
    /// The schedule the sender runs.
    pub algorithm: Algorithm,
    /// Number of payload bytes that follow.
    pub payload_len: u32,
}

/// Why a received header could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The first bytes are not ringccl's magic: the peer is not speaking this protocol.
    BadMagic([u8; 2]),
    /// The peer speaks another version of the protocol.
    Version(u8),
    /// A field holds a code this version does not know.
    BadField(&'static str, u64),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic(m) => write!(f, "bad magic bytes {m:02x?} (not a ringccl peer?)"),
            WireError::Version(v) => write!(
                f,
                "peer speaks wire version {v}, this build speaks {WIRE_VERSION}: run the same ringccl version on every rank"
            ),
            WireError::BadField(name, v) => write!(f, "invalid {name} code {v}"),
        }
    }
}

impl FrameHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut out = [0u8; FRAME_HEADER_LEN];
        out[0..2].copy_from_slice(&MAGIC);
        out[2] = WIRE_VERSION;
        out[3] = self.op.kind.code();
        out[4] = self.op.dtype.map_or(NONE8, DType::code);
        out[5] = self.op.op.map_or(NONE8, ReduceOp::code);
        out[6] = self.algorithm.code();
        out[8..16].copy_from_slice(&self.op.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.op.count.to_le_bytes());
        out[24..28].copy_from_slice(&self.op.root.unwrap_or(NONE32).to_le_bytes());
        out[28..32].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }

    /// Decodes a header, rejecting anything this version would not have produced.
    pub fn decode(bytes: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, WireError> {
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        if bytes[0..2] != MAGIC {
            return Err(WireError::BadMagic([bytes[0], bytes[1]]));
        }
        if bytes[2] != WIRE_VERSION {
            return Err(WireError::Version(bytes[2]));
        }
        let kind = CollectiveKind::from_code(bytes[3])
            .ok_or(WireError::BadField("collective kind", u64::from(bytes[3])))?;
        let dtype = match bytes[4] {
            NONE8 => None,
            c => Some(DType::from_code(c).ok_or(WireError::BadField("dtype", u64::from(c)))?),
        };
        let op = match bytes[5] {
            NONE8 => None,
            c => {
                Some(ReduceOp::from_code(c).ok_or(WireError::BadField("reduce op", u64::from(c)))?)
            }
        };
        let algorithm = Algorithm::from_code(bytes[6])
            .ok_or(WireError::BadField("algorithm", u64::from(bytes[6])))?;
        if bytes[7] != 0 {
            return Err(WireError::BadField("reserved", u64::from(bytes[7])));
        }
        let root = match u32_at(24) {
            NONE32 => None,
            r => Some(r),
        };
        Ok(FrameHeader {
            op: OpDesc {
                seq: u64_at(8),
                kind,
                dtype,
                count: u64_at(16),
                op,
                root,
            },
            algorithm,
            payload_len: u32_at(28),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for header in [
            FrameHeader {
                op: OpDesc::all_reduce(7, DType::BF16, 1 << 40, ReduceOp::Avg),
                algorithm: Algorithm::RecursiveDoubling,
                payload_len: 1 << 20,
            },
            FrameHeader {
                op: OpDesc::broadcast(u64::MAX, DType::I8, 0, 3),
                algorithm: Algorithm::Chain,
                payload_len: 0,
            },
            FrameHeader {
                op: OpDesc::barrier(1),
                algorithm: Algorithm::Dissemination,
                payload_len: 0,
            },
        ] {
            assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
        }
    }

    #[test]
    fn garbage_is_rejected() {
        let good = FrameHeader {
            op: OpDesc::barrier(1),
            algorithm: Algorithm::Dissemination,
            payload_len: 0,
        }
        .encode();
        let mut bad = good;
        bad[0] = b'G';
        assert!(matches!(
            FrameHeader::decode(&bad),
            Err(WireError::BadMagic(_))
        ));
        let mut bad = good;
        bad[2] = 9;
        assert_eq!(FrameHeader::decode(&bad), Err(WireError::Version(9)));
        let mut bad = good;
        bad[3] = 200;
        assert!(matches!(
            FrameHeader::decode(&bad),
            Err(WireError::BadField("collective kind", 200))
        ));
        let mut bad = good;
        bad[4] = 42;
        assert!(FrameHeader::decode(&bad).is_err());
        let mut bad = good;
        bad[7] = 1;
        assert!(FrameHeader::decode(&bad).is_err());
        // Every single-byte corruption of the fixed fields is caught or decodes to a
        // different header: the decoder never panics.
        for i in 0..FRAME_HEADER_LEN {
            for v in [0u8, 1, 0x7F, 0xFF] {
                let mut b = good;
                b[i] = v;
                let _ = FrameHeader::decode(&b);
            }
        }
    }
}
