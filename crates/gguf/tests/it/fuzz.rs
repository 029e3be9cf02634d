use crate::common;
use common::*;
use engram_gguf::*;
use proptest::prelude::*;

fn check(bytes: &[u8]) {
    // Must return (Ok or Err) without panicking; when Ok, the invariants hold.
    if let Ok(g) = Gguf::parse(bytes) {
        for t in &g.tensors {
            let end = g.data_offset + t.offset + t.n_bytes;
            assert!(end <= bytes.len() as u64);
            assert_eq!(t.offset % g.alignment, 0);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn bit_flips_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..8)) {
        let mut bytes = sample_bytes();
        for (i, bit) in flips {
            let i = i.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        check(&bytes);
    }

    #[test]
    fn byte_overwrites_and_truncation_never_panic(
        writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = sample_bytes();
        for (i, b) in writes {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        let cut = cut.index(bytes.len() + 1);
        check(&bytes[..cut]);
    }

    #[test]
    fn header_only_garbage_never_panics(tail in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = Raw::header(3, 2, 3).0;
        bytes.extend_from_slice(&tail);
        check(&bytes);
    }
}
