//! Generated Mooncake-style traces with statistics unlike the shipped one,
//! to check that results hold out of sample (`--gen-trace KIND --out FILE`).
//!
//! - `heldout`: multi-turn sessions. 8 system prompts (1–4 blocks, Zipf
//!   1.1), 60 % of sessions carry one of 3 000 documents (lognormal median 24
//!   blocks = 12 k tokens, 2–160, Zipf 0.9), 1 + geometric(mean 2) turns; user
//!   turns lognormal median 300 tokens, answers median 250; next turn 2 s +
//!   output/40 s + exp(30 s) after the previous one; sessions Poisson at
//!   2.4/s. 512-token blocks, prefix-chained ids (Mooncake's convention),
//!   integer millisecond timestamps from 0. About 4 000 requests at scale 1.
//! - `nsblocks`: agent/RAG-like. 4 system prompts (20–60 blocks), 400 chunks
//!   (4–24 blocks, Zipf 1.0) of which each request takes 1–6 in random order,
//!   a unique question (1–8 blocks); 40 % of requests continue an earlier one
//!   (its prompt + answer + a new question). 32-token blocks whose ids are
//!   **content** ids, not prefix-chained (the same chunk id appears at
//!   different positions after different prefixes); timestamps are epoch
//!   nanoseconds written as strings. About 2 000 requests at scale 1.
//!
//! The last block of a prompt is partial (the prompt ends inside it), as in
//! real traces. Deterministic in `seed`.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::rng::{mix64, Rng, Zipf};

/// One request being written.
struct Line {
    t_ns: u128,
    input: u64,
    output: u32,
    ids: Vec<u64>,
}

fn write(lines: &mut [Line], ns_strings: bool) -> String {
    lines.sort_by_key(|l| l.t_ns);
    let mut s = String::with_capacity(lines.len() * 200);
    for l in lines.iter() {
        let ids: Vec<String> = l.ids.iter().map(u64::to_string).collect();
        let ts = if ns_strings {
            format!("\"{}\"", l.t_ns)
        } else {
            (l.t_ns / 1_000_000).to_string()
        };
        let _ = writeln!(
            s,
            "{{\"timestamp\": {ts}, \"input_length\": {}, \"output_length\": {}, \"hash_ids\": [{}]}}",
            l.input,
            l.output,
            ids.join(", ")
        );
    }
    s
}

/// Prefix-chained ids: `(parent id, content)` → a new sequential id.
#[derive(Default)]
struct Chain {
    ids: HashMap<(u64, u64), u64>,
}

impl Chain {
    fn ids(&mut self, content: &[u64]) -> Vec<u64> {
        let mut parent = u64::MAX;
        content
            .iter()
            .map(|&c| {
                let next = self.ids.len() as u64;
                let id = *self.ids.entry((parent, c)).or_insert(next);
                parent = id;
                id
            })
            .collect()
    }
}

fn heldout(seed: u64, scale: f64) -> String {
    const B: u64 = 512;
    const DOCS: usize = 3000;
    let mut rng = Rng::new(seed ^ 0x4e1d);
    let sys_z = Zipf::new(8, 1.1);
    let doc_z = Zipf::new(DOCS, 0.9);
    let sys_len: Vec<u64> = (0..8).map(|_| u64::from(rng.range(1, 4))).collect();
    let doc_len: Vec<u64> = (0..DOCS)
        .map(|_| u64::from(rng.lognormal(24.0, 0.8, 2, 160)))
        .collect();
    let sessions = ((2000.0 * scale).round() as u64).max(1);
    let rate = 2.4; // sessions per second
    let mut chain = Chain::default();
    let mut lines = Vec::new();
    let mut t = 0.0f64;
    for s in 0..sessions {
        t += rng.exp(1.0 / rate);
        let sys = sys_z.sample(&mut rng) as u64;
        let mut content: Vec<u64> = (0..sys_len[sys as usize])
            .map(|k| mix64(0x5157 ^ (sys << 16) ^ k))
            .collect();
        if rng.f64() < 0.6 {
            let d = doc_z.sample(&mut rng) as u64;
            content.extend((0..doc_len[d as usize]).map(|k| mix64(0xd0c ^ (d << 16) ^ k)));
        }
        let fixed = content.len() as u64 * B;
        let mut turns = 1;
        while turns < 12 && rng.f64() < 0.5 {
            turns += 1;
        }
        let mut own = 0u64; // session tokens so far
        let mut at = t;
        for _ in 0..turns {
            own += u64::from(rng.lognormal(300.0, 0.9, 10, 6000));
            let input = fixed + own;
            let blocks = input.div_ceil(B);
            let mut c = content.clone();
            c.extend((content.len() as u64..blocks).map(|k| mix64(mix64(s ^ 0x5e55) ^ k)));
            let output = rng.lognormal(250.0, 0.8, 5, 2000);
            lines.push(Line {
                t_ns: (at * 1e9) as u128,
                input,
                output,
                ids: chain.ids(&c),
            });
            own += u64::from(output);
            at += 2.0 + f64::from(output) / 40.0 + rng.exp(30.0);
        }
    }
    write(&mut lines, false)
}

fn nsblocks(seed: u64, scale: f64) -> String {
    const B: u64 = 32;
    const BASE_NS: u128 = 1_764_460_800_000_000_000;
    let mut rng = Rng::new(seed ^ 0x2b10);
    let sys_len: Vec<u64> = (0..4).map(|_| u64::from(rng.range(20, 60))).collect();
    let chunk_z = Zipf::new(400, 1.0);
    let chunk_len: Vec<u64> = (0..400).map(|_| u64::from(rng.range(4, 24))).collect();
    let n = ((2000.0 * scale).round() as usize).max(1);
    let rate = 1.2; // requests per second
    let mut next_id = 1u64 << 40;
    // Earlier prompts (ids, tokens) that may be continued.
    let mut prompts: Vec<(Vec<u64>, u64)> = Vec::new();
    let mut lines = Vec::with_capacity(n);
    let mut t = 0.0f64;
    for _ in 0..n {
        t += rng.exp(1.0 / rate);
        let (mut ids, mut tokens) = if !prompts.is_empty() && rng.f64() < 0.4 {
            // Continue a recent prompt: its ids + answer + new question.
            let back = (rng.below(prompts.len().min(50) as u64) + 1) as usize;
            let (ids, tokens) = prompts[prompts.len() - back].clone();
            // Full blocks only (the partial last block changes when text is
            // appended: a new id).
            let full = (tokens / B) as usize;
            (ids[..full.min(ids.len())].to_vec(), full as u64 * B)
        } else {
            let s = rng.below(4) as usize;
            let mut ids: Vec<u64> = (0..sys_len[s]).map(|k| (s as u64) << 20 | k).collect();
            let k = rng.range(1, 6);
            let mut picked: Vec<usize> = (0..k).map(|_| chunk_z.sample(&mut rng)).collect();
            // Random order.
            for i in (1..picked.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                picked.swap(i, j);
            }
            for c in picked {
                ids.extend((0..chunk_len[c]).map(|b| 0x100_0000 | (c as u64) << 8 | b));
            }
            let tokens = ids.len() as u64 * B;
            (ids, tokens)
        };
        let q = u64::from(rng.range(1, 8)) * B - u64::from(rng.range(1, 31));
        let q_blocks = (tokens + q).div_ceil(B) - ids.len() as u64;
        for _ in 0..q_blocks {
            ids.push(next_id);
            next_id += 1;
        }
        tokens += q;
        let output = rng.lognormal(200.0, 0.8, 5, 1500);
        lines.push(Line {
            t_ns: BASE_NS + (t * 1e9) as u128,
            input: tokens,
            output,
            ids: ids.clone(),
        });
        // The answer joins the prompt for a continuation.
        let ans = u64::from(output);
        let ans_blocks = (tokens + ans).div_ceil(B) - ids.len() as u64;
        for _ in 0..ans_blocks {
            ids.push(next_id);
            next_id += 1;
        }
        prompts.push((ids, tokens + ans));
    }
    write(&mut lines, true)
}

/// Generate trace `kind` (`heldout` or `nsblocks`); `scale` multiplies its
/// size.
///
/// # Errors
/// Unknown kind.
pub fn generate(kind: &str, seed: u64, scale: f64) -> Result<String, String> {
    match kind {
        "heldout" => Ok(heldout(seed, scale)),
        "nsblocks" => Ok(nsblocks(seed, scale)),
        other => Err(format!(
            "--gen-trace: unknown kind {other} (heldout, nsblocks)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse, TimeUnit, TraceOptions};

    #[test]
    fn generated_traces_parse_with_detected_unit_and_block() {
        let o = TraceOptions::default();
        let (w, st) = parse(&generate("heldout", 3, 0.1).unwrap(), &o, "h").unwrap();
        assert_eq!(st.block_tokens, 512, "{}", st.block);
        assert!(st.unit.starts_with(TimeUnit::Ms.as_str()), "{}", st.unit);
        assert!(w.specs.len() > 100);
        let (w, st) = parse(&generate("nsblocks", 3, 0.1).unwrap(), &o, "n").unwrap();
        assert_eq!(st.block_tokens, 32, "{}", st.block);
        assert!(st.unit.starts_with(TimeUnit::Ns.as_str()), "{}", st.unit);
        assert_eq!(w.specs.len(), 200);
        assert!(st.adjusted.is_empty(), "{}", st.summary());
        assert!(generate("nope", 1, 1.0).is_err());
    }
}
