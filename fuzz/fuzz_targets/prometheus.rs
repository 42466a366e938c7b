//! Fuzz target `prometheus`: see tests/support/fuzz_props.rs (`prometheus`).
#![no_main]

#[path = "../../tests/support/fuzz_props.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::prometheus(data));
