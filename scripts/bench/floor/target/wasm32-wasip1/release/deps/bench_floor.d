/work/main/scripts/bench/floor/target/wasm32-wasip1/release/deps/bench_floor.d: lib.rs

/work/main/scripts/bench/floor/target/wasm32-wasip1/release/deps/bench_floor.wasm: lib.rs

lib.rs:
