//! Mooncake-style traces as simulator workloads. Parsing (time unit, block size, errors with
//! line numbers) is `emulator/src/load/trace.rs`, shared with `prefix-load --trace`; see its
//! docs. Here block id `b` becomes the segment "B pseudo-words seeded by `b`" (the last block
//! cut to `input_length`), so equal ids give byte-identical text; the replicas hash 16-token
//! KV blocks in a chain, so a block hits only when every earlier block of the request is
//! cached too (ids need not be prefix-chained). The first block is sent as the system message
//! and the rest as one user message.

use crate::trace_file::{load_requests, TraceRequest};
pub use crate::trace_file::{TimeUnit, TraceOptions, TraceStats};

use crate::engine::Arrival;
use crate::rng::mix64;
use crate::text::{Message, Role, Segment};
use crate::workload::{Spec, Workload};

/// One request: block `b` → `block` words seeded by `b`, a unique tail when the ids do not
/// cover the prompt, first block as the system message.
fn spec_of(r: &TraceRequest, block: u32) -> Spec {
    let mut segs = Vec::with_capacity(r.ids.len() + 1);
    let mut left = r.input;
    for &b in &r.ids {
        let tokens = left.min(block);
        segs.push(Segment {
            id: mix64(b ^ 0x7472_6163_6500_0000),
            tokens,
        });
        left -= tokens;
    }
    if left > 0 {
        segs.push(Segment {
            id: mix64(0x7461_696c ^ mix64(r.line as u64)),
            tokens: left,
        });
    }
    let rest = segs.split_off(1.min(segs.len()));
    let mut messages = Vec::with_capacity(2);
    if !segs.is_empty() {
        messages.push(Message {
            role: Role::System,
            segments: segs,
        });
    }
    if !rest.is_empty() {
        messages.push(Message {
            role: Role::User,
            segments: rest,
        });
    }
    Spec {
        arrival: Arrival::At(r.at_s),
        messages,
        output_tokens: r.output,
        output: None,
        session: None,
    }
}

fn workload(reqs: &[TraceRequest], st: &TraceStats, name: &str, scale: f64) -> Workload {
    let specs: Vec<Spec> = reqs.iter().map(|r| spec_of(r, st.block_tokens)).collect();
    let span = reqs.last().map_or(0.0, |r| r.at_s);
    Workload {
        name: "trace".into(),
        description: format!(
            "{name}: {} ({span:.0} s at time scale {scale}, {:.2} req/s)",
            st.summary(),
            specs.len() as f64 / span.max(1e-9)
        ),
        specs,
    }
}

/// Parse trace text.
///
/// # Errors
/// A malformed line (with its number), or no request at all.
#[cfg(test)]
pub fn parse(text: &str, opt: &TraceOptions, name: &str) -> Result<(Workload, TraceStats), String> {
    let (reqs, st) = crate::trace_file::parse_requests(text, opt, name)?;
    Ok((workload(&reqs, &st, name, opt.time_scale), st))
}

/// Read and parse a trace file.
///
/// # Errors
/// When the file cannot be read, a line is malformed or nothing is usable.
pub fn load(path: &str, opt: &TraceOptions) -> Result<(Workload, TraceStats), String> {
    let (reqs, st, name) = load_requests(path, opt)?;
    Ok((workload(&reqs, &st, &name, opt.time_scale), st))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unchained_ids_give_equal_segments_and_exact_lengths() {
        let text = "{\"timestamp\": 0, \"input_length\": 90, \"hash_ids\": [1, 100, 101]}\n\
                    {\"timestamp\": 5, \"input_length\": 80, \"hash_ids\": [2, 100, 101]}\n\
                    {\"timestamp\": 9, \"input_length\": 200, \"hash_ids\": [2, 100, 101]}\n";
        let o = TraceOptions {
            block_tokens: Some(32),
            ..TraceOptions::default()
        };
        let (w, st) = parse(text, &o, "t").unwrap();
        assert_eq!(st.kept, 3);
        // Same id 100 at position 1 → the same text, whatever block 0 is.
        assert_eq!(
            w.specs[0].messages[1].segments[0],
            w.specs[1].messages[1].segments[0]
        );
        let tokens = |s: &Spec| -> u32 {
            s.messages
                .iter()
                .flat_map(|m| &m.segments)
                .map(|s| s.tokens)
                .sum()
        };
        assert_eq!(tokens(&w.specs[0]), 90);
        // 200 tokens, 3 ids of 32: a unique 104-token tail.
        assert_eq!(tokens(&w.specs[2]), 200);
        assert_eq!(w.specs[2].messages[1].segments.len(), 3);
    }
}
