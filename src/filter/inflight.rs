//! Per-endpoint in-flight counts in proxy-wasm shared data, shared by every
//! worker VM of the same `vm_id`.
//!
//! Layout: one key per plugin configuration,
//! `prefix_router/<plugin name>/<config fingerprint>/inflight`, whose value is
//! `N` little-endian `u32` counts in endpoint order (the config's sorted
//! endpoints). The fingerprint keeps counts of an old configuration (still
//! draining on old VMs) apart from the new one.
//!
//! Updates are compare-and-swap loops (bounded: [`MAX_CAS_ATTEMPTS`]); a count
//! never goes below zero. One read costs one `get` (≈0.8 µs); an update one
//! `get` + one `set` per attempt (≈1 µs uncontended).
//!
//! The key is created (all zeros) by the first root context that finds it
//! missing, before any request is served: CAS on a missing key cannot detect a
//! race, so it must exist before workers race on it.

use super::host::{self, HostError, CAS_MISMATCH};

/// Upper bound on CAS retries of one update.
pub const MAX_CAS_ATTEMPTS: usize = 64;

/// Handle on the shared in-flight array.
pub struct InFlight {
    key: String,
    n: usize,
}

/// Decode `n` counts; a value of the wrong length reads as zeros.
fn decode(bytes: Option<&[u8]>, n: usize) -> Vec<u32> {
    match bytes {
        Some(b) if b.len() == n * 4 => b
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => vec![0; n],
    }
}

fn encode(counts: &[u32]) -> Vec<u8> {
    counts.iter().flat_map(|c| c.to_le_bytes()).collect()
}

impl InFlight {
    /// Handle for `n` endpoints under `prefix`.
    pub fn new(prefix: &str, n: usize) -> InFlight {
        InFlight {
            key: format!("{prefix}inflight"),
            n,
        }
    }

    /// Create the key with zeros if it is missing or malformed.
    pub fn init(&self) -> Result<(), HostError> {
        let (value, cas) = host::shared_get(&self.key)?;
        match value {
            Some(v) if v.len() == self.n * 4 => Ok(()),
            _ => host::shared_set(&self.key, &encode(&vec![0; self.n]), cas),
        }
    }

    /// Current counts and the CAS token they were read at.
    pub fn read(&self) -> Result<(Vec<u32>, u32), HostError> {
        let (value, cas) = host::shared_get(&self.key)?;
        Ok((decode(value.as_deref(), self.n), cas))
    }

    /// Add `delta` to endpoint `idx` (saturating at 0); `seen` is a previous
    /// read to try first. Returns the new count of `idx`.
    pub fn add(
        &self,
        idx: usize,
        delta: i32,
        mut seen: Option<(Vec<u32>, u32)>,
    ) -> Result<u32, HostError> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (mut counts, cas) = match seen.take() {
                Some(s) => s,
                None => self.read()?,
            };
            let Some(c) = counts.get_mut(idx) else {
                return Ok(0);
            };
            *c = c.saturating_add_signed(delta);
            let now = *c;
            match host::shared_set(&self.key, &encode(&counts), cas) {
                Ok(()) => return Ok(now),
                Err(e) if e == CAS_MISMATCH => continue,
                Err(e) => return Err(e),
            }
        }
        Err(CAS_MISMATCH)
    }
}
