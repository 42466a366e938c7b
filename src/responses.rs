//! Responses API conversations: which replica produced a stored response.
//!
//! vLLM (and the emulator) keep `store: true` responses in the memory of the
//! instance that produced them; a request with `previous_response_id` sent to
//! another instance fails (404). The filter learns `response id → replica`
//! from the response's top-level `id` ([`crate::usage`] reads it as the
//! response passes) and routes a follow-up to that replica.
//!
//! Storage: a direct-mapped table of [`SLOTS`] slots of [`ENTRY_BYTES`] behind
//! [`SlotStore`] (shared data in the filter, like the prefix index): slot
//! `(h >> 32) % SLOTS` of `h = hash(id)`, value `h` (8 bytes) ‖ time
//! (deciseconds, u32) ‖ replica + 1 (u16) ‖ zeros. A write overwrites the slot,
//! so memory is bounded (16 Ki keys); an entry older than [`TTL_S`] or
//! overwritten by another id is not found, and the follow-up is routed like
//! any request. Cost: one get per follow-up, one set per stored response.

use crate::hash::hash_id;
use crate::index::{decis, SlotStore, SlotValue, ENTRY_BYTES};

/// Slots of the table.
pub const SLOTS: u32 = 16_384;
/// Entries older than this are ignored (seconds).
pub const TTL_S: u64 = 3600;

fn hash(id: &str) -> u64 {
    hash_id(id.as_bytes()) | 1
}

fn slot(h: u64) -> u32 {
    ((h >> 32) % u64::from(SLOTS)) as u32
}

/// Remember that `replica` produced response `id`.
pub fn remember<S: SlotStore>(store: &mut S, id: &str, replica: usize, now_ms: u64) {
    let h = hash(id);
    let mut v: SlotValue = [0; ENTRY_BYTES];
    v[..8].copy_from_slice(&h.to_le_bytes());
    v[8..12].copy_from_slice(&decis(now_ms).to_le_bytes());
    let r = u16::try_from(replica.saturating_add(1)).unwrap_or(u16::MAX);
    v[12..14].copy_from_slice(&r.to_le_bytes());
    store.set(slot(h), v);
}

/// The replica that produced response `id`, if remembered and fresh.
pub fn find<S: SlotStore>(store: &S, id: &str, now_ms: u64) -> Option<usize> {
    let h = hash(id);
    let v = store.get(slot(h))?;
    let tag = u64::from_le_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]);
    let time = u32::from_le_bytes([v[8], v[9], v[10], v[11]]);
    let r = u16::from_le_bytes([v[12], v[13]]);
    let age_s = u64::from(decis(now_ms).wrapping_sub(time)) / 10;
    (tag == h && age_s <= TTL_S && r > 0).then(|| usize::from(r - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::VecStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn remembered_until_it_expires_or_is_overwritten() {
        let mut st = VecStore::new(SLOTS);
        assert_eq!(find(&st, "resp_a", 0), None);
        remember(&mut st, "resp_a", 4, 1_000);
        remember(&mut st, "resp_b", 0, 1_000);
        assert_eq!(find(&st, "resp_a", 2_000), Some(4));
        assert_eq!(find(&st, "resp_b", 2_000), Some(0));
        assert_eq!(find(&st, "resp_c", 2_000), None);
        assert_eq!(find(&st, "resp_a", 1_000 + TTL_S * 1000), Some(4));
        assert_eq!(find(&st, "resp_a", 1_000 + (TTL_S + 1) * 1000), None);
        // Another id in the same slot replaces it: never a wrong replica.
        let a = slot(hash("resp_a"));
        let other = (0..100_000)
            .map(|i| format!("resp_{i}"))
            .find(|id| slot(hash(id)) == a && id != "resp_a")
            .unwrap();
        remember(&mut st, &other, 2, 3_000);
        assert_eq!(find(&st, "resp_a", 3_000), None);
        assert_eq!(find(&st, &other, 3_000), Some(2));
        assert!(st.occupied() <= SLOTS as usize);
    }
}
