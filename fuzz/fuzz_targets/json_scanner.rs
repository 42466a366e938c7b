//! Fuzz target `json_scanner`: see tests/support/fuzz_props.rs (`json_scanner`).
#![no_main]

#[path = "../../tests/support/fuzz_props.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::json_scanner(data));
