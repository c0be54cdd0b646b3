//! The NBD handshake parsers: client flags, option headers, INFO/GO bodies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nacre_nbd::proto::{parse_client_flags, parse_go, parse_option_header, OPTION_MAX_BYTES};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 4 {
        let _ = parse_client_flags(data[..4].try_into().unwrap());
    }
    if data.len() >= 16 {
        if let Ok(h) = parse_option_header(data[..16].try_into().unwrap()) {
            assert!(h.len <= OPTION_MAX_BYTES);
        }
    }
    if let Ok(go) = parse_go(data) {
        assert!(go.name.len() + 2 * go.infos.len() + 6 <= data.len());
    }
});
