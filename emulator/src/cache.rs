//! Block hashes of the emulator's prompts, as vLLM computes them for its prefix cache.
//!
//! Only **full** blocks get a hash. Block `i` of a prompt hashes `(hash of block i-1, the block's
//! token ids)`; block 0 hashes with a root that mixes the request's extra keys (LoRA adapter,
//! `cache_salt`). So two prompts share a cached block only if everything before it matches. The
//! cache itself (lookup capped at `num_tokens - 1` tokens, LRU of unreferenced blocks, stats
//! `queries += num_tokens`, `hits += cached tokens` per scheduled request) is the shared engine
//! model's ([`engine_model::BlockCache`], used by [`engine_model::Engine`]).
//!
//! Cost: O(prompt tokens) per request.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

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

/// Cumulative counters (monotonic; never reset, like Prometheus counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub queries: u64,
    pub hits: u64,
    pub evictions: u64,
    pub preemptions: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine_model::{Engine, EventKind, Params, Request};

    fn toks(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| seed * 1_000_003 + i).collect()
    }

    fn engine(blocks: u32) -> Engine {
        Engine::new(Params {
            kv_blocks: blocks,
            ..Params::default()
        })
    }

    /// Runs one request to completion on `e`; returns its cached tokens.
    fn run(e: &mut Engine, tokens: &[u64], root: u64) -> u32 {
        let t = e.next_event_time().unwrap_or(0.0);
        e.submit(
            Request {
                id: 1,
                prompt_tokens: tokens.len() as u32,
                output_tokens: 2,
                blocks: block_hashes(tokens, 16, root),
                ..Default::default()
            },
            t,
        );
        let mut out = Vec::new();
        e.run_until_idle(t, &mut out, 100);
        out.iter()
            .find_map(|x| match x.kind {
                EventKind::FirstToken { cached } => Some(cached),
                _ => None,
            })
            .unwrap_or(u32::MAX)
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
    fn hits_stop_at_the_first_changed_block_and_before_the_last_token() {
        let mut e = engine(64);
        let r = root_hash(None, None);
        let t = toks(1, 50);
        assert_eq!(run(&mut e, &t, r), 0);
        assert_eq!(run(&mut e, &t, r), 48); // floor(49/16)*16
        let mut u = t.clone();
        u[20] += 1; // block 1 differs: only block 0 hits
        assert_eq!(run(&mut e, &u, r), 16);
        let one = toks(3, 16);
        assert_eq!(run(&mut e, &one, r), 0);
        assert_eq!(run(&mut e, &one, r), 0); // a one-block prompt can never hit
        let m = e.metrics();
        assert_eq!((m.queries, m.hits), (50 * 3 + 32, 64));
    }

    #[test]
    fn lora_and_salt_partition_the_cache() {
        let mut e = engine(64);
        let t = toks(40, 48);
        assert_eq!(run(&mut e, &t, root_hash(None, None)), 0);
        assert_eq!(run(&mut e, &t, root_hash(Some("a"), None)), 0);
        assert_eq!(run(&mut e, &t, root_hash(None, Some("s"))), 0);
        assert_eq!(run(&mut e, &t, root_hash(None, None)), 32);
    }
}
