//! Fuzzing the frame-header decoder: random bytes never panic, anything accepted is
//! canonical (re-encodes to the same bytes), every valid header round-trips, and the
//! regression corpus in `tests/corpus/frame_header/` (`ok-*` accepted, `err-*` refused)
//! is replayed.

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use ringccl_collectives::wire::{FrameHeader, FRAME_HEADER_LEN};

fn decode(bytes: &[u8]) -> Option<Result<FrameHeader, String>> {
    let array: &[u8; FRAME_HEADER_LEN] = bytes.try_into().ok()?;
    Some(FrameHeader::decode(array).map_err(|e| e.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn random_bytes_never_panic_and_accepted_headers_are_canonical(
        bytes in proptest::array::uniform32(any::<u8>())
    ) {
        if let Ok(header) = FrameHeader::decode(&bytes) {
            prop_assert_eq!(header.encode(), bytes);
        }
    }

    #[test]
    fn bytes_behind_a_valid_prefix_never_panic(
        tail in proptest::array::uniform30(any::<u8>())
    ) {
        // Magic and version right, so the decoder looks at every field.
        let mut bytes = [0u8; FRAME_HEADER_LEN];
        bytes[0..2].copy_from_slice(b"RC");
        bytes[2] = ringccl_collectives::wire::WIRE_VERSION;
        bytes[3..].copy_from_slice(&tail[1..]);
        if let Ok(header) = FrameHeader::decode(&bytes) {
            prop_assert_eq!(header.encode(), bytes);
        }
    }

    #[test]
    fn every_valid_header_round_trips(
        kind in 0u8..8, dtype in prop_oneof![0u8..8, Just(0xFF)], op in prop_oneof![0u8..5, Just(0xFF)],
        algorithm in 0u8..6, seq in any::<u64>(), count in any::<u64>(),
        root in any::<u32>(), payload in any::<u32>()
    ) {
        let mut bytes = [0u8; FRAME_HEADER_LEN];
        bytes[0..2].copy_from_slice(b"RC");
        bytes[2] = ringccl_collectives::wire::WIRE_VERSION;
        bytes[3] = kind;
        bytes[4] = dtype;
        bytes[5] = op;
        bytes[6] = algorithm;
        bytes[8..16].copy_from_slice(&seq.to_le_bytes());
        bytes[16..24].copy_from_slice(&count.to_le_bytes());
        bytes[24..28].copy_from_slice(&root.to_le_bytes());
        bytes[28..32].copy_from_slice(&payload.to_le_bytes());
        if let Ok(header) = FrameHeader::decode(&bytes) {
            prop_assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
            prop_assert_eq!(header.payload_len, payload);
            prop_assert_eq!(header.op.seq, seq);
        }
    }
}

#[test]
fn the_regression_corpus_is_replayed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/frame_header");
    let mut seen = 0;
    for entry in fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("corpus entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = fs::read(&path).expect("corpus file");
        let result = decode(&bytes).unwrap_or_else(|| panic!("{name}: not 32 bytes"));
        match name.split('-').next() {
            Some("ok") => assert!(result.is_ok(), "{name}: {result:?}"),
            Some("err") => assert!(result.is_err(), "{name}: accepted {result:?}"),
            _ => panic!("{name}: corpus files are named ok-* or err-*"),
        }
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} corpus files");
}
