//! The blocks_json reader against serde_json: the same verdict, values, spans and class of error
//! on every UTF-8 input (`json_doc::check_against_serde_json`), and never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        contextshift_core::json_doc::check_against_serde_json(text);
    }
});
