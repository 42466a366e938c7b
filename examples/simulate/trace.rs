//! Mooncake-format traces (`kvcache-ai/Mooncake`, `FAST25-release/traces`).
//!
//! One JSON object per line: `timestamp` (ms from the start), `input_length`
//! (prompt tokens), `output_length` (generated tokens), `hash_ids` (one id per
//! 512-token block of the prompt; equal ids at the same position mean an
//! identical prefix). Block id `b` becomes the segment "512 pseudo-words
//! seeded by `b`" (the last block is cut to the prompt length), so equal ids
//! give byte-identical prefixes. The first block is sent as the system
//! message and the rest as one user message (in chat traces the first block
//! is the system prompt; in the Mooncake conversation trace every request
//! shares it).
//!
//! Robustness: empty lines are skipped; a line that is not a JSON object, or
//! lacks a usable `timestamp`/`input_length`/`hash_ids`, is skipped and
//! counted by reason; extra fields are ignored; a missing `output_length`
//! counts and defaults to 1; lines are sorted by timestamp (stable); prompts
//! longer than their blocks get a unique tail, ids beyond the prompt length
//! are dropped. Every adjustment is counted in [`TraceStats`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::engine::Arrival;
use crate::rng::mix64;
use crate::text::{Message, Role, Segment};
use crate::workload::{Spec, Workload};

/// Tokens per trace block.
pub const TRACE_BLOCK_TOKENS: u32 = 512;

/// What loading a trace did.
#[derive(Debug, Default, Clone)]
pub struct TraceStats {
    /// Lines read.
    pub lines: usize,
    /// Requests kept.
    pub kept: usize,
    /// Skipped lines by reason.
    pub skipped: BTreeMap<String, usize>,
    /// Adjusted requests by reason.
    pub adjusted: BTreeMap<String, usize>,
    /// Timestamps were not sorted.
    pub unsorted: bool,
}

impl TraceStats {
    /// One-line summary.
    pub fn summary(&self) -> String {
        let mut s = format!("{} lines, {} requests", self.lines, self.kept);
        for (k, v) in &self.skipped {
            let _ = write!(s, ", skipped {v} ({k})");
        }
        for (k, v) in &self.adjusted {
            let _ = write!(s, ", adjusted {v} ({k})");
        }
        if self.unsorted {
            s.push_str(", timestamps sorted");
        }
        s
    }
}

fn as_u64(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.is_finite())
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn as_f64(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64().filter(|f| f.is_finite()),
        Value::String(s) => s.trim().parse().ok().filter(|f: &f64| f.is_finite()),
        _ => None,
    }
}

struct Row {
    ts_ms: f64,
    input: u32,
    output: u32,
    ids: Vec<u64>,
    line: usize,
}

/// Parse trace text. `time_scale` multiplies every timestamp (< 1 = more load).
///
/// # Errors
/// When no line is usable.
pub fn parse(text: &str, time_scale: f64, name: &str) -> Result<(Workload, TraceStats), String> {
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err(format!("--time-scale must be > 0, got {time_scale}"));
    }
    let mut st = TraceStats::default();
    let mut rows: Vec<Row> = Vec::new();
    let skip = |st: &mut TraceStats, why: &str| {
        *st.skipped.entry(why.to_string()).or_insert(0) += 1;
    };
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        st.lines += 1;
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(line) else {
            skip(&mut st, "not a JSON object");
            continue;
        };
        let Some(ts) = as_f64(obj.get("timestamp")) else {
            skip(&mut st, "no numeric timestamp");
            continue;
        };
        let Some(input) = as_u64(obj.get("input_length")).filter(|&n| n > 0) else {
            skip(&mut st, "no positive input_length");
            continue;
        };
        let Some(Value::Array(ids)) = obj.get("hash_ids") else {
            skip(&mut st, "no hash_ids array");
            continue;
        };
        let ids: Option<Vec<u64>> = ids.iter().map(|v| as_u64(Some(v))).collect();
        let Some(mut ids) = ids else {
            skip(&mut st, "non-integer hash id");
            continue;
        };
        let output = match as_u64(obj.get("output_length")) {
            Some(o) => o.max(1),
            None => {
                *st.adjusted
                    .entry("missing output_length → 1".into())
                    .or_insert(0) += 1;
                1
            }
        };
        let input = input.min(u64::from(u32::MAX / 2)) as u32;
        let need = input.div_ceil(TRACE_BLOCK_TOKENS) as usize;
        if ids.len() > need {
            ids.truncate(need);
            *st.adjusted
                .entry("more hash_ids than input_length needs (dropped)".into())
                .or_insert(0) += 1;
        } else if ids.len() < need {
            *st.adjusted
                .entry("input_length beyond hash_ids (unique tail)".into())
                .or_insert(0) += 1;
        }
        rows.push(Row {
            ts_ms: ts,
            input,
            output: output.min(1 << 20) as u32,
            ids,
            line: lineno,
        });
    }
    if rows.is_empty() {
        return Err(format!(
            "trace {name}: no usable request ({})",
            st.summary()
        ));
    }
    if rows.windows(2).any(|w| w[1].ts_ms < w[0].ts_ms) {
        st.unsorted = true;
        rows.sort_by(|a, b| a.ts_ms.total_cmp(&b.ts_ms));
    }
    let t0 = rows.first().map_or(0.0, |r| r.ts_ms);
    st.kept = rows.len();
    let specs = rows
        .iter()
        .map(|r| {
            let mut segs = Vec::with_capacity(r.ids.len() + 1);
            let mut left = r.input;
            for &b in &r.ids {
                let tokens = left.min(TRACE_BLOCK_TOKENS);
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
            let rest = segs.split_off(1);
            let mut messages = vec![Message {
                role: Role::System,
                segments: segs,
            }];
            if !rest.is_empty() {
                messages.push(Message {
                    role: Role::User,
                    segments: rest,
                });
            }
            Spec {
                arrival: Arrival::At((r.ts_ms - t0) / 1000.0 * time_scale),
                messages,
                output_tokens: r.output,
                output: None,
                session: None,
            }
        })
        .collect::<Vec<_>>();
    let span = specs.last().map_or(0.0, |s| match s.arrival {
        Arrival::At(t) => t,
        Arrival::After { .. } => 0.0,
    });
    let description = format!(
        "{name}: {} ({:.0} s at time scale {time_scale}, {:.2} req/s)",
        st.summary(),
        span,
        specs.len() as f64 / span.max(1e-9)
    );
    Ok((
        Workload {
            name: "trace".into(),
            description,
            specs,
        },
        st,
    ))
}

/// Read and parse a trace file.
///
/// # Errors
/// When the file cannot be read or has no usable line.
pub fn load(path: &str, time_scale: f64) -> Result<(Workload, TraceStats), String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read trace {path}: {e}"))?;
    let name = std::path::Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
    parse(&text, time_scale, &name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn robust_parsing() {
        let text = "\n{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, 2], \"extra\": 1}\n\
                    not json\n{\"timestamp\": 1, \"input_length\": 100, \"hash_ids\": [1]}\n\
                    {\"input_length\": 5, \"hash_ids\": []}\n{\"timestamp\": 2, \"input_length\": 2000, \"output_length\": 1, \"hash_ids\": [1,2,3,4,5,6]}\n";
        let (w, st) = parse(text, 1.0, "t").unwrap();
        assert_eq!(st.lines, 5);
        assert_eq!(st.kept, 3);
        assert!(st.unsorted);
        assert_eq!(st.skipped.values().sum::<usize>(), 2);
        // Sorted: ts 1, 2, 5 → arrivals 0, 0.001, 0.004.
        assert!(matches!(w.specs[0].arrival, Arrival::At(t) if t == 0.0));
        assert_eq!(w.specs[0].output_tokens, 1);
        // 2000 tokens need 4 blocks: 2 ids dropped.
        let toks: u32 = w.specs[1]
            .messages
            .iter()
            .flat_map(|m| &m.segments)
            .map(|s| s.tokens)
            .sum();
        assert_eq!(toks, 2000);
        assert!(parse("\n\n", 1.0, "t").is_err());
        assert!(parse(text, 0.0, "t").is_err());
    }
}
