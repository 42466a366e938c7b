//! Fuzz target `config`: see tests/support/fuzz_props.rs (`config`).
#![no_main]

#[path = "../../tests/support/fuzz_props.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::config(data));
