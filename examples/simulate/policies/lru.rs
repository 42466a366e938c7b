//! A plain LRU set of u64 keys (hashicorp `golang-lru` semantics: `add`
//! inserts or refreshes, and evicts the oldest key past the capacity).
//! Used by the GIE and SGLang baselines. O(1) per operation.

use crate::rng::IdMap;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    key: u64,
    prev: u32,
    next: u32,
}

/// The LRU set. Most recent at the tail.
#[derive(Debug, Clone)]
pub struct Lru {
    cap: usize,
    map: IdMap<u32>,
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
}

impl Lru {
    /// Empty, holding at most `cap` keys.
    pub fn new(cap: usize) -> Lru {
        Lru {
            cap: cap.max(1),
            map: IdMap::default(),
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    /// Does the set hold `key`?
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.nodes[i as usize].prev, self.nodes[i as usize].next);
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
    }

    /// Insert or refresh `key`; returns the evicted key, if any.
    pub fn add(&mut self, key: u64) -> Option<u64> {
        if let Some(&i) = self.map.get(&key) {
            self.unlink(i);
            self.push_back(i);
            return None;
        }
        if self.map.len() >= self.cap {
            // Reuse the oldest node.
            let i = self.head;
            self.unlink(i);
            let old = self.nodes[i as usize].key;
            self.map.remove(&old);
            self.nodes[i as usize].key = key;
            self.map.insert(key, i);
            self.push_back(i);
            return Some(old);
        }
        self.nodes.push(Node {
            key,
            prev: NIL,
            next: NIL,
        });
        let i = (self.nodes.len() - 1) as u32;
        self.map.insert(key, i);
        self.push_back(i);
        None
    }
}
