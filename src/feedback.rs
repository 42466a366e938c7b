//! Self-correction of the prefix index from what the engines delivered.
//!
//! The index ([`crate::index`]) remembers where prefixes were *sent*; the
//! engine's `cached_tokens` ([`crate::usage`]) says what it really had. Two
//! surprises ([`crate::usage::Surprise`]) carry information:
//!
//! - **Expected a hit, got a miss** on replica `r`: the engine no longer held
//!   the prefix whose index entry was last written at time `t` (eviction,
//!   restart, a cache reset). Engines evict least-recently-used blocks first,
//!   so every prefix whose entry on `r` is *older* than `t` is gone too. The
//!   feedback raises `r`'s **eviction horizon** to `t`
//!   ([`Horizons::raise`]); lookups then drop `r` from the holders of any
//!   entry written at or before its horizon ([`Horizons::fresh`]), and a
//!   prefix with no holder left is treated as unknown (cold placement). The
//!   request that revealed the miss re-filled the engine's cache and its entry
//!   was rewritten at routing with the current time, so it stays valid.
//!   After a restart each surprise raises the horizon further: the index
//!   recovers within a few requests instead of waiting for `index_ttl_s`.
//! - **Expected a miss, got a hit**: the prefix was already on the replica
//!   that served the request (another gateway, or a retry that reached
//!   another host than the primary). The caller records the served replica
//!   as a holder ([`crate::index::PrefixIndex::record`]), so the next request
//!   of the prefix goes where the cache is.
//!
//! State: one `u32` per replica (deciseconds on the index clock, 0 = never),
//! `4 × replicas` bytes ([`Horizons::encode`]) — one shared-data key in the
//! filter. Cost: O(holders) per lookup, O(1) per surprise.
//!
//! Invariant: a horizon only moves forward (a stale, delayed report never
//! un-forgets newer evidence), and an entry written after the horizon is
//! never affected.

use crate::index::{Known, MAX_HOLDERS};

/// Per-replica eviction horizons (deciseconds, index clock; 0 = none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Horizons(pub Vec<u32>);

/// `a` is at or before `b` on the wrapping decisecond clock.
fn not_after(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) >= 0
}

impl Horizons {
    /// No horizon for `n` replicas.
    pub fn new(n: usize) -> Horizons {
        Horizons(vec![0; n])
    }

    /// Is an entry written at `time` stale for replica `r`?
    pub fn stale(&self, r: usize, time: u32) -> bool {
        match self.0.get(r) {
            Some(&h) if h != 0 => not_after(time, h),
            _ => false,
        }
    }

    /// `known` without the holders for which its entry is stale (possibly
    /// none: pass this to `record`, which then rewrites the entry for the
    /// chosen replica with the current time).
    pub fn filter(&self, known: Known) -> Known {
        let mut holders = [None; MAX_HOLDERS];
        let mut m = 0;
        for h in known.entry.holders() {
            if !self.stale(h, known.entry.time) {
                holders[m] = u16::try_from(h).ok();
                m += 1;
            }
        }
        let mut k = known;
        k.entry.holders = holders;
        k
    }

    /// [`Horizons::filter`], `None` if no holder is left (what the policy
    /// may treat as known).
    pub fn fresh(&self, known: Known) -> Option<Known> {
        let k = self.filter(known);
        let any = k.entry.holders().next().is_some();
        any.then_some(k)
    }

    /// Replica `r` evicted the prefix whose entry was written at
    /// `entry_time`, found missing by a request routed at `routed_at`: raise
    /// its horizon to `entry_time`, or to just before `routed_at` if the
    /// entry is as new as the request (the request's own record, written at
    /// `routed_at`, must stay valid: the engine re-filled its cache). Never
    /// lowers it. Returns whether it moved.
    pub fn raise(&mut self, r: usize, entry_time: u32, routed_at: u32) -> bool {
        let t = if not_after(routed_at, entry_time) {
            routed_at.wrapping_sub(1)
        } else {
            entry_time
        };
        let t = t.max(1);
        match self.0.get_mut(r) {
            Some(h) if *h == 0 || !not_after(t, *h) => {
                *h = t;
                true
            }
            _ => false,
        }
    }

    /// Little-endian bytes (shared data).
    pub fn encode(&self) -> Vec<u8> {
        self.0.iter().flat_map(|h| h.to_le_bytes()).collect()
    }

    /// From [`Horizons::encode`] bytes, for `n` replicas (missing → 0).
    pub fn decode(b: &[u8], n: usize) -> Horizons {
        let mut v: Vec<u32> = b
            .chunks_exact(4)
            .take(n)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        v.resize(n, 0);
        Horizons(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{decis, Entry, IndexConfig, PrefixIndex, VecStore};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn known(time: u32, holders: [Option<u16>; MAX_HOLDERS]) -> Known {
        Known {
            depth: 4,
            entry: Entry {
                tag: 9,
                time,
                holders,
            },
            age_ms: 0,
        }
    }

    #[test]
    fn horizon_drops_stale_holders_only() {
        let mut h = Horizons::new(4);
        let k = known(100, [Some(2), Some(0), None]);
        assert_eq!(h.fresh(k), Some(k));
        assert!(h.raise(2, 100, 200));
        assert_eq!(
            h.fresh(k).map(|k| k.entry.holders),
            Some([Some(0), None, None])
        );
        assert!(h.raise(0, 150, 200));
        assert_eq!(h.fresh(k), None);
        // Newer entries survive; the horizon never moves back.
        assert!(h.fresh(known(151, [Some(0), None, None])).is_some());
        assert!(!h.raise(0, 120, 200));
        // An entry as new as the request: the horizon stops just before the request.
        assert!(h.raise(1, 300, 300));
        assert!(h.stale(1, 299) && !h.stale(1, 300));
        assert!(h.stale(0, 150) && !h.stale(0, 151) && !h.stale(3, 1));
        // Out of range replicas are ignored.
        assert!(!h.raise(9, 5, 6));
        // Wrapping clock.
        let mut w = Horizons::new(1);
        w.raise(0, u32::MAX - 5, 2);
        assert!(w.stale(0, u32::MAX - 10) && !w.stale(0, 3));
    }

    #[test]
    fn encode_roundtrip() {
        let mut h = Horizons::new(3);
        h.raise(1, 77, 80);
        assert_eq!(Horizons::decode(&h.encode(), 3), h);
        assert_eq!(Horizons::decode(&[1, 0, 0], 2), Horizons::new(2));
        assert_eq!(Horizons::decode(&h.encode(), 5).0, vec![0, 77, 0, 0, 0]);
    }

    #[test]
    fn a_restart_is_forgotten_after_one_surprise_per_older_entry() {
        // Prefixes A (t=10 s) then B (t=20 s) recorded on replica 1, which then restarts.
        let idx = PrefixIndex::new(IndexConfig::default());
        let mut st = VecStore::new(IndexConfig::default().slots);
        let a: Vec<u64> = (1..=8).map(|i| i * 0x1000_0000_0001).collect();
        let b: Vec<u64> = (1..=8).map(|i| i * 0x2000_0000_0003).collect();
        idx.record(&mut st, &a, None, 1, 10_000);
        idx.record(&mut st, &b, None, 1, 20_000);
        let mut h = Horizons::new(3);
        // B is requested first after the restart: predicted hit, delivered miss.
        let kb = idx.lookup(&st, &b, 30_000).unwrap();
        assert!(h.raise(1, kb.entry.time, decis(30_000)));
        // A (older than B) is now unknown: no second surprise needed.
        let ka = idx.lookup(&st, &a, 30_000).unwrap();
        assert_eq!(h.fresh(ka), None);
        // B's own request re-filled the cache and was recorded at 30 s: still known.
        idx.record(&mut st, &b, Some(&kb), 1, 30_000);
        let kb = idx.lookup(&st, &b, 31_000).unwrap();
        assert_eq!(kb.entry.time, decis(30_000));
        assert!(h.fresh(kb).is_some());
    }
}
