//! The NBD transmission request parser and URI parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nacre_nbd::proto::{encode_request, parse_request, parse_uri, REQUEST_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    if data.len() >= REQUEST_HEADER_BYTES {
        if let Ok(r) = parse_request(&data[..REQUEST_HEADER_BYTES]) {
            assert_eq!(&encode_request(&r)[..], &data[..REQUEST_HEADER_BYTES]);
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse_uri(s);
    }
});
