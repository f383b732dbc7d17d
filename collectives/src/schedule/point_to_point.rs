//! Point-to-point messages: a whole buffer to or from one peer, chunk by chunk.

use super::{chunks, RecvAction, RecvStep, Schedule, SendStep};

/// Sends `count` elements to `peer`.
pub fn send_to(peer: usize, count: usize, elem_size: usize, max_chunk_bytes: usize) -> Schedule {
    Schedule {
        sends: chunks(0..count, elem_size, max_chunk_bytes)
            .map(|range| SendStep {
                peer,
                range,
                after_recv: None,
            })
            .collect(),
        recvs: Vec::new(),
    }
}

/// Receives `count` elements from `peer`, straight into place.
pub fn recv_from(peer: usize, count: usize, elem_size: usize, max_chunk_bytes: usize) -> Schedule {
    Schedule {
        sends: Vec::new(),
        recvs: chunks(0..count, elem_size, max_chunk_bytes)
            .map(|range| RecvStep {
                peer,
                range,
                action: RecvAction::Store,
                after_send: None,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_and_receiver_agree_on_frames() {
        for count in [0, 1, 1000, 1 << 20] {
            let send = send_to(1, count, 4, 64 * 1024);
            let recv = recv_from(0, count, 4, 64 * 1024);
            let sent: Vec<_> = send.sends.iter().map(|s| s.range.clone()).collect();
            let got: Vec<_> = recv.recvs.iter().map(|r| r.range.clone()).collect();
            assert_eq!(sent, got);
            assert_eq!(sent.iter().map(|r| r.len()).sum::<usize>(), count);
        }
    }
}
