//! The control messages ranks exchange on their control connections, and their encoding.
//! Pure encode/decode: no I/O.
//!
//! Each message is `[u32 body length, little-endian][u8 kind][body]`:
//!
//! | kind | message   | body                                                      |
//! |------|-----------|-----------------------------------------------------------|
//! | 1    | `Abort` without a cause | u32 origin rank, reason (UTF-8, at most 2 KiB) |
//! | 6    | `Abort` with a cause | u32 origin rank, u32 cause rank, reason (UTF-8, at most 2 KiB) |
//! | 2    | `Ask`     | u32 nonce, snapshot                                       |
//! | 3    | `Status`  | u32 nonce, snapshot                                       |
//! | 4    | `Leaving` | nothing                                                   |
//! | 5    | `Fingerprint` | the op, as a 32-byte frame header (payload length zero) |
//!
//! A snapshot is a flags byte, then one block per flag set, in this order:
//!
//! | flag  | block (when set)                                                          |
//! |-------|---------------------------------------------------------------------------|
//! | bit 0 | the running op: a 32-byte frame header (payload length zero); its numbering: u8 (0 unknown, 1 the group's, 2 sent to, 3 received from) and u32 peer (`u32::MAX` for 0 and 1); u64 waits, u64 waiting-on-since, u64 stalled-since |
//! | bit 1 | u32 rank it is blocked on                                                 |
//! | bit 2 | counts with one peer: u32 peer, u64 collectives, u64 sent, u64 received   |
//!
//! (Layout 2. Layout 1 had bits 0 and 1 only, with the header alone; a build of either
//! layout refuses the other's `Ask` and `Status` as malformed.)
//!
//! An `Abort` that names no cause is sent as kind 1, byte for byte as before kind 6
//! existed; one that names the rank the aborting rank found at the root of its failure
//! (the rank everyone waited for) is kind 6. Every decoder of this layout reads both; a
//! build that predates kind 6 refuses it as an unknown kind and closes that control
//! connection, so it learns of the abort from the data connections closing instead.

use std::fmt;

use bytes::{Buf, BufMut};

use super::{PairCounts, Snapshot};
use crate::wire::{Algorithm, FrameHeader, WireError, FRAME_HEADER_LEN};
use crate::OpDesc;
use crate::Sequence;

/// Longest body a control message may have; anything longer is refused unread.
pub const MAX_CONTROL_BODY: usize = 4096;
/// Longest reason an `Abort` carries; longer ones are cut at a character boundary.
const MAX_REASON: usize = 2048;
const PREFIX: usize = 5;

const ABORT: u8 = 1;
const ASK: u8 = 2;
const STATUS: u8 = 3;
const LEAVING: u8 = 4;
const FINGERPRINT: u8 = 5;
const ABORT_CAUSED: u8 = 6;

const RUNNING: u8 = 1;
const BLOCKED: u8 = 2;
const COUNTED: u8 = 4;

const NUMBERED_UNKNOWN: u8 = 0;
const NUMBERED_BY_GROUP: u8 = 1;
const NUMBERED_SENT_TO: u8 = 2;
const NUMBERED_RECEIVED_FROM: u8 = 3;
const NO_PEER: u32 = u32::MAX;

/// One control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlMessage {
    /// Rank `origin` aborted the group, for `reason`. Receivers fail every pending and
    /// later call, naming `origin`, `reason` and `cause`, and pass the notice on.
    Abort {
        /// The rank that aborted.
        origin: usize,
        /// Why, in words.
        reason: String,
        /// The rank `origin` found at the root of its failure (for a timeout, the rank
        /// it, and whoever it waited for, waited for), when it knows one. A rank whose
        /// connections close right after its notice only aborted; this is who to blame.
        cause: Option<usize>,
    },
    /// "I am doing this; what are you doing?" Answered with a `Status` of the same nonce.
    Ask {
        /// Matches the answer to the question.
        nonce: u32,
        /// What the asker is doing.
        snapshot: Snapshot,
    },
    /// The answer to an `Ask`.
    Status {
        /// The question's nonce.
        nonce: u32,
        /// What the answering rank is doing.
        snapshot: Snapshot,
    },
    /// The sender dropped its group in an orderly way; it sends nothing more.
    Leaving,
    /// The collective the sender is running, for an engine that cannot check frames
    /// itself (NCCL): each rank tells its successor in rank order, and checks its
    /// predecessor's against its own.
    Fingerprint {
        /// The op.
        op: OpDesc,
    },
}

/// Why bytes on a control connection could not be decoded. The connection is then
/// unusable: the stream has lost its framing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// The length prefix exceeds [`MAX_CONTROL_BODY`].
    TooLong(u32),
    /// An unknown message kind.
    Kind(u8),
    /// The body does not match its kind.
    Body(String),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::TooLong(n) => write!(
                f,
                "control message of {n} bytes (the limit is {MAX_CONTROL_BODY})"
            ),
            ControlError::Kind(k) => write!(f, "unknown control message kind {k}"),
            ControlError::Body(why) => write!(f, "malformed control message: {why}"),
        }
    }
}

impl From<WireError> for ControlError {
    fn from(e: WireError) -> ControlError {
        ControlError::Body(e.to_string())
    }
}

impl From<bytes::TryGetError> for ControlError {
    fn from(e: bytes::TryGetError) -> ControlError {
        ControlError::Body(format!(
            "cut short: {} bytes left where a field needs {}",
            e.available, e.requested
        ))
    }
}

fn rank_u32(rank: usize) -> u32 {
    u32::try_from(rank).unwrap_or(u32::MAX)
}

fn put_snapshot(out: &mut Vec<u8>, snapshot: &Snapshot) {
    let mut flags = 0;
    if snapshot.current.is_some() {
        flags |= RUNNING;
    }
    if snapshot.blocked_on.is_some() {
        flags |= BLOCKED;
    }
    if snapshot.counts.is_some() {
        flags |= COUNTED;
    }
    out.put_u8(flags);
    if let Some((op, algorithm)) = snapshot.current {
        out.put_slice(
            &FrameHeader {
                op,
                algorithm,
                payload_len: 0,
            }
            .encode(),
        );
        let (code, peer) = match snapshot.sequence {
            None => (NUMBERED_UNKNOWN, NO_PEER),
            Some(Sequence::Collective) => (NUMBERED_BY_GROUP, NO_PEER),
            Some(Sequence::SentTo(peer)) => (NUMBERED_SENT_TO, rank_u32(peer)),
            Some(Sequence::ReceivedFrom(peer)) => (NUMBERED_RECEIVED_FROM, rank_u32(peer)),
        };
        out.put_u8(code);
        out.put_u32_le(peer);
        out.put_u64_le(snapshot.waits);
        out.put_u64_le(snapshot.waiting_on_since);
        out.put_u64_le(snapshot.stalled_since);
    }
    if let Some(peer) = snapshot.blocked_on {
        out.put_u32_le(rank_u32(peer));
    }
    if let Some(counts) = snapshot.counts {
        out.put_u32_le(rank_u32(counts.peer));
        out.put_u64_le(counts.collectives);
        out.put_u64_le(counts.sent);
        out.put_u64_le(counts.received);
    }
}

fn get_sequence(body: &mut &[u8]) -> Result<Option<Sequence>, ControlError> {
    let code = body.try_get_u8()?;
    let peer = body.try_get_u32_le()?;
    let sequence = match code {
        NUMBERED_UNKNOWN => None,
        NUMBERED_BY_GROUP => Some(Sequence::Collective),
        NUMBERED_SENT_TO => Some(Sequence::SentTo(peer as usize)),
        NUMBERED_RECEIVED_FROM => Some(Sequence::ReceivedFrom(peer as usize)),
        other => {
            return Err(ControlError::Body(format!(
                "unknown numbering code {other}"
            )))
        }
    };
    if matches!(code, NUMBERED_UNKNOWN | NUMBERED_BY_GROUP) && peer != NO_PEER {
        return Err(ControlError::Body(format!(
            "numbering code {code} names peer {peer}"
        )));
    }
    Ok(sequence)
}

fn get_snapshot(body: &mut &[u8]) -> Result<Snapshot, ControlError> {
    let flags = body.try_get_u8()?;
    if flags & !(RUNNING | BLOCKED | COUNTED) != 0 {
        return Err(ControlError::Body(format!("unknown flags {flags:#04x}")));
    }
    let mut snapshot = Snapshot::default();
    if flags & RUNNING != 0 {
        let mut raw = [0u8; FRAME_HEADER_LEN];
        body.try_copy_to_slice(&mut raw)?;
        let header = FrameHeader::decode(&raw)?;
        snapshot.current = Some((header.op, header.algorithm));
        snapshot.sequence = get_sequence(body)?;
        snapshot.waits = body.try_get_u64_le()?;
        snapshot.waiting_on_since = body.try_get_u64_le()?;
        snapshot.stalled_since = body.try_get_u64_le()?;
    }
    if flags & BLOCKED != 0 {
        snapshot.blocked_on = Some(body.try_get_u32_le()? as usize);
    }
    if flags & COUNTED != 0 {
        snapshot.counts = Some(PairCounts {
            peer: body.try_get_u32_le()? as usize,
            collectives: body.try_get_u64_le()?,
            sent: body.try_get_u64_le()?,
            received: body.try_get_u64_le()?,
        });
    }
    Ok(snapshot)
}

impl ControlMessage {
    /// Appends the encoded message to `out`.
    ///
    /// ```
    /// use ringccl_collectives::control::ControlMessage;
    ///
    /// let mut bytes = Vec::new();
    /// let notice = ControlMessage::Abort {
    ///     origin: 2,
    ///     reason: "op #17 timed out".into(),
    ///     cause: Some(0),
    /// };
    /// notice.encode_into(&mut bytes);
    /// assert_eq!(ControlMessage::decode(&bytes), Ok(Some((notice, bytes.len()))));
    /// ```
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u32_le(0); // length, patched below
        match self {
            ControlMessage::Abort {
                origin,
                reason,
                cause,
            } => {
                match cause {
                    None => {
                        out.put_u8(ABORT);
                        out.put_u32_le(rank_u32(*origin));
                    }
                    Some(cause) => {
                        out.put_u8(ABORT_CAUSED);
                        out.put_u32_le(rank_u32(*origin));
                        out.put_u32_le(rank_u32(*cause));
                    }
                }
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                out.put_slice(&reason.as_bytes()[..end]);
            }
            ControlMessage::Ask { nonce, snapshot } => {
                out.put_u8(ASK);
                out.put_u32_le(*nonce);
                put_snapshot(out, snapshot);
            }
            ControlMessage::Status { nonce, snapshot } => {
                out.put_u8(STATUS);
                out.put_u32_le(*nonce);
                put_snapshot(out, snapshot);
            }
            ControlMessage::Leaving => out.put_u8(LEAVING),
            ControlMessage::Fingerprint { op } => {
                out.put_u8(FINGERPRINT);
                out.put_slice(
                    &FrameHeader {
                        op: *op,
                        algorithm: Algorithm::Device,
                        payload_len: 0,
                    }
                    .encode(),
                );
            }
        }
        let body = (out.len() - start - PREFIX) as u32;
        out[start..start + 4].copy_from_slice(&body.to_le_bytes());
    }

    /// Decodes the first message of `bytes`: `Ok(None)` if it has not fully arrived yet,
    /// else the message and how many bytes it took.
    pub fn decode(bytes: &[u8]) -> Result<Option<(ControlMessage, usize)>, ControlError> {
        let mut r = bytes;
        let Ok(len) = r.try_get_u32_le() else {
            return Ok(None);
        };
        if len as usize > MAX_CONTROL_BODY {
            return Err(ControlError::TooLong(len));
        }
        let Ok(kind) = r.try_get_u8() else {
            return Ok(None);
        };
        let len = len as usize;
        if r.len() < len {
            return Ok(None);
        }
        let mut body = &r[..len];
        let message = match kind {
            ABORT => ControlMessage::Abort {
                origin: body.try_get_u32_le()? as usize,
                reason: String::from_utf8_lossy(body).into_owned(),
                cause: None,
            },
            ABORT_CAUSED => {
                let origin = body.try_get_u32_le()? as usize;
                let cause = body.try_get_u32_le()? as usize;
                ControlMessage::Abort {
                    origin,
                    reason: String::from_utf8_lossy(body).into_owned(),
                    cause: Some(cause),
                }
            }
            ASK | STATUS => {
                let nonce = body.try_get_u32_le()?;
                let snapshot = get_snapshot(&mut body)?;
                if !body.is_empty() {
                    return Err(ControlError::Body(format!(
                        "{} bytes after the snapshot",
                        body.len()
                    )));
                }
                if kind == ASK {
                    ControlMessage::Ask { nonce, snapshot }
                } else {
                    ControlMessage::Status { nonce, snapshot }
                }
            }
            LEAVING if body.is_empty() => ControlMessage::Leaving,
            LEAVING => return Err(ControlError::Body("a Leaving message has no body".into())),
            FINGERPRINT => {
                let raw: [u8; FRAME_HEADER_LEN] = body.try_into().map_err(|_| {
                    ControlError::Body(format!("a fingerprint of {} bytes", body.len()))
                })?;
                ControlMessage::Fingerprint {
                    op: FrameHeader::decode(&raw)?.op,
                }
            }
            other => return Err(ControlError::Kind(other)),
        };
        Ok(Some((message, PREFIX + len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, ReduceOp};

    fn all_kinds() -> Vec<ControlMessage> {
        let busy = Snapshot {
            current: Some((
                OpDesc::all_reduce(17, DType::F32, 1024, ReduceOp::Sum),
                Algorithm::Ring,
            )),
            blocked_on: Some(3),
            sequence: Some(Sequence::Collective),
            waits: 12,
            waiting_on_since: 4,
            stalled_since: 9,
            counts: Some(PairCounts {
                peer: 3,
                collectives: 17,
                sent: 2,
                received: u64::MAX,
            }),
        };
        let receiving = Snapshot {
            current: Some((OpDesc::send_recv(3, DType::U8, 5, 42), Algorithm::Direct)),
            sequence: Some(Sequence::ReceivedFrom(1)),
            ..busy
        };
        vec![
            ControlMessage::Abort {
                origin: 2,
                reason: "op #17 all_reduce timed out".into(),
                cause: None,
            },
            ControlMessage::Abort {
                origin: 0,
                reason: "op #17 all_reduce timed out waiting for rank 1".into(),
                cause: Some(3),
            },
            ControlMessage::Ask {
                nonce: 7,
                snapshot: busy,
            },
            ControlMessage::Status {
                nonce: 7,
                snapshot: Snapshot::default(),
            },
            ControlMessage::Status {
                nonce: u32::MAX,
                snapshot: Snapshot {
                    blocked_on: None,
                    counts: None,
                    ..busy
                },
            },
            ControlMessage::Ask {
                nonce: 8,
                snapshot: receiving,
            },
            ControlMessage::Status {
                nonce: 8,
                snapshot: Snapshot {
                    sequence: Some(Sequence::SentTo(0)),
                    ..receiving
                },
            },
            ControlMessage::Status {
                nonce: 9,
                snapshot: Snapshot {
                    sequence: None,
                    ..receiving
                },
            },
            ControlMessage::Status {
                nonce: 10,
                snapshot: Snapshot {
                    counts: busy.counts,
                    ..Snapshot::default()
                },
            },
            ControlMessage::Leaving,
            ControlMessage::Fingerprint {
                op: OpDesc::broadcast(9, DType::BF16, 77, 1),
            },
        ]
    }

    /// The encoding of a `Status` whose snapshot is `snapshot` (flags first).
    fn status_bytes(snapshot: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.put_u32_le(4 + snapshot.len() as u32);
        bytes.put_u8(STATUS);
        bytes.put_u32_le(1);
        bytes.put_slice(snapshot);
        bytes
    }

    #[test]
    fn the_snapshot_layout_is_as_documented() {
        let snapshot = Snapshot {
            current: Some((OpDesc::send_recv(3, DType::F32, 8, 0), Algorithm::Direct)),
            blocked_on: Some(1),
            sequence: Some(Sequence::SentTo(1)),
            waits: 5,
            waiting_on_since: 2,
            stalled_since: 3,
            counts: Some(PairCounts {
                peer: 1,
                collectives: 7,
                sent: 3,
                received: 0,
            }),
        };
        let mut bytes = Vec::new();
        ControlMessage::Status { nonce: 1, snapshot }.encode_into(&mut bytes);
        let body = &bytes[PREFIX + 4..];
        assert_eq!(body[0], RUNNING | BLOCKED | COUNTED);
        let running = &body[1 + FRAME_HEADER_LEN..];
        assert_eq!(running[0], NUMBERED_SENT_TO);
        assert_eq!(running[1..5], 1u32.to_le_bytes());
        assert_eq!(running[5..13], 5u64.to_le_bytes());
        assert_eq!(running[13..21], 2u64.to_le_bytes());
        assert_eq!(running[21..29], 3u64.to_le_bytes());
        assert_eq!(running[29..33], 1u32.to_le_bytes(), "blocked on");
        let counts = &running[33..];
        assert_eq!(counts.len(), 4 + 3 * 8);
        assert_eq!(counts[4..12], 7u64.to_le_bytes());
        assert_eq!(status_bytes(body), bytes);
    }

    #[test]
    fn malformed_snapshots_are_refused() {
        let mut running = vec![RUNNING];
        running.extend_from_slice(
            &FrameHeader {
                op: OpDesc::barrier(1),
                algorithm: Algorithm::Dissemination,
                payload_len: 0,
            }
            .encode(),
        );
        let with_numbering = |code: u8, peer: u32| {
            let mut body = running.clone();
            body.put_u8(code);
            body.put_u32_le(peer);
            body.put_slice(&[0u8; 24]);
            status_bytes(&body)
        };
        assert!(ControlMessage::decode(&with_numbering(NUMBERED_BY_GROUP, NO_PEER)).is_ok());
        for (code, peer) in [(4, NO_PEER), (NUMBERED_BY_GROUP, 0), (NUMBERED_UNKNOWN, 2)] {
            assert!(
                matches!(
                    ControlMessage::decode(&with_numbering(code, peer)),
                    Err(ControlError::Body(_))
                ),
                "code {code}, peer {peer}"
            );
        }
        // Layout 1 (a header and nothing after it) is cut short under layout 2.
        assert!(ControlMessage::decode(&status_bytes(&running)).is_err());
        // Counts announced but missing; an unknown flag.
        assert!(ControlMessage::decode(&status_bytes(&[COUNTED, 1, 0, 0, 0])).is_err());
        assert_eq!(
            ControlMessage::decode(&status_bytes(&[8])),
            Err(ControlError::Body("unknown flags 0x08".into()))
        );
    }

    /// An abort without a cause is encoded as before the cause existed (kind 1); one with
    /// a cause is kind 6, the cause after the origin.
    #[test]
    fn the_abort_layouts_are_as_documented() {
        let mut bytes = Vec::new();
        ControlMessage::Abort {
            origin: 3,
            reason: "why".into(),
            cause: None,
        }
        .encode_into(&mut bytes);
        assert_eq!(bytes, [7, 0, 0, 0, ABORT, 3, 0, 0, 0, b'w', b'h', b'y']);
        let mut bytes = Vec::new();
        ControlMessage::Abort {
            origin: 3,
            reason: "why".into(),
            cause: Some(2),
        }
        .encode_into(&mut bytes);
        assert_eq!(
            bytes,
            [
                11,
                0,
                0,
                0,
                ABORT_CAUSED,
                3,
                0,
                0,
                0,
                2,
                0,
                0,
                0,
                b'w',
                b'h',
                b'y'
            ]
        );
        // Cut short before the cause: refused, not read as a reason.
        assert!(ControlMessage::decode(&[6, 0, 0, 0, ABORT_CAUSED, 3, 0, 0, 0, 2, 0]).is_err());
    }

    #[test]
    fn every_kind_round_trips_and_streams_split_anywhere() {
        let mut stream = Vec::new();
        for m in all_kinds() {
            m.encode_into(&mut stream);
        }
        // Fed byte by byte, the decoder never claims a message early.
        let mut decoded = Vec::new();
        let mut buffered = Vec::new();
        for &b in &stream {
            buffered.push(b);
            while let Some((m, used)) = ControlMessage::decode(&buffered).unwrap() {
                decoded.push(m);
                buffered.drain(..used);
            }
        }
        assert!(buffered.is_empty());
        assert_eq!(decoded, all_kinds());
    }

    #[test]
    fn long_reasons_are_cut_at_a_character_boundary() {
        let reason = "é".repeat(MAX_REASON);
        let mut bytes = Vec::new();
        ControlMessage::Abort {
            origin: 1,
            reason,
            cause: Some(2),
        }
        .encode_into(&mut bytes);
        let (m, _) = ControlMessage::decode(&bytes).unwrap().unwrap();
        let ControlMessage::Abort { reason, .. } = m else {
            panic!("not an abort: {m:?}")
        };
        assert!(reason.len() <= MAX_REASON && reason.chars().all(|c| c == 'é'));
    }

    #[test]
    fn hostile_bytes_are_refused_without_panicking() {
        assert_eq!(
            ControlMessage::decode(&[0xff, 0xff, 0xff, 0xff, 1]),
            Err(ControlError::TooLong(u32::MAX))
        );
        assert_eq!(
            ControlMessage::decode(&[0, 0, 0, 0, 99]),
            Err(ControlError::Kind(99))
        );
        assert!(ControlMessage::decode(&[1, 0, 0, 0, STATUS, 0]).is_err());
        assert!(ControlMessage::decode(&[2, 0, 0, 0, LEAVING, 0, 0]).is_err());
        // Random bytes: any answer but a panic; an accepted question or answer is
        // canonical (it encodes back to the same bytes).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let valid_header = FrameHeader {
            op: OpDesc::send_recv(3, DType::F32, 8, 0),
            algorithm: Algorithm::Direct,
            payload_len: 0,
        }
        .encode();
        for i in 0..20_000 {
            let mut bytes = [0u8; 128];
            for b in &mut bytes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            bytes[0] %= 128;
            (bytes[1], bytes[2], bytes[3]) = (0, 0, 0);
            bytes[4] = 1 + bytes[4] % 6;
            if i % 2 == 0 {
                // Half of them get a valid op, so the blocks after it are exercised too.
                bytes[4] = STATUS;
                bytes[9] &= RUNNING | BLOCKED | COUNTED | 8;
                bytes[10..10 + FRAME_HEADER_LEN].copy_from_slice(&valid_header);
                bytes[42] %= 5;
            }
            if let Ok(Some((message, used))) = ControlMessage::decode(&bytes) {
                if matches!(message, ControlMessage::Status { .. }) {
                    let mut again = Vec::new();
                    message.encode_into(&mut again);
                    assert_eq!(again, bytes[..used], "{message:?}");
                }
            }
        }
    }
}
