//! Fuzz target `peers`: see tests/support/fuzz_props.rs (`peer_batch`).
#![no_main]

#[path = "../../tests/support/fuzz_props.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::peer_batch(data));
