//! Gateway API Inference Extension / llm-d EPP, default profile with the
//! approximate prefix-cache scorer.
//!
//! Source (GIE@1748e82, `pkg/epp/framework/plugins/...`, see
//! `shared/notes/anchors.md` §2.2–2.3):
//! - hashes: xxhash64 chained over 64-character blocks (16 tokens × 4) of
//!   `json.Marshal(messages)`, at most 256 blocks, trailing partial block
//!   included, seeded with the model name (xxh3 here);
//! - index: `hashToPods` + one LRU per pod of capacity `num_gpu_blocks`
//!   (autoTune), learned from its own decisions (all the request's hashes are
//!   added to the chosen pod after the pick);
//! - prefix score = consecutive matched blocks / total blocks;
//! - queue score `(maxQ − q)/(maxQ − minQ)` (1 if all equal) on
//!   `vllm:num_requests_waiting`; kv score `1 − kv_cache_usage`; metrics
//!   scraped every 50 ms;
//! - saturation filter: drop pods with waiting > 5 or kv usage > 0.8, keep all
//!   if all are dropped (fail open);
//! - total = 3·prefix + 2·queue + 2·kv; max-score picker (shuffle, first max).
//!
//! Supports up to 64 replicas (pod sets are bit masks).

use crate::rng::IdMap;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::lru::Lru;
use super::{Policy, Routed, View};
use crate::engine::SimRequest;
use crate::rng::Rng;

/// Characters of the messages JSON GIE hashes (256 blocks × 64).
pub const MAX_CHARS: usize = 256 * BLOCK_CHARS;
/// Block size in characters.
pub const BLOCK_CHARS: usize = 64;

/// GIE's chained block hashes of `messages_json` (first 256 blocks).
pub fn hashes(messages_json: &[u8], model: &str) -> Vec<u64> {
    let mut h = xxh3_64_with_seed(model.as_bytes(), 0x0067_6965);
    let text = &messages_json[..messages_json.len().min(MAX_CHARS)];
    text.chunks(BLOCK_CHARS)
        .map(|c| {
            h = xxh3_64_with_seed(c, h);
            h
        })
        .collect()
}

/// Scorer weights and saturation thresholds (defaults 3, 2, 2, 5, 0.8).
#[derive(Debug, Clone, Copy)]
pub struct Weights {
    /// Prefix scorer weight.
    pub prefix: f64,
    /// Queue scorer weight.
    pub queue: f64,
    /// KV-cache utilisation scorer weight.
    pub kv: f64,
    /// Saturated when more requests wait than this.
    pub sat_waiting: u32,
    /// Saturated above this KV-cache usage.
    pub sat_kv: f64,
}

/// The EPP.
pub struct Gie {
    w: Weights,
    n: usize,
    hash_to_pods: IdMap<u64>,
    lrus: Vec<Lru>,
    rng: Rng,
    order: Vec<usize>,
}

impl Gie {
    /// `n` pods, per-pod LRU of `capacity` blocks.
    pub fn new(n: usize, capacity: usize, seed: u64, w: Weights) -> Gie {
        Gie {
            w,
            n,
            hash_to_pods: IdMap::default(),
            lrus: (0..n).map(|_| Lru::new(capacity)).collect(),
            rng: Rng::new(seed ^ 0x61e),
            order: (0..n).collect(),
        }
    }
}

impl Policy for Gie {
    fn needs_scrape(&self) -> bool {
        true
    }

    fn route(&mut self, _idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let n = self.n.min(64);
        let hashes = &req.keys.gie;
        // Prefix match: consecutive blocks per pod.
        let mut count = vec![0u32; n];
        let mut set: u64 = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        for h in hashes {
            let s = self.hash_to_pods.get(h).copied().unwrap_or(0) & set;
            if s == 0 {
                break;
            }
            for (p, c) in count.iter_mut().enumerate() {
                if s & (1 << p) != 0 {
                    *c += 1;
                }
            }
            set = s;
        }
        let total = hashes.len().max(1) as f64;
        // Saturation filter (fail open).
        let m = view.scraped;
        let mut cands: Vec<usize> = (0..n)
            .filter(|&p| m[p].waiting <= self.w.sat_waiting && m[p].kv_usage <= self.w.sat_kv)
            .collect();
        if cands.is_empty() {
            cands = (0..n).collect();
        }
        let max_q = cands.iter().map(|&p| m[p].waiting).max().unwrap_or(0);
        let min_q = cands.iter().map(|&p| m[p].waiting).min().unwrap_or(0);
        let score = |p: usize| {
            let prefix = f64::from(count[p]) / total;
            let queue = if max_q == min_q {
                1.0
            } else {
                f64::from(max_q - m[p].waiting) / f64::from(max_q - min_q)
            };
            let kv = 1.0 - m[p].kv_usage;
            self.w.prefix * prefix + self.w.queue * queue + self.w.kv * kv
        };
        // Max-score picker: shuffle, then the first maximum.
        for i in (1..self.order.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            self.order.swap(i, j);
        }
        let mut best: Option<(usize, f64)> = None;
        for &p in &self.order {
            if !cands.contains(&p) {
                continue;
            }
            let s = score(p);
            if best.map_or(true, |(_, b)| s > b) {
                best = Some((p, s));
            }
        }
        let pick = best.map_or(0, |(p, _)| p);
        let best_match = count.iter().copied().max().unwrap_or(0);
        // Learn: the request's blocks now live on `pick`.
        for &h in hashes {
            if let Some(old) = self.lrus[pick].add(h) {
                if let Some(s) = self.hash_to_pods.get_mut(&old) {
                    *s &= !(1u64 << pick);
                    if *s == 0 {
                        self.hash_to_pods.remove(&old);
                    }
                }
            }
            *self.hash_to_pods.entry(h).or_insert(0) |= 1u64 << pick;
        }
        Routed {
            replica: pick,
            spill: best_match > 0 && count[pick] < best_match,
        }
    }
}
