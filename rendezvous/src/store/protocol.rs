//! The rendezvous store's wire format. Pure encode/decode; no I/O.
//!
//! A connection starts with a [`Hello`] from the client, answered by the server with its
//! own. Then the client sends requests and the server answers each in turn:
//!
//! ```text
//! request:  op u8 | key_len u32 | value_len u32 | key | value
//! response: status u8 | value_len u32 | value
//! ```
//!
//! Operations: set (1), get (2), set-if-absent (3: answered `Exists` with the value already
//! there, so a key can be claimed once), abort (4: the value is the reason; from then on
//! every request is answered `Aborted` with the first reason, so every waiting rank learns
//! why start-up was abandoned). Statuses: ok (0), not found (1), refused (2), exists (3),
//! aborted (4).
//!
//! All integers are little-endian. Lengths are checked against [`MAX_KEY_LEN`] and
//! [`MAX_VALUE_LEN`] before anything is allocated, so a stranger cannot make the store
//! allocate memory by sending a large number.

use std::fmt;

use bytes::{Buf, BufMut, TryGetError};

/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest value accepted.
pub const MAX_VALUE_LEN: usize = 1 << 20;
/// Version of the store protocol.
pub const STORE_VERSION: u16 = 2;
const STORE_MAGIC: [u8; 8] = *b"RCCLSTOR";

/// Size of an encoded [`Hello`].
pub const HELLO_LEN: usize = 12;
/// Size of a request header.
pub const REQUEST_HEADER_LEN: usize = 9;
/// Size of a response header.
pub const RESPONSE_HEADER_LEN: usize = 5;

/// The first message on a store connection, in both directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version of the sender.
    pub version: u16,
    /// Whether the sender requires the shared-secret challenge–response next.
    pub authenticated: bool,
}

/// Why bytes from the other side were rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// Not a ringccl store peer.
    BadMagic,
    /// Another protocol version.
    Version(u16),
    /// Unknown operation or status code.
    BadCode(u8),
    /// A length above the limit.
    TooLong {
        /// Which field.
        field: &'static str,
        /// The announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// Fewer bytes than the message has. The decoders take whole messages, so this is not
    /// seen in practice; it is an error, not a panic, all the same.
    Truncated {
        /// Bytes the next field needed.
        requested: usize,
        /// Bytes that were left.
        available: usize,
    },
}

impl From<TryGetError> for ProtocolError {
    fn from(e: TryGetError) -> ProtocolError {
        ProtocolError::Truncated {
            requested: e.requested,
            available: e.available,
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::BadMagic => f.write_str("bad magic bytes: not a ringccl store client or server"),
            ProtocolError::Version(v) => write!(
                f,
                "store protocol version {v}, this build speaks {STORE_VERSION}: run the same ringccl version on every rank"
            ),
            ProtocolError::BadCode(c) => write!(f, "unknown code {c}"),
            ProtocolError::TooLong { field, len, max } => {
                write!(f, "{field} of {len} bytes exceeds the limit of {max}")
            }
            ProtocolError::Truncated {
                requested,
                available,
            } => write!(
                f,
                "store message cut short: {available} bytes left where a field needs {requested}"
            ),
        }
    }
}

impl Hello {
    /// This build's hello.
    pub const CURRENT: Hello = Hello {
        version: STORE_VERSION,
        authenticated: false,
    };

    /// This build's hello, announcing whether this side authenticates.
    pub fn current(authenticated: bool) -> Hello {
        Hello {
            authenticated,
            ..Hello::CURRENT
        }
    }

    /// Encodes the hello.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        let mut w = &mut out[..];
        w.put_slice(&STORE_MAGIC);
        w.put_u16_le(self.version);
        w.put_u8(u8::from(self.authenticated));
        w.put_u8(0); // reserved
        debug_assert!(w.is_empty());
        out
    }

    /// Decodes and checks a hello: right magic, same version. The last byte is reserved
    /// and not looked at.
    pub fn decode(bytes: &[u8; HELLO_LEN]) -> Result<Hello, ProtocolError> {
        let mut r = &bytes[..];
        let mut magic = [0u8; STORE_MAGIC.len()];
        r.try_copy_to_slice(&mut magic)?;
        if magic != STORE_MAGIC {
            return Err(ProtocolError::BadMagic);
        }
        let version = r.try_get_u16_le()?;
        if version != STORE_VERSION {
            return Err(ProtocolError::Version(version));
        }
        let authenticated = match r.try_get_u8()? {
            0 => false,
            1 => true,
            other => return Err(ProtocolError::BadCode(other)),
        };
        Ok(Hello {
            version,
            authenticated,
        })
    }
}

/// A request operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Store a value under a key (overwrites).
    Set,
    /// Fetch a key's value.
    Get,
    /// Store a value under a key unless the key exists; then answer `Exists` with the
    /// value already there.
    SetIfAbsent,
    /// Abandon start-up: the value is the reason, and from then on every request is
    /// answered `Aborted` with the first reason given.
    Abort,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Set => 1,
            Op::Get => 2,
            Op::SetIfAbsent => 3,
            Op::Abort => 4,
        }
    }
}

/// The fixed part of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// The operation.
    pub op: Op,
    /// Bytes of key that follow.
    pub key_len: usize,
    /// Bytes of value that follow the key.
    pub value_len: usize,
}

/// Reads a little-endian `u32` length and checks it against `max` before anyone
/// allocates for it.
fn checked_len(r: &mut impl Buf, field: &'static str, max: usize) -> Result<usize, ProtocolError> {
    let len = r.try_get_u32_le()?;
    let len_usize = len as usize;
    if len_usize > max {
        return Err(ProtocolError::TooLong {
            field,
            len: u64::from(len),
            max,
        });
    }
    Ok(len_usize)
}

impl RequestHeader {
    /// Encodes a request header. Lengths must respect the limits.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut out = [0u8; REQUEST_HEADER_LEN];
        let mut w = &mut out[..];
        w.put_u8(self.op.code());
        w.put_u32_le(self.key_len as u32);
        w.put_u32_le(self.value_len as u32);
        debug_assert!(w.is_empty());
        out
    }

    /// Decodes a request header, enforcing the length limits.
    pub fn decode(bytes: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, ProtocolError> {
        let mut r = &bytes[..];
        let op = match r.try_get_u8()? {
            1 => Op::Set,
            2 => Op::Get,
            3 => Op::SetIfAbsent,
            4 => Op::Abort,
            c => return Err(ProtocolError::BadCode(c)),
        };
        Ok(RequestHeader {
            op,
            key_len: checked_len(&mut r, "key", MAX_KEY_LEN)?,
            value_len: checked_len(&mut r, "value", MAX_VALUE_LEN)?,
        })
    }
}

/// A whole request — header, key, value — ready to send in one write. Lengths must
/// respect the limits (the client checks them first).
pub fn encode_request(op: Op, key: &[u8], value: &[u8]) -> Vec<u8> {
    let header = RequestHeader {
        op,
        key_len: key.len(),
        value_len: value.len(),
    };
    let mut out = Vec::with_capacity(REQUEST_HEADER_LEN + key.len() + value.len());
    out.put_slice(&header.encode());
    out.put_slice(key);
    out.put_slice(value);
    out
}

/// The status of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done; for a get, the value follows.
    Ok,
    /// The key does not exist (yet).
    NotFound,
    /// The request was refused; a UTF-8 reason follows.
    Refused,
    /// A set-if-absent found the key already set; its value follows.
    Exists,
    /// Start-up was abandoned; the UTF-8 reason given with the first abort follows.
    Aborted,
}

/// The fixed part of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    /// The status.
    pub status: Status,
    /// Bytes that follow.
    pub value_len: usize,
}

impl ResponseHeader {
    /// Encodes a response header.
    pub fn encode(&self) -> [u8; RESPONSE_HEADER_LEN] {
        let mut out = [0u8; RESPONSE_HEADER_LEN];
        let mut w = &mut out[..];
        w.put_u8(match self.status {
            Status::Ok => 0,
            Status::NotFound => 1,
            Status::Refused => 2,
            Status::Exists => 3,
            Status::Aborted => 4,
        });
        w.put_u32_le(self.value_len as u32);
        debug_assert!(w.is_empty());
        out
    }

    /// Decodes a response header, enforcing the length limit.
    pub fn decode(bytes: &[u8; RESPONSE_HEADER_LEN]) -> Result<ResponseHeader, ProtocolError> {
        let mut r = &bytes[..];
        let status = match r.try_get_u8()? {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::Refused,
            3 => Status::Exists,
            4 => Status::Aborted,
            c => return Err(ProtocolError::BadCode(c)),
        };
        Ok(ResponseHeader {
            status,
            value_len: checked_len(&mut r, "value", MAX_VALUE_LEN)?,
        })
    }
}

/// A whole response — header, then `body` — ready to send in one write.
pub fn encode_response(status: Status, body: &[u8]) -> Vec<u8> {
    let header = ResponseHeader {
        status,
        value_len: body.len(),
    };
    let mut out = Vec::with_capacity(RESPONSE_HEADER_LEN + body.len());
    out.put_slice(&header.encode());
    out.put_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        assert_eq!(Hello::decode(&Hello::CURRENT.encode()), Ok(Hello::CURRENT));
        let req = RequestHeader {
            op: Op::Set,
            key_len: 12,
            value_len: MAX_VALUE_LEN,
        };
        assert_eq!(RequestHeader::decode(&req.encode()), Ok(req));
        let resp = ResponseHeader {
            status: Status::NotFound,
            value_len: 0,
        };
        assert_eq!(ResponseHeader::decode(&resp.encode()), Ok(resp));
    }

    /// The layout in the module doc, pinned byte for byte.
    #[test]
    fn the_layout_is_pinned_byte_for_byte() {
        assert_eq!(&Hello::current(true).encode(), b"RCCLSTOR\x02\x00\x01\x00");
        assert_eq!(
            encode_request(Op::Set, b"k", b"vv"),
            [1, 1, 0, 0, 0, 2, 0, 0, 0, b'k', b'v', b'v']
        );
        assert_eq!(
            encode_request(Op::Get, b"ab", b""),
            [2, 2, 0, 0, 0, 0, 0, 0, 0, b'a', b'b']
        );
        assert_eq!(
            encode_response(Status::Refused, b"no"),
            [2, 2, 0, 0, 0, b'n', b'o']
        );
        assert_eq!(encode_response(Status::NotFound, b""), [1, 0, 0, 0, 0]);
        assert_eq!(
            encode_request(Op::SetIfAbsent, b"k", b"v"),
            [3, 1, 0, 0, 0, 1, 0, 0, 0, b'k', b'v']
        );
        assert_eq!(
            encode_request(Op::Abort, b"", b"why"),
            [4, 0, 0, 0, 0, 3, 0, 0, 0, b'w', b'h', b'y']
        );
        assert_eq!(encode_response(Status::Exists, b"v"), [3, 1, 0, 0, 0, b'v']);
        assert_eq!(encode_response(Status::Aborted, b""), [4, 0, 0, 0, 0]);
    }

    #[test]
    fn hostile_input_is_rejected_before_allocation() {
        let mut hello = Hello::CURRENT.encode();
        hello[8] = 9;
        assert_eq!(Hello::decode(&hello), Err(ProtocolError::Version(9)));
        assert_eq!(Hello::decode(b"GET / HTTP/1"), Err(ProtocolError::BadMagic));
        let mut req = [2u8, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];
        assert!(matches!(
            RequestHeader::decode(&req),
            Err(ProtocolError::TooLong { field: "key", .. })
        ));
        req = [1, 1, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0x7F];
        assert!(matches!(
            RequestHeader::decode(&req),
            Err(ProtocolError::TooLong { field: "value", .. })
        ));
        req[0] = 77;
        assert_eq!(RequestHeader::decode(&req), Err(ProtocolError::BadCode(77)));
        assert!(ResponseHeader::decode(&[0, 0xFF, 0xFF, 0xFF, 0xFF]).is_err());
    }
}
