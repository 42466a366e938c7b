//! Prefix hashing: chained block hashes over a bounded prefix.
//!
//! Algorithm: the prefix text is cut into blocks of `block_units` units
//! (characters for extracted text, bytes for raw bodies). Block `i` is hashed
//! one-shot with [`crate::blockhash::block_hash`] (a SIMD hash built for
//! wasm; xxh64 until the sixth session: same blocks, other values) straight
//! from the input when it is a whole block (whole ASCII blocks are
//! recognised by the hash itself, and plain JSON blocks straight from the
//! body by [`PrefixHasher::push_plain_blocks`]), else from a reused block
//! buffer, and chained: `h_i = chain(h_{i-1}, hash(block_i))`, `h_{-1} = 0`,
//! where `chain` is a splitmix64-style mix of the two (see [`chain`]; only
//! 64-bit multiplies, which wasm32 has, unlike xxh3's 128-bit products). So
//! `h_i` identifies the whole prefix up to the end of block `i`, as vLLM's
//! chained block hashes do. (Seeding the block hash itself with `h_{i-1}`,
//! as before, made xxh3 derive a 192-byte secret from the seed for every
//! block: as much work as hashing the block.) The request seed (model, tenant salt, routing id)
//! is mixed in at the end ([`mix`]), so text can be hashed in a single pass in
//! any JSON field order, before the seed is known.
//!
//! **Element boundaries** ([`PrefixHasher::end_element`]: the end of a chat
//! message, of a prompt array's element, of a Responses item) close the open
//! block early: each message is cut into `block_units`-unit blocks and its last
//! partial block ends with the message. So the key of a conversation's turn
//! `k` is an exact prefix of turn `k + 1`'s (the engine holds turn `k`'s whole
//! prompt; a block running across the boundary into the next message would be
//! hashed over text turn `k` never had), and a longest-prefix lookup of turn
//! `k + 1` finds all of turn `k`. Blocks are therefore not all `block_units`
//! long: [`PrefixHashes::ends`] gives each block's end offset in units, which
//! every conversion of a matched depth into characters or tokens must use.
//! Once [`max_blocks`]`(limit, block_units)` blocks exist, boundaries no
//! longer close blocks, so a key has at most `3 × (limit / block_units + 1)`
//! blocks (bounds memory and per-block work for bodies of many tiny
//! messages; the decision depends only on what came before, so the prefix
//! property holds up to that point).
//!
//! Cost: one pass over at most `limit` units, O(limit) time, O(limit /
//! block_units) memory (two vectors: hashes and end offsets); no copy of the
//! text. Separator markers (message boundaries) are hashed but not counted.
//!
//! Invariant: the same sequence of `push_*` / `end_element` calls always
//! yields the same hashes, and a shared prefix of calls yields the same
//! leading block hashes and ends.

use crate::blockhash::{block_hash, block_hash_ascii, block_hash_plain, block_hash_plain_round};
use crate::bytescan::split_chars;
use std::cell::Cell;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

thread_local! {
    /// The open-block buffer of the last finished hasher, reused by the next
    /// one on this thread (the filter's VM is single-threaded): no allocation
    /// for it per request in steady state.
    static SPARE_BLOCK_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    /// Tests only: hashers created while this is set take none of the fast
    /// paths (no plain blocks from the body, no ASCII or in-place blocks):
    /// every piece of text is fed one character at a time into the open
    /// block and hashed from the copy, as the key was first computed. The
    /// reference the fast paths are checked against
    /// (`extract::tests::fast_key_equals_the_reference_key`).
    pub(crate) static REFERENCE_PATH: Cell<bool> = const { Cell::new(false) };
}

/// Block size, in units, used for the routing key chain: the longest block.
/// A prefix of `prefix_length` units in one piece gives
/// `ceil(prefix_length / BLOCK_UNITS)` hashes; element boundaries add shorter
/// blocks ([`PrefixHashes::ends`]).
pub const BLOCK_UNITS: usize = 256;

/// Blocks after which element boundaries stop closing blocks, for a hasher
/// of `limit` units in blocks of `block_units`: twice the blocks of an
/// unbroken text.
pub fn max_blocks(limit: usize, block_units: usize) -> usize {
    2 * (limit / block_units.max(1) + 1)
}

/// Incremental prefix hasher with a unit budget.
pub struct PrefixHasher {
    limit: usize,
    remaining: usize,
    block_units: usize,
    in_block: usize,
    chain: u64,
    /// Bytes of the open block (at most 4 × `block_units`), hashed one-shot
    /// when the block closes: cheaper than streaming many small pieces.
    cur: Vec<u8>,
    blocks: Vec<u64>,
    ends: Vec<u32>,
    units: usize,
    /// Tests only: [`REFERENCE_PATH`] when this hasher was made.
    #[cfg(test)]
    reference: bool,
}

/// Result of [`PrefixHasher::finish`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixHashes {
    /// Chained hash at the end of each block; the last one may cover a partial block.
    pub blocks: Vec<u64>,
    /// Units hashed up to the end of each block (same length as `blocks`,
    /// strictly increasing, the last one = `units`).
    pub ends: Vec<u32>,
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

/// Units covered by the first `depth` blocks of a key whose block end
/// offsets are `ends` ([`PrefixHashes::ends`]): 0 for depth 0, the whole key
/// beyond its last block. O(1).
pub fn units_at(ends: &[u32], depth: usize) -> usize {
    match depth.checked_sub(1) {
        None => 0,
        Some(i) => ends.get(i).or(ends.last()).map_or(0, |&e| e as usize),
    }
}

/// Whole blocks within the first `units` units: the largest `d` with
/// `units_at(ends, d) ≤ units` (the engine reported `units` cached: the
/// blocks it proves). O(log blocks).
pub fn depth_at(ends: &[u32], units: usize) -> usize {
    ends.partition_point(|&e| e as usize <= units)
}

impl PrefixHasher {
    /// A hasher that accepts at most `limit` units, in blocks of `block_units`.
    pub fn new(limit: usize, block_units: usize) -> PrefixHasher {
        let block_units = block_units.max(1);
        PrefixHasher {
            limit,
            remaining: limit,
            block_units,
            in_block: 0,
            chain: 0,
            cur: {
                let mut cur = SPARE_BLOCK_BUFFER.with(Cell::take);
                cur.clear();
                cur.reserve(block_units.min(limit.max(1)) * 2);
                cur
            },
            blocks: Vec::with_capacity(limit / block_units + 1),
            ends: Vec::with_capacity(limit / block_units + 1),
            units: 0,
            #[cfg(test)]
            reference: REFERENCE_PATH.with(Cell::get),
        }
    }

    /// Forget everything fed so far (same budget and block size; the buffers
    /// are kept): a later duplicate of a hashed JSON field replaces it.
    pub fn restart(&mut self) {
        self.remaining = self.limit;
        self.in_block = 0;
        self.chain = 0;
        self.cur.clear();
        self.blocks.clear();
        self.ends.clear();
        self.units = 0;
    }

    /// True once the unit budget is spent; callers may stop feeding.
    pub fn is_full(&self) -> bool {
        self.remaining == 0
    }

    fn close_block(&mut self) {
        self.chain = chain(self.chain, block_hash(&self.cur));
        self.push_block();
        self.cur.clear();
        self.in_block = 0;
    }

    /// Record the block just chained (its hash and end offset).
    fn push_block(&mut self) {
        self.blocks.push(self.chain);
        self.ends
            .push(u32::try_from(self.units).unwrap_or(u32::MAX));
    }

    /// Feed text, counting Unicode scalar values.
    pub fn push_str(&mut self, s: &str) {
        self.push_utf8(s.as_bytes());
    }

    /// Feed UTF-8 bytes, counting characters (bytes that start a character).
    /// Pieces must not split a multi-byte character. Invalid UTF-8 is hashed
    /// as it is.
    ///
    /// Fast path: with no block open, the next `block_units` bytes are hashed
    /// straight from `b` while they are tested for ASCII
    /// ([`block_hash_ascii`]: the test rides along with the hash); if they
    /// are all ASCII (and no continuation byte follows) they are a whole
    /// block of as many characters, with no separate pass to count them and
    /// no copy. Otherwise (and for the rest of this piece, so non-ASCII text
    /// wastes at most one block hash per piece) the block's end is found with
    /// SIMD character counting ([`split_chars`]) and the bytes are hashed in
    /// place if they make a whole block, else copied into the open block.
    pub fn push_utf8(&mut self, mut b: &[u8]) {
        #[cfg(test)]
        if self.reference {
            // One character (with any continuation bytes after it) at a time.
            while !b.is_empty() && self.remaining > 0 {
                let (bytes, chars) = split_chars(b, 1);
                b = self.take(b, bytes, chars);
            }
            return;
        }
        let mut try_ascii = true;
        while !b.is_empty() && self.remaining > 0 {
            let n = self.block_units;
            if try_ascii && self.in_block == 0 && self.cur.is_empty() && self.remaining >= n {
                if let Some((block, rest)) = b.split_at_checked(n) {
                    let ends = rest.first().map_or(true, |&c| c & 0xC0 != 0x80);
                    if let Some(h) = block_hash_ascii(block).filter(|_| ends) {
                        self.push_whole(h);
                        b = rest;
                        continue;
                    }
                    try_ascii = false;
                }
            }
            let room = (self.block_units - self.in_block).min(self.remaining);
            let (take_bytes, take_chars) = split_chars(b, room);
            b = self.take(b, take_bytes, take_chars);
        }
    }

    /// Hash whole blocks of plain JSON string bytes straight from `raw`
    /// (the raw body, escapes and the closing quote still in it), while no
    /// block is open: each next `block_units` bytes that are all plain
    /// ([`block_hash_plain`]: ASCII, no `"`, `\\` or control byte, so they
    /// are the text itself, one character each) and not followed by a
    /// continuation byte make one block. Returns the bytes consumed (whole
    /// blocks; 0 at the first block that is not plain), which the caller
    /// must then skip: the same blocks and hashes as unescaping them and
    /// calling [`PrefixHasher::push_utf8`], in one pass instead of a scan for
    /// the string's end, then a count and a hash.
    ///
    /// With the routing key's block size ([`BLOCK_UNITS`], one round of the
    /// block hash) each block is a fixed 256-byte array handed to
    /// [`block_hash_plain_round`] (loads at constant offsets, no partial-round
    /// code); any other size takes the general [`block_hash_plain`].
    #[inline]
    pub fn push_plain_blocks(&mut self, raw: &[u8]) -> usize {
        #[cfg(test)]
        if self.reference {
            return 0;
        }
        let n = self.block_units;
        let mut used = 0;
        if n == BLOCK_UNITS {
            return self.push_plain_rounds(raw);
        }
        while self.in_block == 0 && self.cur.is_empty() && self.remaining >= n {
            let Some((block, rest)) = raw[used..].split_at_checked(n) else {
                break;
            };
            if rest.first().is_some_and(|&c| c & 0xC0 == 0x80) {
                break;
            }
            let Some(h) = block_hash_plain(block) else {
                break;
            };
            self.push_whole(h);
            used += n;
        }
        used
    }

    /// [`PrefixHasher::push_plain_blocks`] for the key's block size
    /// ([`BLOCK_UNITS`], one round of the block hash): the same blocks,
    /// hashes and ends. The chain, the units and the block count stay in
    /// locals for the whole run (the budget and the open-block test are
    /// checked once, before it: how many whole blocks fit). Gathering the
    /// hashes in a stack array and appending 16 at a time saved ~9 more
    /// instructions a block but cost ~200 per call (1 KiB bodies): not kept.
    fn push_plain_rounds(&mut self, raw: &[u8]) -> usize {
        let fit = (self.remaining / BLOCK_UNITS).min(raw.len() / BLOCK_UNITS);
        if fit == 0 || self.in_block != 0 || !self.cur.is_empty() {
            return 0;
        }
        let (mut chained, mut units) = (self.chain, self.units);
        let mut rest = raw;
        let mut done = 0;
        while done < fit {
            let Some((block, after)) = rest.split_first_chunk::<BLOCK_UNITS>() else {
                break;
            };
            if after.first().is_some_and(|&c| c & 0xC0 == 0x80) {
                break;
            }
            let Some(h) = block_hash_plain_round(block) else {
                break;
            };
            chained = chain(chained, h);
            units += BLOCK_UNITS;
            self.blocks.push(chained);
            self.ends.push(u32::try_from(units).unwrap_or(u32::MAX));
            done += 1;
            rest = after;
        }
        self.chain = chained;
        self.units = units;
        self.remaining -= done * BLOCK_UNITS;
        done * BLOCK_UNITS
    }

    /// Feed raw bytes, counting bytes.
    pub fn push_bytes(&mut self, mut b: &[u8]) {
        while !b.is_empty() && self.remaining > 0 {
            let room = (self.block_units - self.in_block).min(self.remaining);
            let take = room.min(b.len());
            b = self.take(b, take, take);
        }
    }

    /// Add the first `bytes` bytes of `b`, holding `units` units (at most
    /// the room left in the open block and the budget); the rest of `b`.
    /// Fast path: when no block is open (no unit, no marker) and they make
    /// a whole block, they are hashed in place, without the copy into `cur`
    /// (the same bytes, so the same hash as the copying path).
    #[inline]
    fn take<'b>(&mut self, b: &'b [u8], bytes: usize, units: usize) -> &'b [u8] {
        let (head, rest) = b.split_at(bytes.min(b.len()));
        if units == self.block_units && self.in_block == 0 && self.cur.is_empty() {
            self.push_whole(block_hash(head));
        } else {
            self.cur.extend_from_slice(head);
            self.account(units);
        }
        rest
    }

    /// Feed bytes that shape the key (separators, image references) without
    /// counting toward the budget. Ignored once the budget is spent.
    pub fn push_marker(&mut self, b: &[u8]) {
        if self.remaining > 0 {
            self.cur.extend_from_slice(b);
        }
    }

    /// End of an element (a chat message, an item of a prompt array): hash
    /// the uncounted `marker` and close the open block if it holds any unit,
    /// so the next element starts a new block (see the module docs). A block
    /// holding only markers (after an empty element, or an element that ended
    /// on a block boundary) stays open: no block without units. Ignored once
    /// the budget is spent; past [`max_blocks`] only the marker is hashed.
    pub fn end_element(&mut self, marker: &[u8]) {
        if self.remaining == 0 {
            return;
        }
        self.cur.extend_from_slice(marker);
        if self.in_block > 0 && self.blocks.len() < max_blocks(self.limit, self.block_units) {
            self.close_block();
        }
    }

    /// Chain a whole block of `block_units` units (none open) whose hash is `h`.
    #[inline]
    fn push_whole(&mut self, h: u64) {
        self.chain = chain(self.chain, h);
        self.units += self.block_units;
        self.remaining -= self.block_units;
        self.push_block();
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
            self.close_block();
        }
        PrefixHashes {
            blocks: std::mem::take(&mut self.blocks),
            ends: std::mem::take(&mut self.ends),
            units: self.units,
        }
    }
}

impl Drop for PrefixHasher {
    /// Hand the block buffer to the next hasher.
    fn drop(&mut self) {
        let cur = std::mem::take(&mut self.cur);
        SPARE_BLOCK_BUFFER.with(|s| s.set(cur));
    }
}

/// The chained hash of a block: `fmix(prev · K ⊕ block)`, with `K` odd and
/// `fmix` the splitmix64 finalizer (a bijection). For a fixed `prev` it is a
/// bijection of `block`, and for a fixed `block` a bijection of `prev`, so
/// two chains that differ anywhere stay different at every later block
/// (up to 64-bit collisions of the block hashes themselves). Two 64-bit
/// multiplies, no 128-bit product.
#[inline]
fn chain(prev: u64, block: u64) -> u64 {
    let mut z = prev.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ block;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Seed from the request's scoping fields: model name and tenant salt. Each
/// part is hashed with the hash so far, plus its length, as the seed, so
/// `("ab","c")` and `("a","bc")` differ. Parts of at most 240 bytes (model
/// names, salts, routing ids) take xxh3's short-input path, whose seed costs
/// nothing (the streaming hasher used before set up a 192-byte secret and a
/// 256-byte buffer per request).
pub fn seed(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(0x7072_6566_6978, |h, p| {
        xxh3_64_with_seed(p, h.wrapping_add(p.len() as u64))
    })
}

/// Mix a text hash with the request seed into the final routing key:
/// `xxh3_64_with_seed(&text_hash.to_le_bytes(), seed)` ([`Mixer`]).
pub fn mix(text_hash: u64, seed: u64) -> u64 {
    Mixer::new(seed).mix(text_hash)
}

/// [`mix`] with one seed for many hashes (every block of a key): the seed's
/// part of xxh3's 8-byte path computed once, then per hash a rotate, a xor
/// and xxh3's `strong_avalanche` (two 64-bit multiplies), inlined. The
/// library's call for an 8-byte slice re-derived the seed's part and
/// dispatched on the length for every block. Bit-identical to
/// `xxh3_64_with_seed(&h.to_le_bytes(), seed)` (tested).
#[derive(Debug, Clone, Copy)]
pub struct Mixer {
    flip: u64,
}

impl Mixer {
    /// xxh3's default secret, bytes 8..16 and 16..24 (little-endian): the
    /// 4-to-8-byte path's key.
    const SECRET_8: u64 = 0x1cad_21f7_2c81_017c;
    const SECRET_16: u64 = 0xdb97_9083_e96d_d4de;

    /// The seed's part (xxh3's `xxh3_64_4to8`: the seed with its low word's
    /// bytes swapped into its high word, subtracted from the secret's key).
    #[inline]
    pub fn new(seed: u64) -> Mixer {
        let seed = seed ^ (u64::from((seed as u32).swap_bytes()) << 32);
        Mixer {
            flip: (Self::SECRET_8 ^ Self::SECRET_16).wrapping_sub(seed),
        }
    }

    /// The routing hash of text hash `h` under this seed. For an 8-byte
    /// input xxh3 reads the low and the high 32-bit words and adds them
    /// swapped: `h` rotated by 32.
    #[inline]
    pub fn mix(&self, h: u64) -> u64 {
        let mut v = h.rotate_left(32) ^ self.flip;
        v ^= v.rotate_left(49) ^ v.rotate_left(24);
        v = v.wrapping_mul(0x9FB2_1C65_1E98_DF25);
        v ^= (v >> 35).wrapping_add(8);
        v = v.wrapping_mul(0x9FB2_1C65_1E98_DF25);
        v ^ (v >> 28)
    }
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
    fn in_place_blocks_hash_like_copied_blocks() {
        // Whole pieces take the in-place path; byte-by-byte pieces never do.
        let ascii = "The quick brown fox jumps over the lazy dog. ".repeat(30);
        let mixed = format!("{ascii}héllo wörld{ascii}");
        for text in [ascii.as_str(), mixed.as_str()] {
            let whole = hash_str(&[text], 1000, 64);
            let mut h = PrefixHasher::new(1000, 64);
            let mut rest = text;
            while let Some(c) = rest.chars().next() {
                h.push_str(&rest[..c.len_utf8()]);
                rest = &rest[c.len_utf8()..];
            }
            assert_eq!(whole, h.finish());
        }
        // A marker opens the block: the copying path must be taken.
        let mut a = PrefixHasher::new(1000, 64);
        a.push_marker(b"|");
        a.push_str(&ascii);
        let mut b = PrefixHasher::new(1000, 64);
        b.push_marker(b"|");
        for c in ascii.as_bytes().chunks(7) {
            b.push_utf8(c);
        }
        assert_eq!(a.finish(), b.finish());
        // A stray continuation byte right after a whole ASCII block stays in
        // that block, as the copying path puts it (invalid UTF-8 is hashed as
        // it is): compare with a split that forces the copying path.
        let mut raw = vec![b'a'; 64];
        raw.push(0x80);
        raw.extend_from_slice(&[b'b'; 100]);
        let mut c = PrefixHasher::new(1000, 64);
        c.push_utf8(&raw);
        let mut d = PrefixHasher::new(1000, 64);
        d.push_utf8(&raw[..10]);
        d.push_utf8(&raw[10..]);
        assert_eq!(c.finish(), d.finish());
        let mut e = PrefixHasher::new(1000, 64);
        e.push_bytes(&raw);
        let mut f = PrefixHasher::new(1000, 64);
        for x in raw.chunks(3) {
            f.push_bytes(x);
        }
        assert_eq!(e.finish(), f.finish());
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
    fn elements_close_their_last_block() {
        // Two elements of 300 and 100 units: blocks 256 | 44+marker | 100+marker.
        let mut h = PrefixHasher::new(4096, 256);
        h.push_str(&"a".repeat(300));
        h.end_element(b"|");
        h.push_str(&"b".repeat(100));
        h.end_element(b"|");
        let r = h.finish();
        assert_eq!(r.ends, vec![256, 300, 400]);
        assert_eq!(r.units, 400);
        // An element ending exactly on a block boundary adds no empty block;
        // its marker opens the next block (hashed, not counted).
        let mut h = PrefixHasher::new(4096, 256);
        h.push_str(&"a".repeat(256));
        h.end_element(b"|");
        h.push_str("x");
        h.end_element(b"|");
        let exact = h.finish();
        assert_eq!(exact.ends, vec![256, 257]);
        let mut h = PrefixHasher::new(4096, 256);
        h.push_str(&"a".repeat(256));
        h.push_str("x");
        assert_ne!(h.finish().last(), exact.last());
        // Empty elements: no block, but the key still sees them.
        let mut h = PrefixHasher::new(4096, 256);
        h.end_element(b"|");
        h.push_str("x");
        h.end_element(b"|");
        h.end_element(b"|");
        h.push_str("y");
        h.end_element(b"|");
        let empties = h.finish();
        assert_eq!(empties.ends, vec![1, 2]);
        let mut h = PrefixHasher::new(4096, 256);
        h.push_str("x");
        h.end_element(b"|");
        h.push_str("y");
        h.end_element(b"|");
        assert_ne!(h.finish().last(), empties.last());
        assert_eq!(PrefixHasher::new(10, 4).finish().ends, Vec::<u32>::new());
    }

    #[test]
    fn a_turn_is_a_prefix_of_the_next() {
        // Messages of awkward lengths (multi-byte too): the blocks and ends of
        // turn k are exactly the leading blocks and ends of turn k + 1.
        let msgs: Vec<String> = [700usize, 13, 256, 0, 511, 90, 1000]
            .iter()
            .enumerate()
            .map(|(i, &n)| "é".repeat(n % 7) + &char::from(b'a' + i as u8).to_string().repeat(n))
            .collect();
        let turn = |k: usize| {
            let mut h = PrefixHasher::new(65536, 256);
            for m in &msgs[..k] {
                h.push_str(m);
                h.end_element(b"\x1e");
            }
            h.finish()
        };
        for (k, next) in msgs.iter().enumerate().skip(1) {
            let (a, b) = (turn(k), turn(k + 1));
            assert!(b.blocks.len() > a.blocks.len() || next.is_empty(), "{k}");
            assert_eq!(a.blocks[..], b.blocks[..a.blocks.len()], "{k}");
            assert_eq!(a.ends[..], b.ends[..a.ends.len()], "{k}");
            assert_eq!(*a.ends.last().unwrap() as usize, a.units);
            assert!(a.ends.windows(2).all(|w| w[0] < w[1] && w[1] - w[0] <= 256));
        }
        // Without the element ends, turn 1's partial last block is not shared.
        let mut h = PrefixHasher::new(65536, 256);
        h.push_str(&msgs[0]);
        let open = h.finish();
        let mut h = PrefixHasher::new(65536, 256);
        h.push_str(&msgs[0]);
        h.push_str(&msgs[1]);
        assert_ne!(
            h.finish().blocks[open.blocks.len() - 1],
            open.blocks[open.blocks.len() - 1]
        );
    }

    #[test]
    fn block_count_is_bounded() {
        // 1-unit elements would make one block each: capped at max_blocks,
        // after which elements only add their marker.
        let limit = 1024;
        let mut h = PrefixHasher::new(limit, 256);
        for _ in 0..2000 {
            h.push_str("z");
            h.end_element(b"|");
        }
        let r = h.finish();
        assert_eq!(r.units, limit);
        // 10 one-unit blocks, then the other 1014 units in whole blocks.
        let cap = max_blocks(limit, 256);
        assert_eq!(r.blocks.len(), cap + (limit - cap).div_ceil(256));
        assert_eq!(r.blocks.len(), r.ends.len());
    }

    #[test]
    fn depth_and_units_convert_with_uneven_blocks() {
        let ends = [256u32, 300, 556, 600];
        assert_eq!(units_at(&ends, 0), 0);
        assert_eq!(units_at(&ends, 2), 300);
        assert_eq!(units_at(&ends, 4), 600);
        assert_eq!(units_at(&ends, 9), 600);
        assert_eq!(units_at(&[], 3), 0);
        assert_eq!(depth_at(&ends, 0), 0);
        assert_eq!(depth_at(&ends, 299), 1);
        assert_eq!(depth_at(&ends, 300), 2);
        assert_eq!(depth_at(&ends, 555), 2);
        assert_eq!(depth_at(&ends, 10_000), 4);
    }

    #[test]
    fn mixer_is_xxh3_of_the_eight_bytes() {
        // The former formulation (the library's 8-byte xxh3 with the seed)
        // against the inlined one, over seeds and hashes with every bit
        // pattern class (zero, all ones, single bits, random).
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut values = vec![0, u64::MAX, 1, 1 << 63, 0xffff_ffff, 0xffff_ffff << 32];
        values.extend((0..64).map(|i| 1u64 << i));
        values.extend((0..200).map(|_| next()));
        let seeds: Vec<u64> = values.iter().step_by(3).copied().collect();
        for &s in &seeds {
            let m = Mixer::new(s);
            for &h in &values {
                assert_eq!(
                    m.mix(h),
                    xxh3_64_with_seed(&h.to_le_bytes(), s),
                    "{h:#x} {s:#x}"
                );
                assert_eq!(mix(h, s), m.mix(h));
            }
        }
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
