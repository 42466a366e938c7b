/work/main/scripts/bench/floor/target/wasm32-wasip1/release/deps/equivalent-771a5b5ffa4c2584.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/work/main/scripts/bench/floor/target/wasm32-wasip1/release/deps/libequivalent-771a5b5ffa4c2584.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/work/main/scripts/bench/floor/target/wasm32-wasip1/release/deps/libequivalent-771a5b5ffa4c2584.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs:
