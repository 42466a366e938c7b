//! vLLM-style prefix (KV) cache: a fixed pool of blocks, chained block hashes, an LRU free queue.
//!
//! Model (vLLM v1 `KVCacheManager` / `BlockPool`, simplified to one KV group):
//! - The pool holds `capacity` blocks of `block_tokens` tokens each. Every block is either in use
//!   (`ref_cnt > 0`, held by a running request) or free (`ref_cnt == 0`, linked in the free queue).
//!   A free block may still carry a hash: its KV content can be reused until the block is evicted.
//! - Only **full** blocks get a hash. Block `i` of a prompt hashes `(hash of block i-1, the block's
//!   token ids)`; block 0 hashes with a root that mixes the request's extra keys (LoRA adapter,
//!   `cache_salt`). So two prompts share a cached block only if everything before it matches.
//! - Lookup ([`PrefixCache::admit`]) walks the chain until the first miss, capped at
//!   `num_tokens - 1` tokens (the last prompt token is always recomputed for its logits): a full
//!   hit of `n` tokens gives `floor((n - 1) / B) * B` cached tokens.
//! - Hit blocks are "touched": `ref_cnt += 1`, and they leave the free queue if they were in it.
//!   The request then allocates blocks for the rest of its prompt and its output from the head of
//!   the free queue (the least recently freed block); taking a hashed block evicts its hash.
//! - [`PrefixCache::commit`] (prefill done) gives the request's full prompt blocks their hashes.
//!   A hash already present (a concurrent duplicate) is not inserted twice: the block stays
//!   anonymous, as vLLM's append-only block tables do not de-duplicate.
//! - [`PrefixCache::release`] (request finished) decrements `ref_cnt` and appends freed blocks to
//!   the tail of the free queue **in reverse order**, so a request's tail blocks are evicted first.
//! - If the pool has too few free blocks, the request gets what is left (no preemption, no
//!   waiting for KV space): its unallocated blocks are simply never cached.
//!
//! Stats follow vLLM: `queries += num_tokens`, `hits += cached tokens` per admitted request.
//!
//! Cost: `admit` and `commit` are O(prompt blocks) hash-map operations; `release` is O(blocks held).
//! The free queue is an intrusive doubly linked list over block indices: O(1) push/pop/remove.

use std::collections::HashMap;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

const NIL: u32 = u32::MAX;

/// Root seed for block 0 of a request: mixes the extra keys (LoRA adapter, `cache_salt`).
pub fn root_hash(lora: Option<&str>, cache_salt: Option<&str>) -> u64 {
    let mut key = Vec::new();
    key.extend_from_slice(b"emu-root\0");
    key.extend_from_slice(lora.unwrap_or("").as_bytes());
    key.push(0);
    key.extend_from_slice(cache_salt.unwrap_or("").as_bytes());
    xxh3_64(&key)
}

/// Chained hashes of the **full** blocks of `tokens`: `h[i] = H(h[i-1], tokens of block i)`,
/// with `h[-1] = root`. A trailing partial block has no hash.
pub fn block_hashes(tokens: &[u64], block_tokens: usize, root: u64) -> Vec<u64> {
    let bt = block_tokens.max(1);
    let mut parent = root;
    let mut buf = Vec::with_capacity(bt * 8);
    tokens
        .chunks_exact(bt)
        .map(|block| {
            buf.clear();
            for t in block {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            parent = xxh3_64_with_seed(&buf, parent);
            parent
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
struct Block {
    hash: Option<u64>,
    ref_cnt: u32,
    prev: u32,
    next: u32,
    in_free: bool,
}

/// The blocks one admitted request holds, in order (hit blocks first). Give it back with
/// [`PrefixCache::commit`] (optional) and [`PrefixCache::release`] (always, exactly once).
#[derive(Debug, Default)]
pub struct Allocation {
    blocks: Vec<u32>,
    hit_blocks: usize,
    /// Chained hashes of the request's full prompt blocks (from [`block_hashes`]).
    hashes: Vec<u64>,
    /// Cache generation at admission; a reset in between makes commit a no-op.
    generation: u64,
    released: bool,
}

impl Allocation {
    /// Blocks held (hits + newly allocated).
    pub fn blocks_held(&self) -> usize {
        self.blocks.len()
    }
}

/// Outcome of [`PrefixCache::admit`].
#[derive(Debug)]
pub struct Admitted {
    /// Prompt tokens served from cache (multiple of `block_tokens`, at most `num_tokens - 1`).
    pub cached_tokens: usize,
    pub allocation: Allocation,
}

/// Cumulative counters (monotonic; never reset, like Prometheus counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub queries: u64,
    pub hits: u64,
    pub evictions: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct PrefixCache {
    block_tokens: usize,
    blocks: Vec<Block>,
    map: HashMap<u64, u32>,
    head: u32,
    tail: u32,
    free_len: usize,
    generation: u64,
    stats: CacheStats,
}

impl PrefixCache {
    /// A pool of `capacity` blocks of `block_tokens` tokens, all free and empty.
    pub fn new(capacity: usize, block_tokens: usize) -> Self {
        let capacity = capacity.min(NIL as usize - 1);
        let mut cache = PrefixCache {
            block_tokens: block_tokens.max(1),
            blocks: vec![
                Block {
                    hash: None,
                    ref_cnt: 0,
                    prev: NIL,
                    next: NIL,
                    in_free: false
                };
                capacity
            ],
            map: HashMap::new(),
            head: NIL,
            tail: NIL,
            free_len: 0,
            generation: 0,
            stats: CacheStats::default(),
        };
        for i in 0..capacity as u32 {
            cache.push_tail(i);
        }
        cache
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks held by running requests.
    pub fn used_blocks(&self) -> usize {
        self.blocks.len() - self.free_len
    }

    /// Blocks whose KV content is reusable (hashed), in use or free.
    pub fn cached_blocks(&self) -> usize {
        self.map.len()
    }

    /// vLLM's `kv_cache_usage_perc`: `1 - free / total` (cached-but-free blocks count as free).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            0.0
        } else {
            self.used_blocks() as f64 / self.blocks.len() as f64
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Cached tokens a prompt would get now, without touching anything (for tests and debugging).
    pub fn peek(&self, hashes: &[u64], num_tokens: usize) -> usize {
        self.hit_blocks(hashes, num_tokens) * self.block_tokens
    }

    fn hit_blocks(&self, hashes: &[u64], num_tokens: usize) -> usize {
        let max_blocks = num_tokens.saturating_sub(1) / self.block_tokens;
        hashes
            .iter()
            .take(max_blocks)
            .take_while(|h| self.map.contains_key(h))
            .count()
    }

    /// Admits a request: looks up its prefix (`hashes` from [`block_hashes`] over its prompt),
    /// touches the hit blocks, allocates blocks for the rest of the prompt plus
    /// `output_tokens`, and counts `queries += num_tokens`, `hits += cached`.
    pub fn admit(&mut self, hashes: Vec<u64>, num_tokens: usize, output_tokens: usize) -> Admitted {
        let hit = self.hit_blocks(&hashes, num_tokens);
        let mut blocks = Vec::with_capacity(hit);
        for h in &hashes[..hit] {
            if let Some(&b) = self.map.get(h) {
                self.touch(b);
                blocks.push(b);
            }
        }
        let total = (num_tokens + output_tokens).div_ceil(self.block_tokens);
        for _ in hit..total {
            match self.pop_head() {
                Some(b) => {
                    if let Some(old) = self.blocks[b as usize].hash.take() {
                        self.map.remove(&old);
                        self.stats.evictions += 1;
                    }
                    self.blocks[b as usize].ref_cnt = 1;
                    blocks.push(b);
                }
                None => break,
            }
        }
        let cached_tokens = hit * self.block_tokens;
        self.stats.queries += num_tokens as u64;
        self.stats.hits += cached_tokens as u64;
        Admitted {
            cached_tokens,
            allocation: Allocation {
                blocks,
                hit_blocks: hit,
                hashes,
                generation: self.generation,
                released: false,
            },
        }
    }

    /// Prefill finished: the request's full prompt blocks become reusable (get their hashes).
    pub fn commit(&mut self, alloc: &Allocation) {
        if alloc.released || alloc.generation != self.generation {
            return;
        }
        let n = alloc.hashes.len().min(alloc.blocks.len());
        for i in alloc.hit_blocks..n {
            let h = alloc.hashes[i];
            let b = alloc.blocks[i];
            if self.blocks[b as usize].hash.is_none() && !self.map.contains_key(&h) {
                self.blocks[b as usize].hash = Some(h);
                self.map.insert(h, b);
            }
        }
    }

    /// Request finished (or abandoned): frees its blocks, tail blocks first into the LRU queue.
    /// Idempotent.
    pub fn release(&mut self, alloc: &mut Allocation) {
        if alloc.released {
            return;
        }
        alloc.released = true;
        if alloc.generation != self.generation {
            return; // the pool was reset; these blocks are already free
        }
        for &b in alloc.blocks.iter().rev() {
            let blk = &mut self.blocks[b as usize];
            blk.ref_cnt = blk.ref_cnt.saturating_sub(1);
            if blk.ref_cnt == 0 && !blk.in_free {
                self.push_tail(b);
            }
        }
    }

    /// Drops every cached hash and frees every block (`POST /admin/reset-cache`). Allocations
    /// made before the reset become inert. Counters are kept.
    pub fn reset(&mut self) {
        let capacity = self.blocks.len();
        let stats = self.stats;
        let generation = self.generation + 1;
        *self = PrefixCache::new(capacity, self.block_tokens);
        self.stats = stats;
        self.generation = generation;
    }

    fn touch(&mut self, b: u32) {
        if self.blocks[b as usize].in_free {
            self.unlink(b);
        }
        self.blocks[b as usize].ref_cnt += 1;
    }

    fn push_tail(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        blk.prev = self.tail;
        blk.next = NIL;
        blk.in_free = true;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.blocks[self.tail as usize].next = b;
        }
        self.tail = b;
        self.free_len += 1;
    }

    fn unlink(&mut self, b: u32) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let blk = &mut self.blocks[b as usize];
        blk.prev = NIL;
        blk.next = NIL;
        blk.in_free = false;
        self.free_len -= 1;
    }

    fn pop_head(&mut self) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let b = self.head;
        self.unlink(b);
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| seed * 1_000_003 + i).collect()
    }

    /// Runs one full request lifecycle (admit, commit, release); returns cached tokens.
    fn run(c: &mut PrefixCache, tokens: &[u64], out: usize) -> usize {
        let hashes = block_hashes(tokens, c.block_tokens(), root_hash(None, None));
        let mut a = c.admit(hashes, tokens.len(), out);
        c.commit(&a.allocation);
        c.release(&mut a.allocation);
        a.cached_tokens
    }

    #[test]
    fn only_full_blocks_are_hashed_and_chained() {
        let t = toks(1, 40);
        let h = block_hashes(&t, 16, 7);
        assert_eq!(h.len(), 2);
        // Same second block, different first block: different chained hash.
        let mut t2 = t.clone();
        t2[0] += 1;
        let h2 = block_hashes(&t2, 16, 7);
        assert_ne!(h[0], h2[0]);
        assert_ne!(h[1], h2[1]);
        // The root (extra keys) changes every hash.
        assert_ne!(block_hashes(&t, 16, 8)[0], h[0]);
        assert_ne!(root_hash(Some("lora-a"), None), root_hash(None, None));
        assert_ne!(root_hash(None, Some("salt")), root_hash(None, None));
    }

    #[test]
    fn repeated_prompt_hits_all_full_blocks_but_the_last_token() {
        let mut c = PrefixCache::new(64, 16);
        let t = toks(1, 50);
        assert_eq!(run(&mut c, &t, 4), 0);
        assert_eq!(run(&mut c, &t, 4), 48); // floor(49/16)*16
        let s = c.stats();
        assert_eq!(s.queries, 100);
        assert_eq!(s.hits, 48);
    }

    #[test]
    fn hit_is_capped_at_n_minus_one() {
        let mut c = PrefixCache::new(64, 16);
        let t = toks(2, 32); // exactly two full blocks
        assert_eq!(run(&mut c, &t, 1), 0);
        assert_eq!(run(&mut c, &t, 1), 16); // floor(31/16)*16: the last block is recomputed
        let t1 = toks(3, 16);
        assert_eq!(run(&mut c, &t1, 1), 0);
        assert_eq!(run(&mut c, &t1, 1), 0); // a one-block prompt can never hit
    }

    #[test]
    fn chain_stops_at_first_miss() {
        let mut c = PrefixCache::new(64, 16);
        let a = toks(4, 64);
        run(&mut c, &a, 0);
        // Shares block 0 only.
        let mut b = a.clone();
        b[20] = 999_999;
        assert_eq!(run(&mut c, &b, 0), 16);
        // Differs in block 0, same later tokens: chained hashes miss everywhere.
        let mut d = a.clone();
        d[0] = 123_456;
        assert_eq!(run(&mut c, &d, 0), 0);
        // Longer prompt extending a: hits all of a's 4 blocks.
        let mut e = a.clone();
        e.extend(toks(5, 20));
        assert_eq!(run(&mut c, &e, 0), 64);
    }

    #[test]
    fn lru_evicts_least_recently_freed_and_hits_refresh() {
        // 8 blocks; a and b use 2 full blocks + 1 token => 3 blocks (2 hashed).
        let mut c = PrefixCache::new(8, 16);
        let r = root_hash(None, None);
        let a = toks(10, 33);
        let b = toks(11, 33);
        run(&mut c, &a, 0);
        run(&mut c, &b, 0);
        // Touch a again, so that b is now the least recently used.
        assert_eq!(run(&mut c, &a, 0), 32);
        // d needs 5 blocks: 1 never used, 2 anonymous tail blocks, then both of b's hashed ones.
        let d = toks(12, 65);
        run(&mut c, &d, 0);
        assert_eq!(c.stats().evictions, 2);
        assert_eq!(c.peek(&block_hashes(&b, 16, r), 33), 0);
        assert_eq!(c.peek(&block_hashes(&a, 16, r), 33), 32);
        assert_eq!(c.peek(&block_hashes(&d, 16, r), 65), 64);
        // e needs 2 blocks: an anonymous one, then a's *last* block (freed in reverse order).
        let e = toks(13, 17);
        run(&mut c, &e, 0);
        assert_eq!(c.stats().evictions, 3);
        assert_eq!(c.peek(&block_hashes(&a, 16, r), 33), 16);
        assert_eq!(c.peek(&block_hashes(&d, 16, r), 65), 64);
    }

    #[test]
    fn capacity_bounds_cached_blocks() {
        let mut c = PrefixCache::new(10, 16);
        for s in 0..20 {
            run(&mut c, &toks(100 + s, 64), 0);
            assert!(c.cached_blocks() <= 10);
            assert_eq!(c.used_blocks(), 0);
        }
        // Only the most recent prompts survive; the first one is long gone.
        let first = block_hashes(&toks(100, 64), 16, root_hash(None, None));
        assert_eq!(c.peek(&first, 64), 0);
        let last = block_hashes(&toks(119, 64), 16, root_hash(None, None));
        assert_eq!(c.peek(&last, 64), 48);
    }

    #[test]
    fn in_use_blocks_are_not_evicted_and_usage_counts_them() {
        let mut c = PrefixCache::new(4, 16);
        let a = toks(20, 40); // 3 blocks for the prompt
        let ha = block_hashes(&a, 16, root_hash(None, None));
        let mut held = c.admit(ha.clone(), 40, 0);
        c.commit(&held.allocation);
        assert_eq!(c.used_blocks(), 3);
        assert!((c.usage() - 0.75).abs() < 1e-9);
        // Another request needs 3 blocks but only 1 is free: it gets 1, evicts nothing of a.
        let b = toks(21, 40);
        let mut other = c.admit(block_hashes(&b, 16, root_hash(None, None)), 40, 0);
        assert_eq!(other.allocation.blocks_held(), 1);
        // A concurrent duplicate of a hits a's blocks while a is still running.
        let dup = c.admit(ha.clone(), 40, 0);
        assert_eq!(dup.cached_tokens, 32);
        let mut dup = dup.allocation;
        c.release(&mut dup);
        c.release(&mut other.allocation);
        c.release(&mut held.allocation);
        c.release(&mut held.allocation); // idempotent
        assert_eq!(c.used_blocks(), 0);
        assert_eq!(c.peek(&ha, 40), 32);
    }

    #[test]
    fn reset_drops_everything_and_old_allocations_are_inert() {
        let mut c = PrefixCache::new(16, 16);
        let a = toks(30, 40);
        let ha = block_hashes(&a, 16, root_hash(None, None));
        let mut held = c.admit(ha.clone(), 40, 0);
        c.reset();
        c.commit(&held.allocation);
        c.release(&mut held.allocation);
        assert_eq!(c.used_blocks(), 0);
        assert_eq!(c.cached_blocks(), 0);
        assert_eq!(c.peek(&ha, 40), 0);
        assert_eq!(c.stats().queries, 40); // counters survive
    }

    #[test]
    fn lora_and_salt_partition_the_cache() {
        let mut c = PrefixCache::new(64, 16);
        let t = toks(40, 48);
        let base = block_hashes(&t, 16, root_hash(None, None));
        let lora = block_hashes(&t, 16, root_hash(Some("a"), None));
        let mut x = c.admit(base.clone(), 48, 0);
        c.commit(&x.allocation);
        c.release(&mut x.allocation);
        assert_eq!(c.peek(&base, 48), 32);
        assert_eq!(c.peek(&lora, 48), 0);
    }
}
