//! Fuzz target `extract`: see tests/support/fuzz_props.rs (`extract_text`).
#![no_main]

#[path = "../../tests/support/fuzz_props.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::extract_text(data));
