//! The control messages ranks exchange on their control connections, and their encoding.
//! Pure encode/decode: no I/O.
//!
//! Each message is `[u32 body length, little-endian][u8 kind][body]`:
//!
//! | kind | message   | body                                                      |
//! |------|-----------|-----------------------------------------------------------|
//! | 1    | `Abort`   | u32 origin rank, reason (UTF-8, at most 2 KiB)            |
//! | 2    | `Ask`     | u32 nonce, snapshot                                       |
//! | 3    | `Status`  | u32 nonce, snapshot                                       |
//! | 4    | `Leaving` | nothing                                                   |
//! | 5    | `Fingerprint` | the op, as a 32-byte frame header (payload length zero) |
//!
//! A snapshot is a flags byte (bit 0: an op is running, bit 1: it is blocked), then the
//! running op as a 32-byte frame header (payload length zero) if bit 0, then the u32 rank
//! it is blocked on if bit 1.

use std::fmt;

use bytes::{Buf, BufMut};

use super::Snapshot;
use crate::wire::{Algorithm, FrameHeader, WireError, FRAME_HEADER_LEN};
use crate::OpDesc;

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

const RUNNING: u8 = 1;
const BLOCKED: u8 = 2;

/// One control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlMessage {
    /// Rank `origin` aborted the group, for `reason`. Receivers fail every pending and
    /// later call, naming `origin` and `reason`, and pass the notice on.
    Abort {
        /// The rank that aborted.
        origin: usize,
        /// Why, in words.
        reason: String,
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
    }
    if let Some(peer) = snapshot.blocked_on {
        out.put_u32_le(rank_u32(peer));
    }
}

fn get_snapshot(body: &mut &[u8]) -> Result<Snapshot, ControlError> {
    let flags = body.try_get_u8()?;
    if flags & !(RUNNING | BLOCKED) != 0 {
        return Err(ControlError::Body(format!("unknown flags {flags:#04x}")));
    }
    let current = if flags & RUNNING != 0 {
        let mut raw = [0u8; FRAME_HEADER_LEN];
        body.try_copy_to_slice(&mut raw)?;
        let header = FrameHeader::decode(&raw)?;
        Some((header.op, header.algorithm))
    } else {
        None
    };
    let blocked_on = if flags & BLOCKED != 0 {
        Some(body.try_get_u32_le()? as usize)
    } else {
        None
    };
    Ok(Snapshot {
        current,
        blocked_on,
    })
}

impl ControlMessage {
    /// Appends the encoded message to `out`.
    ///
    /// ```
    /// use ringccl_collectives::control::ControlMessage;
    ///
    /// let mut bytes = Vec::new();
    /// let notice = ControlMessage::Abort { origin: 2, reason: "op #17 timed out".into() };
    /// notice.encode_into(&mut bytes);
    /// assert_eq!(ControlMessage::decode(&bytes), Ok(Some((notice, bytes.len()))));
    /// ```
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u32_le(0); // length, patched below
        match self {
            ControlMessage::Abort { origin, reason } => {
                out.put_u8(ABORT);
                out.put_u32_le(rank_u32(*origin));
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
            },
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
    use crate::wire::Algorithm;
    use crate::{DType, OpDesc, ReduceOp};

    fn all_kinds() -> Vec<ControlMessage> {
        let busy = Snapshot {
            current: Some((
                OpDesc::all_reduce(17, DType::F32, 1024, ReduceOp::Sum),
                Algorithm::Ring,
            )),
            blocked_on: Some(3),
        };
        vec![
            ControlMessage::Abort {
                origin: 2,
                reason: "op #17 all_reduce timed out".into(),
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
                    current: busy.current,
                    blocked_on: None,
                },
            },
            ControlMessage::Leaving,
            ControlMessage::Fingerprint {
                op: OpDesc::broadcast(9, DType::BF16, 77, 1),
            },
        ]
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
        ControlMessage::Abort { origin: 1, reason }.encode_into(&mut bytes);
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
        // Random bytes: any answer but a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut bytes = [0u8; 48];
            for b in &mut bytes {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            bytes[0] %= 64;
            (bytes[1], bytes[2], bytes[3]) = (0, 0, 0);
            bytes[4] = 1 + bytes[4] % 5;
            let _ = ControlMessage::decode(&bytes);
        }
    }
}
