//! Prefix hashing: chained xxh3 block hashes over a bounded prefix.
//!
//! Algorithm: the prefix text is cut into blocks of `block_units` units
//! (characters for extracted text, bytes for raw bodies). Block `i` is hashed
//! with xxh3 seeded by the hash of block `i-1` (`h_0` seeded with 0), so
//! `h_i` identifies the whole prefix up to the end of block `i`, as vLLM's
//! chained block hashes do. The request seed (model, tenant salt, routing id)
//! is mixed in at the end ([`mix`]), so text can be hashed in a single pass in
//! any JSON field order, before the seed is known.
//!
//! Cost: one pass over at most `limit` units, O(limit) time, O(limit /
//! block_units) memory; no copy of the text. Separator markers (message
//! boundaries) are hashed but not counted.
//!
//! Invariant: the same sequence of `push_*` calls always yields the same hashes,
//! and a prefix of units shared by two inputs yields the same leading block
//! hashes.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed, Xxh3};

/// Block size, in units, used for the routing key chain. A prefix of
/// `prefix_length` units gives `ceil(prefix_length / BLOCK_UNITS)` hashes.
pub const BLOCK_UNITS: usize = 256;

/// Incremental prefix hasher with a unit budget.
pub struct PrefixHasher {
    remaining: usize,
    block_units: usize,
    in_block: usize,
    chain: u64,
    cur: Xxh3,
    blocks: Vec<u64>,
    units: usize,
}

/// Result of [`PrefixHasher::finish`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixHashes {
    /// Chained hash at the end of each block; the last one may cover a partial block.
    pub blocks: Vec<u64>,
    /// Units hashed (≤ the limit).
    pub units: usize,
}

impl PrefixHashes {
    /// Hash of the whole hashed prefix, or `None` when no unit was hashed.
    pub fn last(&self) -> Option<u64> {
        if self.units == 0 {
            None
        } else {
            self.blocks.last().copied()
        }
    }
}

impl PrefixHasher {
    /// A hasher that accepts at most `limit` units, in blocks of `block_units`.
    pub fn new(limit: usize, block_units: usize) -> PrefixHasher {
        let block_units = block_units.max(1);
        PrefixHasher {
            remaining: limit,
            block_units,
            in_block: 0,
            chain: 0,
            cur: Xxh3::with_seed(0),
            blocks: Vec::with_capacity(limit / block_units + 1),
            units: 0,
        }
    }

    /// True once the unit budget is spent; callers may stop feeding.
    pub fn is_full(&self) -> bool {
        self.remaining == 0
    }

    fn close_block(&mut self) {
        self.chain = self.cur.digest();
        self.blocks.push(self.chain);
        self.cur = Xxh3::with_seed(self.chain);
        self.in_block = 0;
    }

    /// Feed text, counting Unicode scalar values.
    pub fn push_str(&mut self, mut s: &str) {
        while !s.is_empty() && self.remaining > 0 {
            let room = (self.block_units - self.in_block).min(self.remaining);
            // Fast path: `len()` bytes hold at most `len()` chars.
            let (take_bytes, take_chars) = if s.len() <= room {
                (s.len(), s.chars().count())
            } else {
                match s.char_indices().nth(room) {
                    Some((idx, _)) => (idx, room),
                    None => (s.len(), s.chars().count()),
                }
            };
            let (head, tail) = s.split_at(take_bytes);
            self.cur.update(head.as_bytes());
            self.account(take_chars);
            s = tail;
        }
    }

    /// Feed raw bytes, counting bytes.
    pub fn push_bytes(&mut self, mut b: &[u8]) {
        while !b.is_empty() && self.remaining > 0 {
            let room = (self.block_units - self.in_block).min(self.remaining);
            let take = room.min(b.len());
            self.cur.update(&b[..take]);
            self.account(take);
            b = &b[take..];
        }
    }

    /// Feed bytes that shape the key (separators, image references) without
    /// counting toward the budget. Ignored once the budget is spent.
    pub fn push_marker(&mut self, b: &[u8]) {
        if self.remaining > 0 {
            self.cur.update(b);
        }
    }

    fn account(&mut self, units: usize) {
        self.in_block += units;
        self.units += units;
        self.remaining -= units;
        if self.in_block == self.block_units {
            self.close_block();
        }
    }

    /// Finish: the chained block hashes (a trailing partial block included).
    pub fn finish(mut self) -> PrefixHashes {
        if self.in_block > 0 {
            self.chain = self.cur.digest();
            self.blocks.push(self.chain);
        }
        PrefixHashes {
            blocks: self.blocks,
            units: self.units,
        }
    }
}

/// Seed from the request's scoping fields: model name and tenant salt. Fields are
/// length-prefixed so `("ab","c")` and `("a","bc")` differ.
pub fn seed(parts: &[&[u8]]) -> u64 {
    let mut h = Xxh3::with_seed(0x7072_6566_6978);
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.digest()
}

/// Mix a text hash with the request seed into the final routing key.
pub fn mix(text_hash: u64, seed: u64) -> u64 {
    xxh3_64_with_seed(&text_hash.to_le_bytes(), seed)
}

/// Hash of a short identifier (ring points, routing ids).
pub fn hash_id(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn hash_str(parts: &[&str], limit: usize, block: usize) -> PrefixHashes {
        let mut h = PrefixHasher::new(limit, block);
        for p in parts {
            h.push_str(p);
        }
        h.finish()
    }

    #[test]
    fn splitting_does_not_change_hashes() {
        let text = "héllo wörld, the quick brown 🦊 jumps over the lazy dog ".repeat(40);
        let whole = hash_str(&[&text], 1000, 64);
        let chars: Vec<char> = text.chars().collect();
        let a: String = chars[..333].iter().collect();
        let b: String = chars[333..].iter().collect();
        assert_eq!(whole, hash_str(&[&a, &b], 1000, 64));
        assert_eq!(whole.units, 1000);
        assert_eq!(whole.blocks.len(), 16); // 15 full blocks of 64 + a partial
    }

    #[test]
    fn shared_prefix_shares_leading_blocks() {
        let common = "x".repeat(512);
        let a = hash_str(&[&common, "tail one"], 4096, 128);
        let b = hash_str(&[&common, "tail two, longer"], 4096, 128);
        assert_eq!(a.blocks[..4], b.blocks[..4]);
        assert_ne!(a.last(), b.last());
    }

    #[test]
    fn limit_caps_the_key() {
        let a = hash_str(&["a".repeat(3000).as_str(), "DIFFERENT"], 3000, 256);
        let b = hash_str(&["a".repeat(3000).as_str(), "other"], 3000, 256);
        assert_eq!(a.last(), b.last());
        assert_eq!(a.units, 3000);
    }

    #[test]
    fn markers_are_hashed_not_counted() {
        let mut a = PrefixHasher::new(10, 4);
        a.push_str("ab");
        a.push_marker(b"\x1e");
        a.push_str("cd");
        let a = a.finish();
        let b = hash_str(&["abcd"], 10, 4);
        assert_eq!(a.units, 4);
        assert_ne!(a.last(), b.last());
    }

    #[test]
    fn bytes_and_seed() {
        let mut h = PrefixHasher::new(5, 2);
        h.push_bytes(b"abcdefgh");
        let r = h.finish();
        assert_eq!(r.units, 5);
        assert_eq!(r.blocks.len(), 3);
        assert_ne!(seed(&[b"ab", b"c"]), seed(&[b"a", b"bc"]));
        assert_ne!(mix(1, seed(&[b"m1"])), mix(1, seed(&[b"m2"])));
        assert_eq!(PrefixHasher::new(10, 4).finish().last(), None);
    }
}
