/work/main/scripts/bench/floor/target/wasm32-wasip1/release/bench_floor.wasm: /work/main/scripts/bench/floor/lib.rs
