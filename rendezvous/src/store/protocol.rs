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
//! All integers are little-endian. Lengths are checked against [`MAX_KEY_LEN`] and
//! [`MAX_VALUE_LEN`] before anything is allocated, so a stranger cannot make the store
//! allocate memory by sending a large number.

use std::fmt;

/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest value accepted.
pub const MAX_VALUE_LEN: usize = 1 << 20;
/// Version of the store protocol.
pub const STORE_VERSION: u16 = 1;
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
        out[..8].copy_from_slice(&STORE_MAGIC);
        out[8..10].copy_from_slice(&self.version.to_le_bytes());
        out[10] = u8::from(self.authenticated);
        out
    }

    /// Decodes and checks a hello: right magic, same version.
    pub fn decode(bytes: &[u8; HELLO_LEN]) -> Result<Hello, ProtocolError> {
        if bytes[..8] != STORE_MAGIC {
            return Err(ProtocolError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != STORE_VERSION {
            return Err(ProtocolError::Version(version));
        }
        let authenticated = match bytes[10] {
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

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn checked_len(field: &'static str, len: u32, max: usize) -> Result<usize, ProtocolError> {
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
        out[0] = match self.op {
            Op::Set => 1,
            Op::Get => 2,
        };
        out[1..5].copy_from_slice(&(self.key_len as u32).to_le_bytes());
        out[5..9].copy_from_slice(&(self.value_len as u32).to_le_bytes());
        out
    }

    /// Decodes a request header, enforcing the length limits.
    pub fn decode(bytes: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, ProtocolError> {
        let op = match bytes[0] {
            1 => Op::Set,
            2 => Op::Get,
            c => return Err(ProtocolError::BadCode(c)),
        };
        Ok(RequestHeader {
            op,
            key_len: checked_len("key", u32_at(bytes, 1), MAX_KEY_LEN)?,
            value_len: checked_len("value", u32_at(bytes, 5), MAX_VALUE_LEN)?,
        })
    }
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
        out[0] = match self.status {
            Status::Ok => 0,
            Status::NotFound => 1,
            Status::Refused => 2,
        };
        out[1..5].copy_from_slice(&(self.value_len as u32).to_le_bytes());
        out
    }

    /// Decodes a response header, enforcing the length limit.
    pub fn decode(bytes: &[u8; RESPONSE_HEADER_LEN]) -> Result<ResponseHeader, ProtocolError> {
        let status = match bytes[0] {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::Refused,
            c => return Err(ProtocolError::BadCode(c)),
        };
        Ok(ResponseHeader {
            status,
            value_len: checked_len("value", u32_at(bytes, 1), MAX_VALUE_LEN)?,
        })
    }
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
