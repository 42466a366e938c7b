//! The per-process secret that keys the `affinity` index's slot hash
//! ([`crate::index`], "Keyed placement"): without it a client cannot compute
//! which slot a prefix lives in, so it cannot aim junk at chosen prefixes.
//!
//! Source: proxy-wasm has no random call, but the Wasm host implements WASI
//! `random_get` (proxy-wasm-cpp-host fills it from BoringSSL `RAND_bytes`), and
//! Rust's std draws `RandomState`'s keys from it on `wasm32-wasip1`. That value
//! is mixed with the host time in nanoseconds and the root context id, so
//! even a host whose `random_get` returned nothing useful gives a value that
//! differs at every start and is not known outside the process.
//!
//! Agreement: every worker VM must use the same secret (they share the slot
//! table), so the first root context to configure stores it in shared data
//! under [`KEY`] (one store per process and `vm_id`) and the others read it.
//! Envoy configures the main thread's VM before the workers', so in practice
//! one value is ever written. If two roots raced anyway, each re-reads the
//! key after writing and takes what is stored; the loser of an exact tie
//! would keep its own value and simply not see the others' index entries
//! (lower hit rate, never a wrong route). A config push keeps the secret.

use super::host;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Shared-data key of the secret (8 bytes, little endian).
pub const KEY: &str = "prefix_router/index_secret";

/// A fresh unpredictable value (WASI random, time, context id).
pub(super) fn fresh(context_id: u32) -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(host::now_nanos());
    h.write_u32(context_id);
    h.finish()
}

fn decode(v: Option<&[u8]>) -> Option<u64> {
    v.and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
}

/// The process's secret: the stored one, or a fresh one stored now.
///
/// # Errors
/// A shared-data failure (the caller refuses the configuration).
pub fn get_or_create(context_id: u32) -> Result<u64, host::HostError> {
    let (value, cas) = host::shared_get(KEY)?;
    if let Some(s) = decode(value.as_deref()) {
        return Ok(s);
    }
    let candidate = fresh(context_id);
    // A lost CAS race means someone else stored one: read it below.
    let _ = host::shared_set(KEY, &candidate.to_le_bytes(), cas);
    let (value, _) = host::shared_get(KEY)?;
    Ok(decode(value.as_deref()).unwrap_or(candidate))
}
