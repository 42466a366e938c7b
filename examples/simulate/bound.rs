//! The infinite-cache exact-prefix bound of a workload.
//!
//! One cache of unlimited size shared by every replica: a request is served
//! from it for its longest prefix of KV blocks that **any** earlier request
//! (prompt or cached output) contained, capped like a replica's cache at
//! `(prompt − 1) / 16` blocks (the last prompt token is always computed).
//! Blocks are chained hashes, so a block counts only when every earlier block
//! of the request is cached too. No routing policy can get a higher
//! token-level hit rate on GPU caches of any size: every hit of a policy is a
//! prefix some earlier request brought into some cache. (LRU caches of finite
//! size, pooled or not, are *not* bounds: LRU is not an optimal replacement
//! policy.)
//!
//! Order: requests by arrival time as one run saw them (chat turns arrive
//! after their previous turn ends, so their order depends on the run only
//! through think times; the bound uses the first policy's run). A request's
//! output blocks are available from its own arrival on (generous, so still an
//! upper bound).
//!
//! Cost: O(total blocks) hash-set operations.

use std::collections::HashSet;

use crate::engine::{RequestRecord, SimRequest};
use crate::text::KV_BLOCK_TOKENS;

/// Token-level hit rate of one infinite exact-prefix cache, visiting requests
/// in the order of `records[i].arrived`.
pub fn infinite_cache_hit_rate(reqs: &[SimRequest], records: &[RequestRecord]) -> f64 {
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| {
        let ta = records.get(a).map_or(0.0, |r| r.arrived);
        let tb = records.get(b).map_or(0.0, |r| r.arrived);
        ta.total_cmp(&tb).then(a.cmp(&b))
    });
    let mut seen: HashSet<u64> = HashSet::with_capacity(reqs.len() * 16);
    let (mut cached, mut prompt) = (0u64, 0u64);
    for i in order {
        let r = &reqs[i];
        let max = (r.prompt_tokens.saturating_sub(1) / KV_BLOCK_TOKENS) as usize;
        let hits = r
            .blocks
            .iter()
            .take(max)
            .take_while(|h| seen.contains(h))
            .count();
        cached += hits as u64 * u64::from(KV_BLOCK_TOKENS);
        prompt += u64::from(r.prompt_tokens);
        seen.extend(r.blocks.iter().copied());
        seen.extend(r.out_blocks.iter().copied());
    }
    cached as f64 / prompt.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Arrival, Keys};

    fn req(blocks: &[u64], prompt: u32) -> SimRequest {
        SimRequest {
            arrival: Arrival::At(0.0),
            prompt_tokens: prompt,
            output_tokens: 1,
            body_chars: prompt * 4,
            blocks: blocks.to_vec(),
            out_blocks: Vec::new(),
            keys: Keys::default(),
        }
    }

    #[test]
    fn longest_prefix_seen_by_any_request() {
        let reqs = vec![
            req(&[1, 2, 3], 48),
            req(&[1, 2, 9], 48),    // hits 1, 2
            req(&[7, 2, 3], 48),    // block 2 alone does not count
            req(&[1, 2, 3], 48),    // capped at (48 − 1) / 16 = 2 blocks
            req(&[1, 2, 3, 4], 80), // 3 blocks
        ];
        let rec: Vec<RequestRecord> = (0..reqs.len())
            .map(|i| RequestRecord {
                arrived: i as f64,
                ..Default::default()
            })
            .collect();
        let r = infinite_cache_hit_rate(&reqs, &rec);
        let want = f64::from((2 + 2 + 3) * 16) / f64::from(48 * 4 + 80);
        assert!((r - want).abs() < 1e-12, "{r} vs {want}");
        // Order matters: reversed, the long one comes first and hits nothing.
        let rev: Vec<RequestRecord> = rec
            .iter()
            .map(|r| RequestRecord {
                arrived: -r.arrived,
                ..*r
            })
            .collect();
        let want = f64::from((2 + 2 + 2) * 16) / f64::from(48 * 4 + 80);
        assert!((infinite_cache_hit_rate(&reqs, &rev) - want).abs() < 1e-12);
    }
}
