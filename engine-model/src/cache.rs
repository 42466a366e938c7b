//! Block-level prefix cache of one engine (vLLM's automatic prefix caching).
//!
//! `capacity` physical blocks. A block is either
//! - **hashed**: in the map under its chained hash (block `i`'s hash covers every token up to
//!   the end of block `i`, so a hit on block `i` implies the whole prefix); pinned while running
//!   sequences reference it (`refs > 0`), otherwise *evictable* and kept in an LRU list
//!   (evicted from the front);
//! - **private**: allocated to one running sequence and not (yet) shareable (blocks no planned
//!   step fills yet, output blocks whose hash is unknown).
//!
//! Invariant: `map.len() + private ≤ capacity`; free blocks are
//! `capacity − map.len() − private`. Allocation takes free blocks first, then
//! evicts evictable blocks in LRU order, as vLLM's free-block queue does.
//! Cost: O(1) per block operation (hash map + intrusive list over a slab).

use crate::IdMap;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    hash: u64,
    refs: u32,
    prev: u32,
    next: u32,
}

/// The cache.
#[derive(Debug, Clone)]
pub struct BlockCache {
    capacity: u32,
    map: IdMap<u32>,
    nodes: Vec<Node>,
    spare: Vec<u32>,
    head: u32,
    tail: u32,
    lru_len: u32,
    private: u32,
    evictions: u64,
}

impl BlockCache {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: u32) -> BlockCache {
        BlockCache {
            capacity,
            map: IdMap::with_capacity_and_hasher(capacity as usize, Default::default()),
            nodes: Vec::with_capacity(capacity as usize),
            spare: Vec::new(),
            head: NIL,
            tail: NIL,
            lru_len: 0,
            private: 0,
            evictions: 0,
        }
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Hashed blocks (pinned or evictable).
    pub fn cached_blocks(&self) -> u32 {
        self.map.len() as u32
    }

    /// Hashed blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Drops every evictable block (vLLM `reset_prefix_cache`; pinned blocks are in use and
    /// stay). Returns how many were dropped.
    pub fn drop_evictable(&mut self) -> u32 {
        let mut n = 0;
        while self.evict_one() {
            n += 1;
        }
        self.evictions -= u64::from(n);
        n
    }

    /// Blocks neither hashed nor private.
    pub fn free(&self) -> u32 {
        self.capacity - self.map.len() as u32 - self.private
    }

    /// Blocks that could be handed out now (free + evictable).
    pub fn available(&self) -> u32 {
        self.free() + self.lru_len
    }

    /// Blocks in use by running sequences (vLLM's `kv_cache_usage` numerator).
    pub fn used(&self) -> u32 {
        self.map.len() as u32 - self.lru_len + self.private
    }

    /// Is `hash` cached (pinned or evictable)?
    pub fn contains(&self, hash: u64) -> bool {
        self.map.contains_key(&hash)
    }

    /// Is `hash` cached and evictable (refs = 0)?
    pub fn is_evictable(&self, hash: u64) -> bool {
        self.map
            .get(&hash)
            .is_some_and(|&i| self.nodes[i as usize].refs == 0)
    }

    /// Number of leading `blocks` present (at most `max`).
    pub fn prefix_hits(&self, blocks: &[u64], max: usize) -> usize {
        blocks
            .iter()
            .take(max)
            .take_while(|h| self.map.contains_key(h))
            .count()
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = {
            let node = &self.nodes[i as usize];
            (node.prev, node.next)
        };
        if p == NIL {
            self.head = n;
        } else {
            self.nodes[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.nodes[n as usize].prev = p;
        }
        self.lru_len -= 1;
    }

    fn push_back(&mut self, i: u32) {
        self.nodes[i as usize].prev = self.tail;
        self.nodes[i as usize].next = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            self.nodes[self.tail as usize].next = i;
        }
        self.tail = i;
        self.lru_len += 1;
    }

    /// Take a reference on a cached block (a prefix hit). Returns false if absent.
    pub fn acquire(&mut self, hash: u64) -> bool {
        let Some(&i) = self.map.get(&hash) else {
            return false;
        };
        if self.nodes[i as usize].refs == 0 {
            self.unlink(i);
        }
        self.nodes[i as usize].refs += 1;
        true
    }

    /// Drop a reference; at zero the block becomes evictable (most recent).
    pub fn release(&mut self, hash: u64) {
        if let Some(&i) = self.map.get(&hash) {
            let node = &mut self.nodes[i as usize];
            if node.refs > 0 {
                node.refs -= 1;
                if node.refs == 0 {
                    self.push_back(i);
                }
            }
        }
    }

    fn evict_one(&mut self) -> bool {
        let i = self.head;
        if i == NIL {
            return false;
        }
        self.unlink(i);
        let hash = self.nodes[i as usize].hash;
        self.map.remove(&hash);
        self.spare.push(i);
        self.evictions += 1;
        true
    }

    /// Allocate `n` private blocks, evicting as needed. False (and no change)
    /// if fewer than `n` are available.
    pub fn alloc_private(&mut self, n: u32) -> bool {
        if n > self.available() {
            return false;
        }
        while self.free() < n {
            if !self.evict_one() {
                return false;
            }
        }
        self.private += n;
        true
    }

    /// Return `n` private blocks to the free pool.
    pub fn free_private(&mut self, n: u32) {
        self.private -= n.min(self.private);
    }

    /// Turn one private block into the hashed block `hash`: pinned (`refs = 1`)
    /// if `pin`, else evictable. If `hash` is already cached, the private block
    /// is freed instead and, when `pin`, a reference is taken on the existing
    /// one. Returns true if the caller now holds a reference on `hash`.
    pub fn publish(&mut self, hash: u64, pin: bool) -> bool {
        self.free_private(1);
        if let Some(&i) = self.map.get(&hash) {
            if pin {
                if self.nodes[i as usize].refs == 0 {
                    self.unlink(i);
                }
                self.nodes[i as usize].refs += 1;
            }
            return pin;
        }
        let node = Node {
            hash,
            refs: u32::from(pin),
            prev: NIL,
            next: NIL,
        };
        let i = match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.map.insert(hash, i);
        if !pin {
            self.push_back(i);
        }
        pin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_oldest_released_first() {
        let mut c = BlockCache::new(4);
        assert!(c.alloc_private(4));
        for h in [1, 2, 3, 4] {
            assert!(c.publish(h, true));
        }
        assert_eq!(c.free(), 0);
        for h in [4, 3, 2, 1] {
            c.release(h);
        }
        assert_eq!(c.available(), 4);
        assert!(c.acquire(1)); // hit: pinned again
        assert!(c.alloc_private(2)); // evicts 4 then 3
        assert!(!c.contains(4) && !c.contains(3) && c.contains(2) && c.contains(1));
        assert!(!c.alloc_private(2)); // only block 2 is evictable
        assert_eq!(c.used(), 3);
    }
}
