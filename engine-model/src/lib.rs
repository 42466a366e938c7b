//! One model of a vLLM-like inference engine, driven by time.
//!
//! - [`Params`]: scheduler limits, KV capacity and the step-time cost model
//!   (`f(batch tokens, batch size)`), with a calibrated preset.
//! - [`BlockCache`]: the block-level prefix cache (chained block hashes, LRU eviction of
//!   unreferenced blocks).
//! - [`Engine`]: continuous batching with a token budget per step, chunked prefill, the cache
//!   checked when a request is **scheduled** (not when it arrives), incremental KV allocation
//!   and preemption by recomputation when KV memory runs out.
//!
//! The engine knows no clock: the caller passes `now` (seconds, any origin, non-decreasing).
//! The simulator drives it in virtual time (`examples/simulate`), the replica emulator in real
//! time (a task that sleeps until [`Engine::next_event_time`]). No I/O, no async, no
//! allocation per step beyond the events returned.

pub mod cache;
pub mod engine;
pub mod params;

pub use cache::BlockCache;
pub use engine::{Engine, Event, EventKind, Metrics, Request};
pub use params::Params;

/// Hasher for keys that are already uniform 64-bit hashes: passes them through (SipHash on
/// millions of block hashes dominates otherwise).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// `HashMap` keyed by pre-hashed (or unique) u64s.
pub type IdMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;
