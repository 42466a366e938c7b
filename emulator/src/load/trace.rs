//! Mooncake-style JSONL traces, shared by `prefix-load --trace` (real time, through Envoy)
//! and the simulator (`examples/simulate`, which includes this file), so one trace file means
//! the same requests in both.
//!
//! One JSON object per line: `timestamp`, `input_length` (prompt tokens), `output_length`
//! (generated tokens), `hash_ids` (one id per block of the prompt). Numbers may be JSON numbers
//! or strings. A file holding one JSON array of such objects is read too (errors then name the
//! element); a compressed file is an error that says so.
//!
//! **Time unit.** Timestamps may be seconds, milliseconds, microseconds or nanoseconds,
//! absolute (epoch) or relative; integers are subtracted exactly (an epoch in nanoseconds does
//! not fit an `f64` exactly). The unit is `--time-unit` when given, else detected
//! ([`detect_unit`]): an epoch by its magnitude (s ≈ 10^9, ms ≈ 10^12, µs ≈ 10^15,
//! ns ≈ 10^18); relative times by their mean arrival rate (the unit whose rate is closest to
//! 10 req/s on a log scale; real services run between ~0.1 and ~1000 req/s). The unit and the
//! rate are reported, so a wrong guess is visible.
//!
//! **Block size.** `--block-tokens` when given, else inferred from `input_length` and
//! `len(hash_ids)` ([`infer_block_tokens`]).
//!
//! **Block ids** are taken as given: equal ids give equal block text wherever they appear. Ids
//! do not have to be prefix-chained; the consumers hash KV blocks in a chain, so **a block is a
//! cache hit only if every earlier block of the same request is cached too** (the same id
//! after a different prefix is a different KV block, as in vLLM). An exact 64-bit integer id (a
//! number or a numeric string; a negative one as its two's complement) is used as it is; any
//! other string is hashed from its text; a number past 64 bits or with a fraction is hashed from
//! the float value the JSON reader keeps (counted: write such ids as strings).
//!
//! **Errors.** Empty lines are skipped. A line that is not a JSON object, or has no usable
//! `timestamp` or `hash_ids`, or asks for more than [`MAX_INPUT_TOKENS`] prompt tokens or
//! [`MAX_OUTPUT_TOKENS`] output tokens (no model serves such a request: a corrupt field, which
//! would otherwise stall a replay for hours of simulated prefill), is an error naming its line
//! number. A missing `output_length`
//! counts and defaults to 1; a missing `input_length` becomes `len(hash_ids) × B` (counted);
//! unsorted timestamps are sorted (stable); ids beyond the prompt length are dropped and a
//! prompt longer than its ids gets a unique tail (counted). Every adjustment is counted in
//! [`TraceStats`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// Unit of trace timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    /// Seconds.
    S,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
    /// Nanoseconds.
    Ns,
}

impl TimeUnit {
    const ALL: [TimeUnit; 4] = [TimeUnit::S, TimeUnit::Ms, TimeUnit::Us, TimeUnit::Ns];

    /// Units per second.
    pub fn per_second(self) -> f64 {
        match self {
            TimeUnit::S => 1.0,
            TimeUnit::Ms => 1e3,
            TimeUnit::Us => 1e6,
            TimeUnit::Ns => 1e9,
        }
    }

    /// Name as on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeUnit::S => "s",
            TimeUnit::Ms => "ms",
            TimeUnit::Us => "us",
            TimeUnit::Ns => "ns",
        }
    }

    /// Parse `s`, `ms`, `us` (or `µs`), `ns`.
    ///
    /// # Errors
    /// On any other string.
    pub fn parse(s: &str) -> Result<TimeUnit, String> {
        match s {
            "s" => Ok(TimeUnit::S),
            "ms" => Ok(TimeUnit::Ms),
            "us" | "µs" => Ok(TimeUnit::Us),
            "ns" => Ok(TimeUnit::Ns),
            other => Err(format!(
                "--time-unit: expected s, ms, us or ns, got {other}"
            )),
        }
    }
}

/// How to read a trace.
#[derive(Debug, Clone, Copy)]
pub struct TraceOptions {
    /// Multiplies every (relative) arrival time; < 1 = more load.
    pub time_scale: f64,
    /// Timestamp unit; `None` = detect.
    pub time_unit: Option<TimeUnit>,
    /// Tokens per block; `None` = infer.
    pub block_tokens: Option<u32>,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            time_scale: 1.0,
            time_unit: None,
            block_tokens: None,
        }
    }
}

/// What loading a trace did.
#[derive(Debug, Default, Clone)]
pub struct TraceStats {
    /// Lines read (non-empty).
    pub lines: usize,
    /// Requests kept.
    pub kept: usize,
    /// Adjusted requests by reason.
    pub adjusted: BTreeMap<String, usize>,
    /// Timestamps were not sorted.
    pub unsorted: bool,
    /// Timestamp unit used and why.
    pub unit: String,
    /// Tokens per block used and why.
    pub block: String,
    /// Tokens per block.
    pub block_tokens: u32,
}

impl TraceStats {
    /// One-line summary.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} lines, {} requests, time unit {}, block {}",
            self.lines, self.kept, self.unit, self.block
        );
        for (k, v) in &self.adjusted {
            let _ = write!(s, ", adjusted {v} ({k})");
        }
        if self.unsorted {
            s.push_str(", timestamps sorted");
        }
        s
    }

    fn adjust(&mut self, why: &str) {
        *self.adjusted.entry(why.to_string()).or_insert(0) += 1;
    }
}

fn as_u64(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.is_finite())
                .map(|f| f as u64)
        }),
        Value::String(s) => {
            let s = s.trim();
            s.parse().ok().or_else(|| {
                s.parse::<f64>()
                    .ok()
                    .filter(|f| *f >= 0.0 && f.is_finite())
                    .map(|f| f as u64)
            })
        }
        _ => None,
    }
}

/// A timestamp as written: an exact integer or a float.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ts {
    Int(i128),
    Float(f64),
}

impl Ts {
    fn parse(v: Option<&Value>) -> Option<Ts> {
        match v? {
            Value::Number(n) => n
                .as_i64()
                .map(|i| Ts::Int(i128::from(i)))
                .or_else(|| n.as_u64().map(|u| Ts::Int(i128::from(u))))
                .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(Ts::Float)),
            Value::String(s) => {
                let s = s.trim();
                s.parse::<i128>()
                    .map(Ts::Int)
                    .ok()
                    .or_else(|| {
                        s.parse::<f64>()
                            .ok()
                            .filter(|f| f.is_finite())
                            .map(Ts::Float)
                    })
                    .or_else(|| rfc3339_ns(s).map(Ts::Int))
            }
            _ => None,
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Ts::Int(i) => i as f64,
            Ts::Float(f) => f,
        }
    }

    /// `self − t0` in raw units (exact for integers).
    fn minus(self, t0: Ts) -> f64 {
        match (self, t0) {
            (Ts::Int(a), Ts::Int(b)) => (a - b) as f64,
            (a, b) => a.as_f64() - b.as_f64(),
        }
    }
}

/// An RFC 3339 / ISO 8601 date-time (`2026-12-01T10:00:00.250Z`, a space
/// instead of `T`, an offset `±HH:MM`, or no zone: UTC) as nanoseconds since
/// the Unix epoch (days from the civil date, Hinnant's algorithm). `None`
/// if it is not one.
fn rfc3339_ns(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        (!t.is_empty() && t.bytes().all(|c| c.is_ascii_digit())).then(|| t.parse().ok())?
    };
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac_ns: i128 = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        let mut end = start;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
        if end == start {
            return None;
        }
        let digits = s.get(start..end.min(start + 9))?;
        frac_ns = i128::from(digits.parse::<i64>().ok()?) * 10i128.pow(9 - digits.len() as u32);
        i = end;
    }
    let offset_s: i64 = match b.get(i) {
        None => 0,
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if b.len() == i + 6 && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            let o = oh * 3600 + om * 60;
            if sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(i128::from(secs) * 1_000_000_000 + frac_ns)
}

/// Detect the unit of timestamps from the first (smallest) absolute value
/// `t0` and the relative arrival times `rel` (raw units, sorted). Returns the
/// unit and a short reason.
pub fn detect_unit(t0: f64, rel: &[f64]) -> (TimeUnit, String) {
    let a = t0.abs();
    if a >= 1e8 {
        // Epoch: 1e8 s is 1973; 1e11 s is year 5138, so ≥ 1e11 is ms, etc.
        let u = if a < 1e11 {
            TimeUnit::S
        } else if a < 1e14 {
            TimeUnit::Ms
        } else if a < 1e17 {
            TimeUnit::Us
        } else {
            TimeUnit::Ns
        };
        return (u, format!("epoch magnitude {a:.2e}"));
    }
    let span = rel.last().copied().unwrap_or(0.0);
    if rel.len() < 2 || span <= 0.0 {
        return (TimeUnit::Ms, "no time span (assumed)".into());
    }
    let gaps = (rel.len() - 1) as f64;
    let mut best = (TimeUnit::Ms, f64::INFINITY, 0.0);
    for u in TimeUnit::ALL {
        let rate = gaps / (span / u.per_second());
        let d = (rate.log10() - 1.0).abs();
        if d < best.1 {
            best = (u, d, rate);
        }
    }
    (best.0, format!("mean rate {:.3} req/s", best.2))
}

/// Infer tokens per block from `(input_length, number of ids)` pairs; see the
/// module docs. Returns the size and a short reason.
///
/// A line with `n` ids fits `B` when `(n − 1)·B < input ≤ n·B`. First choice:
/// the power of two that fits the most lines with ≥ 2 ids, if it fits at least
/// half of them (traces are written with one block size; a few lines may be
/// inconsistent); then the smallest power of two in the interval that fits
/// every line, else its low end; then the median of `ceil(input / n)`.
pub fn infer_block_tokens(pairs: &[(u32, usize)]) -> (u32, String) {
    let (mut lo, mut hi) = (1u64, u64::MAX);
    let mut per: Vec<u64> = Vec::new();
    let mut multi = 0usize;
    let mut fits = [0usize; 17];
    for &(input, n) in pairs {
        if n == 0 || input == 0 {
            continue;
        }
        let (input, n) = (u64::from(input), n as u64);
        lo = lo.max(input.div_ceil(n));
        if n >= 2 {
            hi = hi.min((input - 1) / (n - 1));
            multi += 1;
            for (k, f) in fits.iter_mut().enumerate() {
                let b = 1u64 << k;
                if (n - 1) * b < input && input <= n * b {
                    *f += 1;
                }
            }
        }
        per.push(input.div_ceil(n));
    }
    if per.is_empty() {
        return (512, "512 (nothing to infer from)".into());
    }
    if let Some((k, &f)) = fits
        .iter()
        .enumerate()
        .max_by_key(|&(k, f)| (*f, usize::MAX - k))
    {
        if multi > 0 && 2 * f >= multi {
            let b = 1u32 << k;
            return (
                b,
                format!("{b} tokens (inferred: fits {f} of {multi} multi-block lines)"),
            );
        }
    }
    if lo <= hi {
        let mut p = 1u64;
        while p < lo {
            p *= 2;
        }
        let b = if p <= hi { p } else { lo };
        let b = b.min(1 << 20) as u32;
        return (b, format!("{b} tokens (inferred: fits every line)"));
    }
    per.sort_unstable();
    let med = per[per.len() / 2];
    let b = (2f64.powf((med.max(1) as f64).log2().round()) as u64).clamp(1, 1 << 20) as u32;
    (
        b,
        format!("{b} tokens (inferred from the median {med} tokens per id)"),
    )
}

struct Row {
    ts: Ts,
    input: Option<u32>,
    output: u32,
    ids: Vec<u64>,
    line: usize,
}

/// A block id: an exact 64-bit integer (a JSON number or a numeric string)
/// bit for bit, a negative one (a signed hash) as its two's complement; any
/// other string hashed from its text. `Err(id)` for a JSON number that is
/// not an exact 64-bit integer (past 64 bits or with a fraction): the JSON
/// reader kept only its float value, so the id is hashed from that (ids
/// closer than the float's precision collide; the caller counts them). Before,
/// such ids went through a saturating float cast: every number past 2^64
/// and every numeric string past it became `u64::MAX`, one id for all.
fn id_of(v: &Value) -> Option<Result<u64, u64>> {
    match v {
        Value::Number(n) => Some(
            n.as_u64()
                .or_else(|| n.as_i64().map(|i| i as u64))
                .ok_or_else(|| xxh3_64(n.to_string().as_bytes())),
        ),
        Value::String(s) => {
            let t = s.trim();
            Some(Ok(t
                .parse::<u64>()
                .ok()
                .or_else(|| t.parse::<i64>().ok().map(|i| i as u64))
                .unwrap_or_else(|| xxh3_64(s.as_bytes()))))
        }
        _ => None,
    }
}

/// A trace file's bytes as text; a compressed file is named as such
/// (decompress it first) instead of "not UTF-8".
fn text_of(bytes: Vec<u8>) -> Result<String, String> {
    let packed = [
        (&[0x1f, 0x8b][..], "gzip (gunzip it first)"),
        (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd (unzstd it first)"),
        (&[b'P', b'K', 3, 4][..], "zip (unzip it first)"),
        (&[b'B', b'Z', b'h'][..], "bzip2 (bunzip2 it first)"),
        (&[0xfd, b'7', b'z', b'X', b'Z'][..], "xz (unxz it first)"),
    ];
    if let Some((_, what)) = packed.iter().find(|(magic, _)| bytes.starts_with(magic)) {
        return Err(format!("compressed with {what}"));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "not UTF-8 text (byte {} of the file): a JSONL trace is text",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Largest `input_length` accepted: 2^24 tokens (16.8 M, above every served context).
pub const MAX_INPUT_TOKENS: u64 = 1 << 24;
/// Largest `output_length` accepted: 2^20 tokens.
pub const MAX_OUTPUT_TOKENS: u64 = 1 << 20;

/// One line: `Ok(None)` for a request with `input_length` 0 (nothing to
/// prefill: skipped and counted in the summary).
fn parse_line(line: &str, lineno: usize, st: &mut TraceStats) -> Result<Option<Row>, String> {
    match serde_json::from_str::<Value>(line) {
        Ok(v) => parse_value(v, lineno, st),
        Err(e) => Err(format!("not JSON ({e})")),
    }
}

/// One request object (a line, or an element of a JSON array file).
fn parse_value(v: Value, lineno: usize, st: &mut TraceStats) -> Result<Option<Row>, String> {
    let Value::Object(obj) = v else {
        return Err("not a JSON object".into());
    };
    let ts = Ts::parse(obj.get("timestamp"))
        .ok_or("no `timestamp` (a number, a numeric string or an RFC 3339 date-time)")?;
    let Some(Value::Array(ids)) = obj.get("hash_ids") else {
        return Err("no `hash_ids` array".into());
    };
    let mut out = Vec::with_capacity(ids.len());
    for v in ids {
        match id_of(v).ok_or("a `hash_ids` element is neither a number nor a string")? {
            Ok(id) => out.push(id),
            Err(id) => {
                st.adjust("hash_ids number past 64 bits or fractional: hashed from its float value (write such ids as strings to keep every digit)");
                out.push(id);
            }
        }
    }
    let ids = out;
    let input = match obj.get("input_length") {
        None | Some(Value::Null) => None,
        v => Some(as_u64(v).ok_or("`input_length` is not a number ≥ 0")?),
    };
    if input == Some(0) {
        st.adjust("input_length 0: line skipped");
        return Ok(None);
    }
    if let Some(i) = input.filter(|&i| i > MAX_INPUT_TOKENS) {
        return Err(format!(
            "`input_length` {i} is over {MAX_INPUT_TOKENS} tokens"
        ));
    }
    if input.is_none() && ids.is_empty() {
        return Err("neither `input_length` nor `hash_ids`".into());
    }
    let output = match as_u64(obj.get("output_length")) {
        Some(o) if o > MAX_OUTPUT_TOKENS => {
            return Err(format!(
                "`output_length` {o} is over {MAX_OUTPUT_TOKENS} tokens"
            ));
        }
        Some(o) => o.max(1),
        None => {
            st.adjust("missing output_length → 1");
            1
        }
    };
    Ok(Some(Row {
        ts,
        input: input.map(|i| i as u32),
        output: output as u32,
        ids,
        line: lineno,
    }))
}

/// One request of a trace, ready to be replayed.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRequest {
    /// Arrival, seconds after the first request, times the time scale.
    pub at_s: f64,
    /// Prompt tokens.
    pub input: u32,
    /// Generated tokens (≥ 1).
    pub output: u32,
    /// Block ids, at most `ceil(input / block)` (the prompt may go on past them: unique tail).
    pub ids: Vec<u64>,
    /// Line number in the file (1-based).
    pub line: usize,
}

/// Parse trace text into requests sorted by arrival.
///
/// # Errors
/// A malformed line (with its number), a bad option, or no request at all.
pub fn parse_requests(
    text: &str,
    opt: &TraceOptions,
    name: &str,
) -> Result<(Vec<TraceRequest>, TraceStats), String> {
    let time_scale = opt.time_scale;
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err(format!("--time-scale must be > 0, got {time_scale}"));
    }
    if opt.block_tokens == Some(0) {
        return Err("--block-tokens must be > 0".into());
    }
    let mut st = TraceStats::default();
    let mut rows: Vec<Row> = Vec::new();
    // A UTF-8 byte order mark (files saved by some Windows tools).
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let array = text.trim_start().starts_with('[');
    if array {
        // A JSON array of request objects (not JSONL): elements are numbered
        // like lines.
        let all: Vec<Value> = serde_json::from_str(text)
            .map_err(|e| format!("trace {name}: a JSON array that does not parse ({e})"))?;
        for (i, v) in all.into_iter().enumerate() {
            st.lines += 1;
            let row = parse_value(v, i + 1, &mut st)
                .map_err(|e| format!("trace {name} element {}: {e}", i + 1))?;
            rows.extend(row);
        }
    }
    for (i, line) in text.lines().enumerate().filter(|_| !array) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        st.lines += 1;
        let row = parse_line(line, i + 1, &mut st)
            .map_err(|e| format!("trace {name} line {}: {e}", i + 1))?;
        rows.extend(row);
    }
    if rows.is_empty() {
        return Err(format!("trace {name}: no request"));
    }
    let block = match opt.block_tokens {
        Some(b) => {
            st.block = format!("{b} tokens (--block-tokens)");
            b
        }
        None => {
            let pairs: Vec<(u32, usize)> = rows
                .iter()
                .filter_map(|r| r.input.map(|i| (i, r.ids.len())))
                .collect();
            let (b, why) = infer_block_tokens(&pairs);
            st.block = why;
            b
        }
    };
    st.block_tokens = block;
    if rows.windows(2).any(|w| w[1].ts.as_f64() < w[0].ts.as_f64()) {
        st.unsorted = true;
    }
    let all_int = rows.iter().all(|r| matches!(r.ts, Ts::Int(_)));
    let t0 = if all_int {
        rows.iter()
            .filter_map(|r| match r.ts {
                Ts::Int(i) => Some(i),
                Ts::Float(_) => None,
            })
            .min()
            .map_or(Ts::Int(0), Ts::Int)
    } else {
        Ts::Float(
            rows.iter()
                .map(|r| r.ts.as_f64())
                .fold(f64::INFINITY, f64::min),
        )
    };
    let mut rel: Vec<(f64, usize)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.ts.minus(t0), i))
        .collect();
    rel.sort_by(|a, b| a.0.total_cmp(&b.0));
    let sorted: Vec<f64> = rel.iter().map(|x| x.0).collect();
    let unit = match opt.time_unit {
        Some(u) => {
            st.unit = format!("{} (--time-unit)", u.as_str());
            u
        }
        None => {
            let (u, why) = detect_unit(t0.as_f64(), &sorted);
            st.unit = format!(
                "{} (detected: {why}; override with --time-unit)",
                u.as_str()
            );
            u
        }
    };
    st.kept = rows.len();
    let mut out = Vec::with_capacity(rows.len());
    for &(t, i) in &rel {
        let r = &mut rows[i];
        let input = match r.input {
            Some(n) => n,
            None => {
                st.adjust("missing input_length → len(hash_ids) × block");
                (r.ids.len() as u64 * u64::from(block)).min(u64::from(u32::MAX / 4)) as u32
            }
        };
        let need = input.div_ceil(block) as usize;
        if r.ids.len() > need {
            st.adjust("more hash_ids than input_length needs (dropped)");
            r.ids.truncate(need);
        } else if r.ids.len() < need {
            st.adjust("input_length beyond hash_ids (unique tail)");
        }
        out.push(TraceRequest {
            at_s: t / unit.per_second() * time_scale,
            input,
            output: r.output,
            ids: std::mem::take(&mut r.ids),
            line: r.line,
        });
    }
    Ok((out, st))
}

/// Read and parse a trace file; also returns its file name.
///
/// # Errors
/// When the file cannot be read, a line is malformed or nothing is usable.
pub fn load_requests(
    path: &str,
    opt: &TraceOptions,
) -> Result<(Vec<TraceRequest>, TraceStats, String), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read trace {path}: {e}"))?;
    let text = text_of(bytes).map_err(|e| format!("cannot read trace {path}: {e}"))?;
    let name = std::path::Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned());
    let (reqs, st) = parse_requests(&text, opt, &name)?;
    Ok((reqs, st, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(scale: f64) -> TraceOptions {
        TraceOptions {
            time_scale: scale,
            ..TraceOptions::default()
        }
    }

    #[test]
    fn robust_parsing() {
        let text = "\n{\"timestamp\": 5000, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, 2], \"extra\": 1}\n\
                    {\"timestamp\": 1000, \"input_length\": 100, \"hash_ids\": [1]}\n\
                    {\"timestamp\": \"2000\", \"input_length\": \"2000\", \"output_length\": 1, \"hash_ids\": [1,2,3,4,5,6]}\n";
        let (r, st) = parse_requests(text, &opt(1.0), "t").unwrap();
        assert_eq!((st.lines, st.kept), (3, 3));
        assert!(st.unsorted);
        assert_eq!(st.block_tokens, 512, "{}", st.block);
        // Sorted: 1000, 2000, 5000 ms → 0, 1, 4 s.
        let at: Vec<f64> = r.iter().map(|x| x.at_s).collect();
        assert_eq!(at, vec![0.0, 1.0, 4.0]);
        assert_eq!(r[0].output, 1);
        // 2000 tokens need 4 blocks: 2 ids dropped, length kept.
        assert_eq!((r[1].input, r[1].ids.len()), (2000, 4));
        assert_eq!(r[1].line, 4);
        assert!(parse_requests("\n\n", &opt(1.0), "t").is_err());
        assert!(parse_requests(text, &opt(0.0), "t").is_err());
    }

    #[test]
    fn dates_a_byte_order_mark_signed_ids_and_empty_prompts() {
        assert_eq!(rfc3339_ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_ns("2000-03-01T00:00:00Z"),
            Some(951_868_800 * 1_000_000_000)
        );
        assert_eq!(
            rfc3339_ns("2026-12-01 10:00:00.25+01:00"),
            rfc3339_ns("2026-12-01T09:00:00.250Z")
        );
        assert_eq!(
            rfc3339_ns("2026-12-01T09:00:00"),
            rfc3339_ns("2026-12-01T09:00:00Z")
        );
        for bad in [
            "2026-13-01T00:00:00Z",
            "2026-12-01",
            "2026-12-01T09:00:00.Z",
            "x",
            "2026-12-01T09:00:00+1",
        ] {
            assert_eq!(rfc3339_ns(bad), None, "{bad}");
        }
        // A BOM, RFC 3339 arrivals 250 ms apart, a negative id, an empty prompt.
        let text = "\u{feff}{\"timestamp\": \"2026-12-01T09:00:00Z\", \"input_length\": 600, \"hash_ids\": [-1, 2]}\n\
                    {\"timestamp\": \"2026-12-01T09:00:00.250Z\", \"input_length\": 600, \"hash_ids\": [-1, 3]}\n\
                    {\"timestamp\": \"2026-12-01T09:00:00.500Z\", \"input_length\": 0, \"hash_ids\": []}\n";
        let (r, st) = parse_requests(text, &opt(1.0), "t").unwrap();
        assert_eq!(r.len(), 2);
        assert!((r[1].at_s - 0.25).abs() < 1e-9, "{:?} {}", r, st.summary());
        assert_eq!(r[0].ids[0], u64::MAX);
        assert_eq!(r[0].ids[0], r[1].ids[0]);
        assert!(st.summary().contains("input_length 0"), "{}", st.summary());
        // Ids past 64 bits stay distinct: as strings exactly, as numbers by
        // their float value (counted); a fractional id is not truncated.
        let text = "{\"timestamp\": 1, \"input_length\": 96, \"hash_ids\": [\"340282366920938463463374607431768211455\", 1180591620717411303424, 1.5]}\n\
                    {\"timestamp\": 2, \"input_length\": 96, \"hash_ids\": [\"340282366920938463463374607431768211454\", 2361183241434822606848, 1]}\n\
                    {\"timestamp\": 3, \"input_length\": 96, \"hash_ids\": [\"18446744073709551615\", \"-1\", \" 1 \"]}\n";
        let (r, st) = parse_requests(text, &opt(1.0), "t").unwrap();
        for i in 0..3 {
            assert_ne!(r[0].ids[i], r[1].ids[i], "id {i}: {:?}", r);
        }
        assert_eq!(
            (r[2].ids[0], r[2].ids[1], r[2].ids[2]),
            (u64::MAX, u64::MAX, 1)
        );
        assert_ne!(r[0].ids[0], u64::MAX);
        assert!(st.summary().contains("past 64 bits"), "{}", st.summary());
        // A JSON array file: the same requests, errors by element.
        let lines = "{\"timestamp\": 1, \"input_length\": 64, \"hash_ids\": [1, 2]}\n{\"timestamp\": 2, \"input_length\": 64, \"hash_ids\": [1, 3]}\n";
        let array = "[\n  {\"timestamp\": 1, \"input_length\": 64, \"hash_ids\": [1, 2]},\n  {\"timestamp\": 2, \"input_length\": 64, \"hash_ids\": [1, 3]}\n]";
        let (a, _) = parse_requests(lines, &opt(1.0), "t").unwrap();
        let (b, sb) = parse_requests(array, &opt(1.0), "t").unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(sb.lines, 2);
        let e = parse_requests("[{\"timestamp\": 1, \"hash_ids\": [1]}, 3]", &opt(1.0), "t")
            .unwrap_err();
        assert!(
            e.contains("element 2") && e.contains("not a JSON object"),
            "{e}"
        );
        let e = parse_requests("[{\"timestamp\": 1,", &opt(1.0), "t").unwrap_err();
        assert!(e.contains("JSON array"), "{e}");
        assert!(text_of(vec![0x1f, 0x8b, 8, 0])
            .unwrap_err()
            .contains("gzip"));
        assert!(text_of(vec![b'{', 0xff]).unwrap_err().contains("byte 1"));
        assert_eq!(text_of(b"{}".to_vec()).unwrap(), "{}");
        // Only empty prompts: no request.
        let e = parse_requests(
            "{\"timestamp\": 1, \"input_length\": 0, \"hash_ids\": []}",
            &opt(1.0),
            "t",
        );
        assert!(e.is_err());
    }

    #[test]
    fn malformed_line_names_its_number() {
        let text = "{\"timestamp\": 1, \"input_length\": 10, \"hash_ids\": [1]}\n\nnot json\n";
        let e = parse_requests(text, &opt(1.0), "t").unwrap_err();
        assert!(e.contains("line 3"), "{e}");
        let e = parse_requests("{\"timestamp\": 1, \"hash_ids\": 3}", &opt(1.0), "t").unwrap_err();
        assert!(e.contains("line 1") && e.contains("hash_ids"), "{e}");
        // Absurd sizes (a corrupt field) are errors, not hours of simulated prefill.
        let line = |i: u64, o: u64| {
            format!("{{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 5, \"hash_ids\": [1]}}\n{{\"timestamp\": 2, \"input_length\": {i}, \"output_length\": {o}, \"hash_ids\": [1]}}\n")
        };
        let e = parse_requests(&line(4_000_000_000, 5), &opt(1.0), "t").unwrap_err();
        assert!(e.contains("line 2") && e.contains("input_length"), "{e}");
        let e = parse_requests(&line(10, MAX_OUTPUT_TOKENS + 1), &opt(1.0), "t").unwrap_err();
        assert!(e.contains("line 2") && e.contains("output_length"), "{e}");
        let (r, _) =
            parse_requests(&line(MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS), &opt(1.0), "t").unwrap();
        assert_eq!((r[1].input, r[1].output), (1 << 24, 1 << 20));
    }

    #[test]
    fn nanosecond_strings_small_blocks() {
        let base: i128 = 1_732_950_000_123_456_789;
        let mut text = String::new();
        for i in 0..50i128 {
            let ts = base + i * 250_000_000; // 4 req/s
            let _ = writeln!(
                text,
                "{{\"timestamp\": \"{ts}\", \"input_length\": {}, \"output_length\": 7, \"hash_ids\": [{}, 100, 101, 102]}}",
                96 + 1 + (i % 31) as u32,
                i % 3
            );
        }
        let (r, st) = parse_requests(&text, &opt(1.0), "t").unwrap();
        assert_eq!(st.block_tokens, 32, "{}", st.block);
        assert!(st.unit.starts_with("ns"), "{}", st.unit);
        let last = r.last().map_or(-1.0, |x| x.at_s);
        assert!((last - 49.0 * 0.25).abs() < 1e-6, "{last}");
        // An explicit unit and block size win.
        let o = TraceOptions {
            time_unit: Some(TimeUnit::Us),
            block_tokens: Some(16),
            ..opt(1.0)
        };
        let (_, st) = parse_requests(&text, &o, "t").unwrap();
        assert!(st.unit.starts_with("us") && st.block_tokens == 16);
    }

    #[test]
    fn unit_detection_and_block_inference() {
        let rel: Vec<f64> = (0..100).map(|i| f64::from(i) * 300.0).collect();
        assert_eq!(detect_unit(0.0, &rel).0, TimeUnit::Ms);
        let rel: Vec<f64> = (0..100).map(|i| f64::from(i) * 0.3).collect();
        assert_eq!(detect_unit(0.0, &rel).0, TimeUnit::S);
        let rel: Vec<f64> = (0..100).map(|i| f64::from(i) * 3e5).collect();
        assert_eq!(detect_unit(0.0, &rel).0, TimeUnit::Us);
        assert_eq!(detect_unit(1.7e9, &rel).0, TimeUnit::S);
        assert_eq!(detect_unit(1.7e12, &rel).0, TimeUnit::Ms);
        assert_eq!(detect_unit(1.7e18, &rel).0, TimeUnit::Ns);
        assert_eq!(infer_block_tokens(&[(1000, 2), (513, 2), (300, 1)]).0, 512);
        assert_eq!(infer_block_tokens(&[(100, 4), (65, 3)]).0, 32);
    }
}
