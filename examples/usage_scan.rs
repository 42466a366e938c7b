//! Cost of reading the engine's usage from a response as it passes
//! (`prefix_router::usage::UsageScanner`), natively:
//! `cargo run --release --example usage_scan`.
//!
//! Prints ns per response and per KiB for a non-streaming chat completion with
//! a 16 KiB answer and for a 1,000-event SSE stream (one token per event, the
//! usage in the last chunk), fed chunk by chunk as Envoy hands them over
//! (CPU time of the thread, not wall time).

use std::time::Instant;

use prefix_router::usage::UsageScanner;

#[path = "common/responses.rs"]
mod responses;
use responses::{json, sse};

/// CPU time of this thread, ns (Linux `/proc/thread-self/schedstat`; wall time
/// would count the other processes of a shared machine).
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn bench(name: &str, chunks: &[Vec<u8>], new: fn() -> UsageScanner) {
    let bytes: usize = chunks.iter().map(Vec::len).sum();
    let runs = 2000;
    let mut found = 0;
    let (t, cpu) = (Instant::now(), cpu_ns());
    for _ in 0..runs {
        let mut s = new();
        for c in chunks {
            s.feed(std::hint::black_box(c));
        }
        found += s.usage().cached().unwrap_or(0);
    }
    let cpu = cpu_ns().saturating_sub(cpu);
    let ns = if cpu > 0 {
        cpu as f64
    } else {
        t.elapsed().as_nanos() as f64
    } / runs as f64;
    assert_eq!(found, 3840 * runs as u64);
    println!(
        "{name}: {bytes} bytes in {} chunks: {:.1} µs per response, {:.0} ns per KiB",
        chunks.len(),
        ns / 1000.0,
        ns / (bytes as f64 / 1024.0)
    );
}

fn main() {
    bench("json 16 KiB answer", &json(16 * 1024), UsageScanner::new);
    bench("sse 1000 events, full scan", &sse(1000), UsageScanner::new);
    bench("sse 1000 events, event skip", &sse(1000), UsageScanner::sse);
}
