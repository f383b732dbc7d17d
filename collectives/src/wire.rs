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

use bytes::{Buf, BufMut, TryGetError};

use crate::{CollectiveKind, DType, Error, OpDesc, ReduceOp};

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
    /// The device library's own schedule (NCCL picks it); never in a frame, only in what
    /// a rank tells a peer that asks what it is doing.
    Device,
    /// Rabenseifner's halving-doubling all-reduce (reduce-scatter by recursive halving,
    /// all-gather by recursive doubling).
    HalvingDoubling,
    /// Hierarchical all-reduce: inside each host, across hosts, inside each host again.
    Hierarchical,
    /// Ranks of one process reading each other's buffers (`peer_memory.rs`); never in a
    /// frame, only in what a rank tells a peer that asks what it is doing.
    PeerMemory,
    /// Gather-release barrier: every rank signals rank 0, which releases them all.
    GatherRelease,
    /// Barrier in memory the group shares (`memory_barrier.rs`): each rank publishes the
    /// number of the latest barrier it has arrived at. Never in a frame, only in what a
    /// rank tells a peer that asks what it is doing.
    SharedCounters,
}

impl Algorithm {
    const ALL: [Algorithm; 13] = [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::BinomialTree,
        Algorithm::Chain,
        Algorithm::Dissemination,
        Algorithm::Pairwise,
        Algorithm::Direct,
        Algorithm::Device,
        Algorithm::HalvingDoubling,
        Algorithm::Hierarchical,
        Algorithm::PeerMemory,
        Algorithm::GatherRelease,
        Algorithm::SharedCounters,
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
            Algorithm::Device => 7,
            Algorithm::HalvingDoubling => 8,
            Algorithm::Hierarchical => 9,
            Algorithm::PeerMemory => 10,
            Algorithm::GatherRelease => 11,
            Algorithm::SharedCounters => 12,
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
            Algorithm::Device => "device library",
            Algorithm::HalvingDoubling => "halving-doubling",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::PeerMemory => "peer memory",
            Algorithm::GatherRelease => "gather-release",
            Algorithm::SharedCounters => "shared counters",
        }
    }

    /// A stable identifier, for files that tools read (the flight recorder's dumps).
    ///
    /// ```
    /// use ringccl_collectives::wire::Algorithm;
    /// assert_eq!(Algorithm::RecursiveDoubling.label(), "recursive_doubling");
    /// ```
    pub const fn label(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::BinomialTree => "binomial_tree",
            Algorithm::Chain => "chain",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Direct => "direct",
            Algorithm::Device => "device",
            Algorithm::HalvingDoubling => "halving_doubling",
            Algorithm::Hierarchical => "hierarchical",
            Algorithm::PeerMemory => "peer_memory",
            Algorithm::GatherRelease => "gather_release",
            Algorithm::SharedCounters => "shared_counters",
        }
    }
}

/// Checks that a peer runs the same call as this rank: the same description (else
/// [`Error::CollectiveMismatch`]) and the same schedule (else [`Error::Protocol`]). Used
/// on every received frame header and on what a peer says it is doing when asked.
pub(crate) fn same_call(
    rank: usize,
    peer: usize,
    (mine, my_algorithm): (OpDesc, Algorithm),
    (theirs, their_algorithm): (OpDesc, Algorithm),
) -> Result<(), Error> {
    if theirs != mine {
        return Err(Error::CollectiveMismatch {
            rank,
            mine,
            peer,
            theirs,
        });
    }
    if their_algorithm != my_algorithm {
        return Err(Error::Protocol {
            rank,
            peer,
            op: mine,
            reason: format!(
                "peer runs the {} algorithm, this rank {}: configure the algorithm (RINGCCL_ALGO, InitOptions) identically on every rank",
                their_algorithm.name(),
                my_algorithm.name()
            ),
        });
    }
    Ok(())
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
    /// Fewer bytes than a header. [`FrameHeader::decode`] takes a whole header, so this
    /// is not seen in practice; it is an error, not a panic, all the same.
    Truncated {
        /// Bytes the next field needed.
        requested: usize,
        /// Bytes that were left.
        available: usize,
    },
}

impl From<TryGetError> for WireError {
    fn from(e: TryGetError) -> WireError {
        WireError::Truncated {
            requested: e.requested,
            available: e.available,
        }
    }
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
            WireError::Truncated {
                requested,
                available,
            } => write!(
                f,
                "frame header cut short: {available} bytes left where a field needs {requested}"
            ),
        }
    }
}

impl FrameHeader {
    /// Encodes the header. Allocation-free: the fields are put, in wire order, into an
    /// array on the stack.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut out = [0u8; FRAME_HEADER_LEN];
        let mut w = &mut out[..];
        w.put_slice(&MAGIC);
        w.put_u8(WIRE_VERSION);
        w.put_u8(self.op.kind.code());
        w.put_u8(self.op.dtype.map_or(NONE8, DType::code));
        w.put_u8(self.op.op.map_or(NONE8, ReduceOp::code));
        w.put_u8(self.algorithm.code());
        w.put_u8(0); // reserved
        w.put_u64_le(self.op.seq);
        w.put_u64_le(self.op.count);
        w.put_u32_le(self.op.root.unwrap_or(NONE32));
        w.put_u32_le(self.payload_len);
        debug_assert!(
            w.is_empty(),
            "the header layout fills exactly {FRAME_HEADER_LEN} bytes"
        );
        out
    }

    /// Decodes a header, rejecting anything this version would not have produced. The
    /// fields are read in wire order, so the first bad one is the one reported.
    pub fn decode(bytes: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, WireError> {
        let mut r = &bytes[..];
        let magic = [r.try_get_u8()?, r.try_get_u8()?];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = r.try_get_u8()?;
        if version != WIRE_VERSION {
            return Err(WireError::Version(version));
        }
        let code = r.try_get_u8()?;
        let kind = CollectiveKind::from_code(code)
            .ok_or(WireError::BadField("collective kind", u64::from(code)))?;
        let dtype = match r.try_get_u8()? {
            NONE8 => None,
            c => Some(DType::from_code(c).ok_or(WireError::BadField("dtype", u64::from(c)))?),
        };
        let op = match r.try_get_u8()? {
            NONE8 => None,
            c => {
                Some(ReduceOp::from_code(c).ok_or(WireError::BadField("reduce op", u64::from(c)))?)
            }
        };
        let code = r.try_get_u8()?;
        let algorithm =
            Algorithm::from_code(code).ok_or(WireError::BadField("algorithm", u64::from(code)))?;
        let reserved = r.try_get_u8()?;
        if reserved != 0 {
            return Err(WireError::BadField("reserved", u64::from(reserved)));
        }
        let seq = r.try_get_u64_le()?;
        let count = r.try_get_u64_le()?;
        let root = match r.try_get_u32_le()? {
            NONE32 => None,
            root => Some(root),
        };
        let payload_len = r.try_get_u32_le()?;
        Ok(FrameHeader {
            op: OpDesc {
                seq,
                kind,
                dtype,
                count,
                op,
                root,
            },
            algorithm,
            payload_len,
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

    /// The layout, pinned byte for byte (these bytes were produced by the encoder before
    /// it used `bytes`): a change of field order or endianness fails here first.
    #[test]
    fn the_layout_is_pinned_byte_for_byte() {
        let cases: [(FrameHeader, [u8; FRAME_HEADER_LEN]); 3] = [
            (
                FrameHeader {
                    op: OpDesc::all_reduce(
                        0x0102_0304_0506_0708,
                        DType::BF16,
                        0x1122_3344_5566_7788,
                        ReduceOp::Avg,
                    ),
                    algorithm: Algorithm::RecursiveDoubling,
                    payload_len: 0xA1B2_C3D4,
                },
                [
                    82, 67, 1, 0, 3, 4, 1, 0, 8, 7, 6, 5, 4, 3, 2, 1, 136, 119, 102, 85, 68, 51,
                    34, 17, 255, 255, 255, 255, 212, 195, 178, 161,
                ],
            ),
            (
                FrameHeader {
                    op: OpDesc::broadcast(9, DType::I8, 5, 3),
                    algorithm: Algorithm::Chain,
                    payload_len: 40,
                },
                [
                    82, 67, 1, 1, 4, 255, 3, 0, 9, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 3,
                    0, 0, 0, 40, 0, 0, 0,
                ],
            ),
            (
                FrameHeader {
                    op: OpDesc::barrier(1),
                    algorithm: Algorithm::Dissemination,
                    payload_len: 0,
                },
                [
                    82, 67, 1, 2, 255, 255, 4, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    255, 255, 255, 255, 0, 0, 0, 0,
                ],
            ),
        ];
        for (header, bytes) in cases {
            assert_eq!(header.encode(), bytes, "{header:?}");
            assert_eq!(FrameHeader::decode(&bytes), Ok(header));
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
