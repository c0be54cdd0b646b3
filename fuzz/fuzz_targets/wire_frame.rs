//! The wire frame parser: any bytes either decode to a header that
//! re-encodes to the same bytes (and whose payload check is safe to run),
//! or fail cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nacre_wire::{Header, HEADER_BYTES, PAYLOAD_MAX_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        assert!(h.payload_len <= PAYLOAD_MAX_BYTES);
        let mut out = [0u8; HEADER_BYTES];
        h.encode(&mut out);
        assert_eq!(&out[..], &data[..HEADER_BYTES]);
        let _ = h.check_payload(&data[HEADER_BYTES..]);
    }
});
