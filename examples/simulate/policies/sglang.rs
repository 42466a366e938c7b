//! SGLang router `cache_aware` policy with its CLI defaults.
//!
//! Source: `sgl-model-gateway/src/policies/cache_aware.rs` and `tree.rs` (see
//! `shared/notes/anchors.md` §4.1). With in-flight loads `min`, `max`:
//! 1. imbalanced iff `max − min > balance_abs_threshold (64)` and
//!    `max > balance_rel_threshold (1.5) × min` → the least-loaded worker;
//! 2. else longest prefix match of the request text in the approximate radix
//!    tree; if `matched / text length > cache_threshold (0.3)` → the worker
//!    holding that match, else the least-loaded worker;
//! 3. the text is inserted under the chosen worker in every case.
//!
//! Approximation: the character radix tree is modelled at 64-character
//! granularity (16 tokens × 4 chars), as one LRU of chained 64-char block
//! hashes per worker, over the **whole** prompt text; `max_tree_size`
//! 67 108 864 characters per worker = 1 048 576 blocks, evicted LRU at once
//! instead of every 120 s. When several workers hold the longest match, one is
//! taken at random (the real tree returns the first tenant of a concurrent
//! map, an arbitrary one). "Least loaded" is the first worker with the
//! minimum load, as `min_by_key` does.

use super::lru::Lru;
use super::{Policy, Routed, View};
use crate::engine::SimRequest;
use crate::rng::Rng;
use crate::text::KV_BLOCK_TOKENS;

/// CLI `--max-tree-size` in 64-character blocks.
pub const MAX_TREE_BLOCKS: usize = 67_108_864 / 64;

/// The three thresholds (CLI defaults: 0.3, 64, 1.5).
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// `--cache-threshold`.
    pub cache: f64,
    /// `--balance-abs-threshold`.
    pub balance_abs: u32,
    /// `--balance-rel-threshold`.
    pub balance_rel: f64,
}

/// The policy.
pub struct CacheAware {
    trees: Vec<Lru>,
    rng: Rng,
    t: Thresholds,
}

impl CacheAware {
    /// `n` workers.
    pub fn new(n: usize, seed: u64, t: Thresholds) -> CacheAware {
        CacheAware {
            trees: (0..n).map(|_| Lru::new(MAX_TREE_BLOCKS)).collect(),
            rng: Rng::new(seed ^ 0x591a),
            t,
        }
    }
}

impl Policy for CacheAware {
    fn route(&mut self, _idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let loads = view.in_flight;
        let min = loads.iter().copied().min().unwrap_or(0);
        let max = loads.iter().copied().max().unwrap_or(0);
        let least = loads.iter().position(|&l| l == min).unwrap_or(0);
        let imbalanced =
            max - min > self.t.balance_abs && f64::from(max) > self.t.balance_rel * f64::from(min);
        // Longest match (the tree is walked in both branches in SGLang's code
        // only when balanced; computed here for the spill statistic).
        let counts: Vec<usize> = self
            .trees
            .iter()
            .map(|t| req.blocks.iter().take_while(|&&h| t.contains(h)).count())
            .collect();
        let best = counts.iter().copied().max().unwrap_or(0);
        let rate = (best as f64 * f64::from(KV_BLOCK_TOKENS)) / f64::from(req.prompt_tokens.max(1));
        let (pick, spill) = if imbalanced {
            (least, rate > self.t.cache)
        } else if rate > self.t.cache {
            let holders: Vec<usize> = (0..counts.len()).filter(|&w| counts[w] == best).collect();
            let w = holders[self.rng.below(holders.len() as u64) as usize];
            (w, false)
        } else {
            (least, false)
        };
        for &h in &req.blocks {
            self.trees[pick].add(h);
        }
        Routed {
            replica: pick,
            spill,
        }
    }
}
