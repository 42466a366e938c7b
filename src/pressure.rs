//! Cache pressure: how many new prefixes each replica was given recently.
//!
//! Cold placement ([`crate::affinity`]) takes the least loaded of the
//! request's ring candidates. When loads tie (an idle cluster, sequential
//! clients, a light load) the ring alone decides, and a handful of new
//! prefixes can land very unevenly (8 prefix groups over 3 replicas fell
//! 0 / 2 / 6 on llama.cpp, where each replica holds only 3 prompts): the
//! replica given 6 thrashes while another holds nothing. This module counts,
//! per replica, the prefixes it was given that it did not already hold (a
//! cold placement or a spill), so that placement can break load ties towards
//! the replica with the fewest: new prefixes spread over the caches.
//!
//! Storage: the counters live in the index's [`SlotStore`] (shared data in
//! the filter, so every worker of one Envoy sees them), in reserved slots
//! numbered down from `u32::MAX`, which block entries never use (their slots
//! are below [`crate::index::IndexConfig::slots`]). One slot holds the u8
//! counters of [`PER_SLOT`] (10) replicas after 6 zero bytes: a zero tag, so
//! [`crate::index::Entry::decode`] never reads it as an entry and stores
//! that translate entries' holders (the filter's address-id view) pass it
//! through untouched. Reading all counters costs `⌈n / 10⌉` gets (1 for up
//! to 10 replicas), a bump one get and one set. When a counter would pass
//! 255, every counter is halved (`⌈n / 10⌉` more gets and sets): the counts
//! are an exponentially fading memory of the last few hundred placements,
//! which is all a tie-break needs.
//!
//! Approximation: workers bump without a lock, so a concurrent bump can be
//! lost; the counters only break ties, a lost count shifts one tie.
//!
//! Invariant: never reads or writes a slot below `u32::MAX − ⌈MAX_REPLICAS /
//! 10⌉`, and only for replicas `< MAX_REPLICAS`; the first 6 bytes of every
//! value it writes are 0.

use crate::affinity::{warm_coverage, AffinityConfig};
use crate::index::{Known, SlotStore, SlotValue, ENTRY_BYTES};
use crate::router::RoutingKey;

/// Zero bytes before the counters (an entry's tag: 0 = not an entry).
pub const SKIP: usize = 6;
/// Counters per slot (the slot's bytes past `SKIP + PER_SLOT` stay 0).
pub const PER_SLOT: usize = 10;
const _: () = assert!(SKIP + PER_SLOT <= ENTRY_BYTES);
/// Replicas tracked; placement ignores pressure beyond.
pub const MAX_REPLICAS: usize = 256;

/// Per-replica counts of recently placed new prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    counts: [u8; MAX_REPLICAS],
}

impl Default for Pressure {
    fn default() -> Self {
        Pressure {
            counts: [0; MAX_REPLICAS],
        }
    }
}

/// The top slot of the pressure table (its groups go down from here).
const TOP: u32 = u32::MAX;
/// Slots one counter table takes for [`MAX_REPLICAS`] replicas.
pub const TABLE_SLOTS: u32 = MAX_REPLICAS.div_ceil(PER_SLOT) as u32;

fn slot_of(top: u32, group: usize) -> u32 {
    top - group as u32
}

fn groups(n: usize) -> usize {
    n.min(MAX_REPLICAS).div_ceil(PER_SLOT)
}

impl Pressure {
    /// Read the counters of replicas `0..n` (`⌈n / 10⌉` gets).
    pub fn read<S: SlotStore>(store: &S, n: usize) -> Pressure {
        Pressure::read_at(store, n, TOP)
    }

    /// [`Pressure::read`] of the same layout in the table whose groups go
    /// down from slot `top` ([`crate::share`] keeps its counts so).
    pub fn read_at<S: SlotStore>(store: &S, n: usize, top: u32) -> Pressure {
        let mut p = Pressure::default();
        for g in 0..groups(n) {
            if let Some(v) = store.get(slot_of(top, g)) {
                let lo = g * PER_SLOT;
                let own = p.counts.iter_mut().skip(lo).take(PER_SLOT);
                for (c, &x) in own.zip(&v[SKIP..]) {
                    *c = x;
                }
            }
        }
        p
    }

    /// The counters of `n` replicas for a request that `known` does not make
    /// warm ([`warm_coverage`]): only cold placement uses them. `None` (no
    /// get) for a warm or keyless request, or with `spread_cold` off.
    /// Shared-data cost: `⌈n / 10⌉` gets per cold request.
    pub fn for_request<S: SlotStore>(
        store: &S,
        n: usize,
        key: &RoutingKey,
        known: Option<&Known>,
        cfg: &AffinityConfig,
    ) -> Option<Pressure> {
        let cold = cfg.spread_cold && key.key.is_some() && warm_coverage(key, known, cfg).is_none();
        cold.then(|| Pressure::read(store, n))
    }

    /// `served` was given the prefix `known` was looked up for (called with
    /// the index record): if it was not one of its holders (cold placement,
    /// spill), count a new prefix for it ([`Pressure::bump`]). Nothing with
    /// `spread_cold` off.
    pub fn note<S: SlotStore>(
        store: &mut S,
        n: usize,
        known: Option<&Known>,
        served: usize,
        cfg: &AffinityConfig,
    ) {
        let holder = known.is_some_and(|k| k.entry.holders().any(|h| h == served));
        if cfg.spread_cold && !holder {
            Pressure::bump(store, served, n);
        }
    }

    /// Counters from values (tests and callers that keep their own).
    pub fn from_counts(counts: &[u8]) -> Pressure {
        let mut p = Pressure::default();
        for (c, &x) in p.counts.iter_mut().zip(counts) {
            *c = x;
        }
        p
    }

    /// Count of replica `r` (0 beyond [`MAX_REPLICAS`]).
    pub fn of(&self, r: usize) -> u8 {
        self.counts.get(r).copied().unwrap_or(0)
    }

    /// Replica `r` of `n` was given a new prefix: add one to its counter,
    /// halving every counter first if it is at 255.
    pub fn bump<S: SlotStore>(store: &mut S, r: usize, n: usize) {
        Pressure::bump_at(store, r, n, TOP);
    }

    /// [`Pressure::bump`] in the table whose groups go down from `top`.
    pub fn bump_at<S: SlotStore>(store: &mut S, r: usize, n: usize, top: u32) {
        if r >= MAX_REPLICAS || r >= n {
            return;
        }
        let (g, i) = (r / PER_SLOT, SKIP + r % PER_SLOT);
        let clean = |mut v: SlotValue| {
            v[..SKIP].fill(0);
            v
        };
        let at = |g| slot_of(top, g);
        let mut v: SlotValue = clean(store.get(at(g)).unwrap_or([0; ENTRY_BYTES]));
        if v.get(i) == Some(&u8::MAX) {
            for h in (0..groups(n)).filter(|&h| h != g) {
                if let Some(w) = store.get(at(h)) {
                    let mut w = clean(w);
                    w.iter_mut().for_each(|x| *x /= 2);
                    store.set(at(h), w);
                }
            }
            v.iter_mut().for_each(|x| *x /= 2);
        }
        if let Some(c) = v.get_mut(i) {
            *c = c.saturating_add(1);
        }
        store.set(at(g), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::VecStore;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn counts_accumulate_per_replica_and_fade_together() {
        let mut s = VecStore::new(16);
        let n = 20;
        for _ in 0..3 {
            Pressure::bump(&mut s, 17, n);
        }
        Pressure::bump(&mut s, 2, n);
        let p = Pressure::read(&s, n);
        assert_eq!((p.of(17), p.of(2), p.of(0), p.of(19)), (3, 1, 0, 0));
        // Nothing in the block slots, and never an entry.
        assert_eq!(s.occupied(), 0, "reserved slots are outside the table");
        for g in 0..2 {
            let v = s.get(slot_of(TOP, g)).unwrap();
            assert_eq!(crate::index::Entry::decode(&v), None);
        }
        for _ in 0..252 {
            Pressure::bump(&mut s, 17, n);
        }
        assert_eq!(Pressure::read(&s, n).of(17), 255);
        Pressure::bump(&mut s, 17, n);
        let p = Pressure::read(&s, n);
        assert_eq!((p.of(17), p.of(2)), (128, 0));
        // Never published to peers (they refuse non-entries).
        let mut publishing = crate::peers_log::Publishing::new(&mut s, 1200, true);
        Pressure::bump(&mut publishing, 3, n);
        assert!(publishing.writes.is_empty());
        // Out of range: ignored.
        Pressure::bump(&mut s, 25, n);
        assert_eq!(Pressure::read(&s, 32).of(25), 0);
    }
}
