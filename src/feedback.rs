//! Self-correction of the prefix index from what the engines delivered.
//!
//! The index ([`crate::index`]) remembers where prefixes were *sent*; the
//! engine's `cached_tokens` ([`crate::usage`]) says what it really had. Two
//! surprises ([`crate::usage::Surprise`]) carry information:
//!
//! - **Expected a hit, got a miss** on replica `r`: the engine no longer held
//!   the prefix whose index entry was last written at time `t` (eviction,
//!   restart, a cache reset). Engines evict least-recently-used blocks first,
//!   so every prefix whose entry on `r` is *older* than `t` is likely gone
//!   too. A second such miss on `r` within [`CORROBORATE_DECIS`] (a lone one
//!   is common under cache pressure and, acted upon, cost hit rate in the
//!   simulator) raises `r`'s **eviction horizon** to the newer `t`
//!   ([`Horizons::raise`]); lookups then drop `r` from the holders of any
//!   entry written at or before its horizon ([`Horizons::fresh`]), and a
//!   prefix with no holder left is treated as unknown (cold placement). The
//!   request that revealed the miss re-filled the engine's cache and its entry
//!   was rewritten at routing with the current time, so it stays valid.
//!   After a restart the second surprise forgets everything older than the
//!   newer of the two, later ones raise the horizon further: the index
//!   recovers within a few requests instead of waiting for `index_ttl_s`.
//! - **Expected a miss, got a hit**: the prefix was already on the replica
//!   that served the request (another gateway, or a retry that reached
//!   another host than the primary). The caller records the served replica
//!   as a holder ([`crate::index::PrefixIndex::record`]), so the next request
//!   of the prefix goes where the cache is.
//!
//! State: three `u32` per replica (horizon, last miss, its entry time;
//! deciseconds on the index clock, 0 = never), `12 × replicas` bytes
//! ([`Horizons::encode`]) — one shared-data key in the filter. Cost: O(holders) per lookup, O(1) per surprise.
//!
//! Invariant: a horizon only moves forward (a stale, delayed report never
//! un-forgets newer evidence), and an entry written after the horizon is
//! never affected.

use crate::index::{Known, MAX_HOLDERS};

/// Two misses on one replica at most this far apart (deciseconds)
/// corroborate each other; a lone miss raises no horizon.
pub const CORROBORATE_DECIS: u32 = 50;

/// Misses in a row on one replica (no delivered hit in between, each within
/// [`CORROBORATE_DECIS`] of the previous) that raise its horizon.
pub const CORROBORATING_MISSES: u32 = 3;

/// Misses in a row on one replica, not yet acted upon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Misses {
    /// Routing time of the last one (deciseconds; 0 = none).
    pub at: u32,
    /// Newest index entry time among them.
    pub entry: u32,
    /// How many.
    pub count: u32,
}

/// Per-replica eviction horizons (deciseconds, index clock; 0 = none) and
/// misses in a row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Horizons(pub Vec<u32>, pub Vec<Misses>);

/// `a` is at or before `b` on the wrapping decisecond clock.
fn not_after(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) >= 0
}

impl Horizons {
    /// No horizon for `n` replicas.
    pub fn new(n: usize) -> Horizons {
        Horizons(vec![0; n], vec![Misses::default(); n])
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
    /// `entry_time`, found missing by a request routed at `routed_at`.
    /// Misses under cache pressure are common and say little about the rest
    /// of the replica's cache (acting on each cost hit rate in the
    /// simulator), so only [`CORROBORATING_MISSES`] in a row, each within
    /// [`CORROBORATE_DECIS`] of the previous and no delivered hit between
    /// them ([`Horizons::hit`]), raise the horizon: to the newest of their
    /// entry times, or to just before the request if that entry is as new as
    /// the request (the request's own record, written when it was routed,
    /// must stay valid: the engine re-filled its cache). Never lowers it.
    /// Returns whether it moved.
    pub fn raise(&mut self, r: usize, entry_time: u32, routed_at: u32) -> bool {
        let Some(m) = self.1.get_mut(r) else {
            return false;
        };
        let follows = m.at != 0
            && not_after(m.at, routed_at)
            && routed_at.wrapping_sub(m.at) <= CORROBORATE_DECIS;
        *m = if follows {
            Misses {
                at: routed_at.max(1),
                entry: if not_after(m.entry, entry_time) {
                    entry_time
                } else {
                    m.entry
                },
                count: m.count.saturating_add(1),
            }
        } else {
            Misses {
                at: routed_at.max(1),
                entry: entry_time,
                count: 1,
            }
        };
        if m.count < CORROBORATING_MISSES {
            return false;
        }
        let newest = m.entry;
        let t = if not_after(routed_at, newest) {
            routed_at.wrapping_sub(1)
        } else {
            newest
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

    /// A predicted hit on replica `r` was delivered: the replica still holds
    /// what the index says, so pending misses were cache pressure, not a
    /// restart — forget them. Returns whether anything changed.
    pub fn hit(&mut self, r: usize) -> bool {
        match self.1.get_mut(r) {
            Some(m) if m.at != 0 => {
                *m = Misses::default();
                true
            }
            _ => false,
        }
    }

    /// Are misses pending on replica `r`?
    pub fn armed(&self, r: usize) -> bool {
        self.1.get(r).is_some_and(|m| m.at != 0)
    }

    /// Little-endian bytes (shared data): per replica the horizon and the
    /// pending misses (16 bytes).
    pub fn encode(&self) -> Vec<u8> {
        self.0
            .iter()
            .zip(&self.1)
            .flat_map(|(h, m)| [*h, m.at, m.entry, m.count])
            .flat_map(u32::to_le_bytes)
            .collect()
    }

    /// From [`Horizons::encode`] bytes, for `n` replicas (missing → 0).
    pub fn decode(b: &[u8], n: usize) -> Horizons {
        let mut h = Horizons::new(n);
        for (i, c) in b.chunks_exact(16).take(n).enumerate() {
            let w = |k: usize| u32::from_le_bytes([c[k], c[k + 1], c[k + 2], c[k + 3]]);
            h.0[i] = w(0);
            h.1[i] = Misses {
                at: w(4),
                entry: w(8),
                count: w(12),
            };
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{decis, pad, Entry, IndexConfig, PrefixIndex, VecStore};
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
            spill: false,
        }
    }

    fn misses(h: &mut Horizons, r: usize, entries: &[u32], at: u32) -> bool {
        let mut moved = false;
        for (k, &e) in entries.iter().enumerate() {
            moved = h.raise(r, e, at.wrapping_add(k as u32));
        }
        moved
    }

    #[test]
    fn horizon_drops_stale_holders_only() {
        let mut h = Horizons::new(4);
        let k = known(100, pad([Some(2), Some(0), None]));
        assert_eq!(h.fresh(k), Some(k));
        // Misses in a row raise to the newest of their entries; fewer only arm.
        assert!(!misses(&mut h, 2, &[100, 90], 200));
        assert!(h.armed(2));
        assert_eq!(h.fresh(k), Some(k));
        assert!(h.raise(2, 80, 202));
        assert_eq!(
            h.fresh(k).map(|k| k.entry.holders),
            Some(pad([Some(0), None, None]))
        );
        assert_eq!(h.filter(k).entry.holders, pad([Some(0), None, None]));
        // A delivered hit in between, or a long pause, starts the count again.
        assert!(!misses(&mut h, 0, &[150, 150], 300));
        assert!(h.hit(0) && !h.armed(0) && !h.hit(0));
        assert!(!misses(&mut h, 0, &[150, 150], 310));
        assert!(!h.raise(0, 150, 311 + CORROBORATE_DECIS + 1));
        assert!(misses(&mut h, 0, &[150, 150], 311 + CORROBORATE_DECIS + 2));
        assert_eq!(h.fresh(k), None);
        assert_eq!(h.filter(k).entry.holders, pad([None, None, None]));
        // Newer entries survive; the horizon never moves back.
        assert!(h.fresh(known(151, pad([Some(0), None, None]))).is_some());
        assert!(!misses(&mut h, 0, &[120, 120, 120], 400));
        assert!(h.stale(0, 150) && !h.stale(0, 151) && !h.stale(3, 1));
        // An entry as new as the request: the horizon stops just before the request.
        assert!(misses(&mut h, 1, &[500, 500, 502], 500));
        assert!(h.stale(1, 501) && !h.stale(1, 502));
        // Out of range replicas are ignored.
        assert!(!misses(&mut h, 9, &[5, 5, 5], 6));
        // Wrapping clock.
        let mut w = Horizons::new(1);
        assert!(misses(&mut w, 0, &[u32::MAX - 5, u32::MAX - 4, 1], 3));
        assert!(w.stale(0, u32::MAX - 10) && w.stale(0, 1) && !w.stale(0, 2));
    }

    #[test]
    fn encode_roundtrip() {
        let mut h = Horizons::new(3);
        misses(&mut h, 1, &[77, 70, 60], 80);
        h.raise(2, 5, 9);
        assert_eq!(Horizons::decode(&h.encode(), 3), h);
        assert_eq!(Horizons::decode(&[1, 0, 0], 2), Horizons::new(2));
        assert_eq!(Horizons::decode(&h.encode(), 5).0, vec![0, 77, 0, 0, 0]);
    }

    #[test]
    fn a_restart_is_forgotten_after_three_surprises() {
        // Prefixes 0..6 recorded on replica 1 at 10, 11, … 15 s; it then restarts.
        let idx = PrefixIndex::new(IndexConfig::default());
        let mut st = VecStore::new(IndexConfig::default().slots);
        let chains: Vec<Vec<u64>> = (1..=6u64)
            .map(|m| (1..=8).map(|i| i * (m << 40 | 0x1_0001)).collect())
            .collect();
        for (k, c) in chains.iter().enumerate() {
            idx.record(&mut st, c, None, 1, 10_000 + 1000 * k as u64);
        }
        let mut h = Horizons::new(3);
        // Prefixes 5, 0, 1 are requested after the restart: predicted hits, delivered misses.
        let mut now = 30_000;
        for (k, raised) in [(5, false), (0, false), (1, true)] {
            let known = idx.lookup(&st, &chains[k], now).unwrap();
            assert_eq!(h.raise(1, known.entry.time, decis(now)), raised);
            idx.record(&mut st, &chains[k], Some(&known), 1, now);
            now += 300;
        }
        // Prefixes 2, 3, 4 (older than 5) are now unknown: no further surprise.
        for c in &chains[2..5] {
            assert_eq!(h.fresh(idx.lookup(&st, c, now).unwrap()), None);
        }
        // The re-filled ones were recorded after the restart: still known.
        for k in [5, 0, 1] {
            assert!(h.fresh(idx.lookup(&st, &chains[k], now).unwrap()).is_some());
        }
    }
}
