//! proxy-wasm adapter (placeholder, being written).
