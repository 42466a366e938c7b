//! Dev tools for prefix-router (never part of the .wasm):
//! - `replica-emulator`: a vLLM-like OpenAI-compatible server without a model (prefix cache,
//!   queueing, prefill/decode timing, vLLM metrics), see [`server`].
//! - `prefix-load`: the workload driver for demos and benchmarks, see [`load`].

pub mod body;
pub mod cache;
pub mod client;
pub mod config;
pub mod debuglog;
pub mod driver;
pub mod generate;
pub mod load;
pub mod lora;
pub mod metrics;
pub mod overrides;
pub mod prom;
pub mod prompt;
pub mod responses;
pub mod server;

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, ignoring poisoning (a panicked holder cannot leave these structures invalid
/// in a way that matters more than stopping the server would).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A tokio runtime: current-thread for `threads <= 1` (the default: cheapest on a
/// 2-core machine shared with Envoy), else multi-thread with `threads` workers.
///
/// # Errors
/// The runtime could not be built.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}
