//! Consistent-hash ring with virtual nodes (ketama style).
//!
//! Each endpoint `e` owns `vnodes` points `xxh3("{e}#{i}")`; points are sorted,
//! and a key belongs to the first point clockwise from it. A point depends only
//! on its endpoint's name, so the ring is the same whatever order the endpoints
//! were configured in, on every Envoy worker and every Envoy process.
//!
//! Invariants:
//! - removing an endpoint moves only the keys it owned (they go to the next
//!   point clockwise), adding one moves only the keys its points capture,
//!   about `1/(N+1)` of them;
//! - [`HashRing::candidates`] yields each endpoint at most once, in clockwise
//!   order from the key, and yields every endpoint.
//!
//! Cost: build O(N·V log(N·V)); lookup O(log(N·V)); a full candidate walk
//! visits points until every endpoint has been seen (O(N·V) worst case, a few
//! points per distinct endpoint in practice). A walk allocates nothing: up to
//! [`SMALL_RING`] endpoints it marks the yielded ones in an inline bitset;
//! beyond, it keeps the first [`INLINE_SEEN`] in an inline array (searched
//! linearly) and only a walk that goes further builds a bitset of N bits.
//! Routing decisions stop after a few candidates, so their cost does not
//! depend on N.

use crate::hash::hash_id;

/// The ring. Endpoint indices refer to the slice given to [`HashRing::build`].
#[derive(Debug, Clone)]
pub struct HashRing {
    points: Vec<(u64, u32)>,
    endpoints: usize,
}

impl HashRing {
    /// Build a ring over `endpoints` with `vnodes` points each.
    pub fn build<S: AsRef<str>>(endpoints: &[S], vnodes: u32) -> HashRing {
        let mut points = Vec::with_capacity(endpoints.len() * vnodes as usize);
        let mut buf = String::new();
        for (idx, e) in endpoints.iter().enumerate() {
            for v in 0..vnodes {
                buf.clear();
                buf.push_str(e.as_ref());
                buf.push('#');
                buf.push_str(&v.to_string());
                points.push((hash_id(buf.as_bytes()), idx as u32));
            }
        }
        // Ties (astronomically rare) are broken by endpoint name, not position.
        points.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                endpoints[a.1 as usize]
                    .as_ref()
                    .cmp(endpoints[b.1 as usize].as_ref())
            })
        });
        HashRing {
            points,
            endpoints: endpoints.len(),
        }
    }

    /// Number of endpoints on the ring.
    pub fn len(&self) -> usize {
        self.endpoints
    }

    /// True when the ring has no endpoint.
    pub fn is_empty(&self) -> bool {
        self.endpoints == 0
    }

    /// The endpoint owning `key`.
    pub fn owner(&self, key: u64) -> Option<usize> {
        self.candidates(key).next()
    }

    /// Distinct endpoints clockwise from `key`.
    pub fn candidates(&self, key: u64) -> Candidates<'_> {
        let start = self.points.partition_point(|p| p.0 < key);
        Candidates {
            ring: self,
            pos: start,
            visited: 0,
            small: [0; SMALL_RING / 64],
            first: [0; INLINE_SEEN],
            seen: Vec::new(),
            yielded: 0,
        }
    }
}

/// Largest ring whose walks mark yielded endpoints in an inline bitset.
pub const SMALL_RING: usize = 256;

/// On larger rings: endpoints a walk remembers inline before it needs a
/// heap bitset.
pub const INLINE_SEEN: usize = 16;

/// Iterator over distinct endpoints in ring order; see [`HashRing::candidates`].
pub struct Candidates<'r> {
    ring: &'r HashRing,
    pos: usize,
    visited: usize,
    /// Rings of at most [`SMALL_RING`] endpoints: bitset of those yielded.
    small: [u64; SMALL_RING / 64],
    /// Larger rings: the first [`INLINE_SEEN`] endpoints yielded, in order.
    first: [u32; INLINE_SEEN],
    /// Bitset of every endpoint yielded; built only once more than
    /// [`INLINE_SEEN`] were (empty before).
    seen: Vec<u64>,
    yielded: usize,
}

impl Candidates<'_> {
    fn is_seen(&self, e: u32) -> bool {
        if self.ring.endpoints <= SMALL_RING {
            let (word, bit) = (e as usize / 64, 1u64 << (e % 64));
            self.small.get(word).is_some_and(|w| w & bit != 0)
        } else if self.yielded <= INLINE_SEEN {
            self.first.iter().take(self.yielded).any(|&x| x == e)
        } else {
            let (word, bit) = (e as usize / 64, 1u64 << (e % 64));
            self.seen.get(word).is_some_and(|w| w & bit != 0)
        }
    }

    fn mark(&mut self, e: u32) {
        if self.ring.endpoints <= SMALL_RING {
            Self::set_bit(&mut self.small, e);
        } else if let Some(slot) = self.first.get_mut(self.yielded) {
            *slot = e;
        } else {
            if self.seen.is_empty() {
                self.seen = vec![0u64; self.ring.endpoints.div_ceil(64)];
                for x in self.first {
                    Self::set_bit(&mut self.seen, x);
                }
            }
            Self::set_bit(&mut self.seen, e);
        }
        self.yielded += 1;
    }

    fn set_bit(seen: &mut [u64], e: u32) {
        if let Some(w) = seen.get_mut(e as usize / 64) {
            *w |= 1u64 << (e % 64);
        }
    }
}

impl Iterator for Candidates<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let n = self.ring.points.len();
        while self.yielded < self.ring.endpoints && self.visited < n {
            let &(_, e) = self.ring.points.get((self.pos + self.visited) % n)?;
            self.visited += 1;
            if !self.is_seen(e) {
                self.mark(e);
                return Some(e as usize);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::hash_id;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{}:8000", i + 1)).collect()
    }

    fn owners(ring: &HashRing, eps: &[String], keys: u64) -> Vec<String> {
        (0..keys)
            .map(|k| eps[ring.owner(hash_id(&k.to_le_bytes())).unwrap()].clone())
            .collect()
    }

    #[test]
    fn order_of_endpoints_does_not_matter() {
        let eps = names(7);
        let mut rev = eps.clone();
        rev.reverse();
        let a = owners(&HashRing::build(&eps, 256), &eps, 10_000);
        let b = owners(&HashRing::build(&rev, 256), &rev, 10_000);
        assert_eq!(a, b);
    }

    #[test]
    fn removing_one_moves_only_its_keys() {
        let eps = names(8);
        let before = owners(&HashRing::build(&eps, 256), &eps, 50_000);
        let removed = eps[3].clone();
        let rest: Vec<String> = eps.iter().filter(|e| **e != removed).cloned().collect();
        let after = owners(&HashRing::build(&rest, 256), &rest, 50_000);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                assert_eq!(*b, removed, "a key not owned by the removed replica moved");
                moved += 1;
            }
        }
        let owned = before.iter().filter(|o| **o == removed).count();
        assert_eq!(moved, owned);
        // It owned about 1/8 of the keys.
        let share = owned as f64 / 50_000.0;
        assert!((0.09..0.16).contains(&share), "share {share}");
    }

    #[test]
    fn adding_one_moves_about_one_over_n_plus_one() {
        let eps = names(7);
        let before = owners(&HashRing::build(&eps, 256), &eps, 50_000);
        let mut more = eps.clone();
        more.push("10.0.0.99:8000".into());
        let after = owners(&HashRing::build(&more, 256), &more, 50_000);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                assert_eq!(a, "10.0.0.99:8000", "a key moved between two old replicas");
                moved += 1;
            }
        }
        let frac = moved as f64 / 50_000.0;
        assert!(
            (1.0 / 8.0 - 0.03..1.0 / 8.0 + 0.03).contains(&frac),
            "moved {frac}"
        );
    }

    #[test]
    fn candidates_are_distinct_and_complete() {
        let eps = names(5);
        let ring = HashRing::build(&eps, 64);
        for k in 0..200u64 {
            let c: Vec<usize> = ring.candidates(hash_id(&k.to_le_bytes())).collect();
            let mut s = c.clone();
            s.sort();
            assert_eq!(s, vec![0, 1, 2, 3, 4]);
        }
        assert!(HashRing::build::<String>(&[], 8).owner(1).is_none());
    }

    #[test]
    fn long_walks_past_the_inline_set_stay_distinct_and_complete() {
        // More endpoints than the inline set: the walk switches to the bitset
        // and must still yield each endpoint exactly once.
        let eps = names(SMALL_RING + INLINE_SEEN * 5 + 3);
        let ring = HashRing::build(&eps, 16);
        for k in 0..20u64 {
            let c: Vec<usize> = ring.candidates(hash_id(&k.to_le_bytes())).collect();
            let mut s = c.clone();
            s.sort();
            s.dedup();
            assert_eq!(c.len(), eps.len());
            assert_eq!(s, (0..eps.len()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn balance_with_256_vnodes() {
        let eps = names(7);
        let ring = HashRing::build(&eps, 256);
        let mut count = [0usize; 7];
        for k in 0..70_000u64 {
            count[ring.owner(hash_id(&k.to_le_bytes())).unwrap()] += 1;
        }
        for c in count {
            let share = c as f64 / 70_000.0;
            assert!((0.11..0.175).contains(&share), "share {share} of {count:?}");
        }
    }
}
