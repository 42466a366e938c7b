//! What the inference engines say about their own load: a hostile-input-safe
//! reader of their Prometheus `/metrics`, normalised across vLLM, SGLang and
//! llama.cpp, plus the saturation, LoRA-adapter and load views the router
//! uses.
//!
//! | field | vLLM | SGLang | llama.cpp |
//! |---|---|---|---|
//! | `waiting` | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` | `llamacpp:requests_deferred` |
//! | `running` | `vllm:num_requests_running` | `sglang:num_running_reqs` | `llamacpp:requests_processing` |
//! | `kv_usage` (0..1) | `vllm:kv_cache_usage_perc`, else `vllm:gpu_cache_usage_perc` | `sglang:token_usage` | `llamacpp:kv_cache_usage_ratio` |
//! | LoRA | `vllm:lora_requests_info{running_lora_adapters,waiting_lora_adapters,max_lora}` | – | – |
//!
//! **Aggregation.** One exposition may hold several series of a metric (one
//! per `model_name`, one per `engine` index when vLLM runs several engine
//! cores): counts are **summed**, usage takes the **max**. When several
//! engines' names appear, each field takes the first family in the table's
//! order (vLLM, SGLang, llama.cpp) that has a valid sample, so a server
//! exporting both vLLM KV names is not counted twice.
//!
//! **LoRA.** vLLM sets `vllm:lora_requests_info` to the current Unix time
//! under a label set that changes with the adapters, and old label sets stay
//! exported; the series with the **largest value** is the current one (ties:
//! the later line). With several `engine` label values, each engine's latest
//! series is taken, adapter lists are unioned and `max_lora` is the max.
//! Adapter lists are comma-separated, trimmed, deduplicated and capped at
//! [`MAX_ADAPTERS`] names of at most [`MAX_ADAPTER_NAME`] bytes.
//!
//! **Hostile input.** At most [`prom::MAX_TEXT`] bytes are read, lines longer
//! than [`prom::MAX_LINE`] are skipped, malformed lines are skipped, values
//! must be finite and ≥ 0 (NaN, ±Inf and negatives are ignored as unknown),
//! counts are clamped to [`MAX_COUNT`] and usage to `[0, 1]` (a server
//! reporting percent 0–100 therefore reads as full: it errs towards
//! "saturated", never towards "idle"). Cost: O(bytes read); unknown metric
//! names are rejected after the name is scanned, before any label is.
//! Nothing here panics, allocates more than O(bytes read), or needs a clock.

mod codec;
pub mod load;
pub mod prom;

/// Largest count (waiting or running requests) accepted per exposition.
pub const MAX_COUNT: f64 = 1e9;
/// Most adapter names kept per list.
pub const MAX_ADAPTERS: usize = 64;
/// Longest adapter name kept (bytes); longer names are dropped.
pub const MAX_ADAPTER_NAME: usize = 256;
/// Most distinct `engine` label values tracked for LoRA info.
const MAX_LORA_GROUPS: usize = 16;

/// One scrape of a replica's Prometheus text, normalised across engines.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineSample {
    /// Requests queued, not yet scheduled.
    pub waiting: Option<f64>,
    /// Requests being processed (prefill or decode).
    pub running: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
    /// Adapters of running requests (`running_lora_adapters`).
    pub loras_running: Vec<String>,
    /// Adapters of waiting requests (`waiting_lora_adapters`).
    pub loras_waiting: Vec<String>,
    /// Adapter slots of the engine (`max_lora`).
    pub max_lora: Option<u32>,
}

/// Saturation thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineLimits {
    /// Most waiting requests before the replica counts as saturated.
    pub max_queue: f64,
    /// Highest KV usage (0..1) before the replica counts as saturated.
    pub max_kv_usage: f64,
}

/// Which normalised field a metric name feeds, and its priority (lower wins).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Waiting(usize),
    Running(usize),
    Kv(usize),
    Lora,
}

const FAMILIES: usize = 4;

fn field_of(name: &[u8]) -> Option<Field> {
    Some(match name {
        b"vllm:num_requests_waiting" => Field::Waiting(0),
        b"sglang:num_queue_reqs" => Field::Waiting(1),
        b"llamacpp:requests_deferred" => Field::Waiting(2),
        b"vllm:num_requests_running" => Field::Running(0),
        b"sglang:num_running_reqs" => Field::Running(1),
        b"llamacpp:requests_processing" => Field::Running(2),
        b"vllm:kv_cache_usage_perc" => Field::Kv(0),
        b"vllm:gpu_cache_usage_perc" => Field::Kv(1),
        b"sglang:token_usage" => Field::Kv(2),
        b"llamacpp:kv_cache_usage_ratio" => Field::Kv(3),
        b"vllm:lora_requests_info" => Field::Lora,
        _ => return None,
    })
}

/// The latest `vllm:lora_requests_info` series of one engine.
struct LoraGroup {
    engine: String,
    stamp: f64,
    running: Vec<String>,
    waiting: Vec<String>,
    max_lora: Option<u32>,
}

/// Parses one Prometheus exposition. Never panics; O(`text.len()`) bounded by
/// [`prom::MAX_TEXT`]; see the module doc for the rules.
pub fn parse_metrics(text: &[u8]) -> EngineSample {
    let mut waiting = [None::<f64>; FAMILIES];
    let mut running = [None::<f64>; FAMILIES];
    let mut kv = [None::<f64>; FAMILIES];
    let mut lora: Vec<LoraGroup> = Vec::new();
    for line in prom::lines(text) {
        let Some(field) = prom::name_of(line).and_then(field_of) else {
            continue;
        };
        let Some(sample) = prom::parse_line(line) else {
            continue;
        };
        let v = sample.value;
        if !v.is_finite() || v < 0.0 {
            continue;
        }
        match field {
            Field::Waiting(p) => add(&mut waiting, p, v),
            Field::Running(p) => add(&mut running, p, v),
            Field::Kv(p) => {
                if let Some(slot) = kv.get_mut(p) {
                    *slot = Some(slot.map_or(v, |old| old.max(v)).min(1.0));
                }
            }
            Field::Lora => lora_sample(&mut lora, sample.labels, v),
        }
    }
    let mut out = EngineSample {
        waiting: first(&waiting),
        running: first(&running),
        kv_usage: first(&kv),
        ..EngineSample::default()
    };
    for g in lora {
        union_into(&mut out.loras_running, g.running);
        union_into(&mut out.loras_waiting, g.waiting);
        out.max_lora = out.max_lora.max(g.max_lora);
    }
    out
}

fn add(acc: &mut [Option<f64>; FAMILIES], p: usize, v: f64) {
    if let Some(slot) = acc.get_mut(p) {
        *slot = Some((slot.unwrap_or(0.0) + v).min(MAX_COUNT));
    }
}

fn first(acc: &[Option<f64>; FAMILIES]) -> Option<f64> {
    acc.iter().flatten().next().copied()
}

fn lora_sample(groups: &mut Vec<LoraGroup>, labels: &[u8], stamp: f64) {
    let engine = prom::label(labels, b"engine").unwrap_or_default();
    let idx = match groups.iter().position(|g| g.engine == engine) {
        Some(i) => i,
        None if groups.len() < MAX_LORA_GROUPS => {
            groups.push(LoraGroup {
                engine,
                stamp: f64::NEG_INFINITY,
                running: Vec::new(),
                waiting: Vec::new(),
                max_lora: None,
            });
            groups.len() - 1
        }
        None => return,
    };
    let Some(g) = groups.get_mut(idx) else {
        return;
    };
    if stamp < g.stamp {
        return;
    }
    g.stamp = stamp;
    g.running = adapters(prom::label(labels, b"running_lora_adapters").as_deref());
    g.waiting = adapters(prom::label(labels, b"waiting_lora_adapters").as_deref());
    g.max_lora = prom::label(labels, b"max_lora").and_then(|s| parse_slots(&s));
}

/// `"a, b,,a"` → `["a", "b"]`, capped (see module doc).
fn adapters(list: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    union_into(
        &mut out,
        list.unwrap_or("")
            .split(',')
            .map(str::trim)
            .map(str::to_owned)
            .collect(),
    );
    out
}

fn union_into(dst: &mut Vec<String>, src: Vec<String>) {
    for name in src {
        if dst.len() >= MAX_ADAPTERS {
            return;
        }
        if !name.is_empty() && name.len() <= MAX_ADAPTER_NAME && !dst.contains(&name) {
            dst.push(name);
        }
    }
}

/// `max_lora` label: an integer, or an integral float such as `"4.0"`.
fn parse_slots(s: &str) -> Option<u32> {
    let s = s.trim();
    s.parse::<u32>().ok().or_else(|| {
        let f = s.parse::<f64>().ok()?;
        (f.is_finite() && f >= 0.0 && f <= f64::from(u32::MAX) && f.fract() == 0.0)
            .then_some(f as u32)
    })
}

impl EngineSample {
    /// Compact bytes for proxy-wasm shared data (see [`EngineSample::decode`]).
    /// Non-finite or negative numbers are written as unknown; lists beyond the
    /// caps are truncated, so `decode(encode(s)) == s` for every sample
    /// [`parse_metrics`] returns.
    pub fn encode(&self) -> Vec<u8> {
        codec::encode(self)
    }

    /// Inverse of [`EngineSample::encode`]; `None` for anything it would not
    /// have written (wrong version, truncated, trailing bytes, bad UTF-8,
    /// over-cap lists, non-finite numbers).
    pub fn decode(b: &[u8]) -> Option<EngineSample> {
        codec::decode(b)
    }
}

/// Over either limit (strictly greater). Unknown values, and NaN limits,
/// never saturate.
pub fn saturated(s: &EngineSample, l: &EngineLimits) -> bool {
    s.waiting.is_some_and(|w| w > l.max_queue) || s.kv_usage.is_some_and(|k| k > l.max_kv_usage)
}

/// 0 = adapter loaded (in the running or waiting list), 1 = a free adapter
/// slot (distinct adapters listed < `max_lora`), 2 = neither / unknown.
pub fn lora_tier(s: &EngineSample, adapter: &str) -> u8 {
    let listed = |a: &String| a == adapter;
    if s.loras_running.iter().any(listed) || s.loras_waiting.iter().any(listed) {
        return 0;
    }
    let used = s.loras_running.len()
        + s.loras_waiting
            .iter()
            .filter(|w| !s.loras_running.contains(w))
            .count();
    match s.max_lora {
        Some(max) if used < max as usize => 1,
        _ => 2,
    }
}

/// Engine-reported load in requests: waiting + running, counting only the
/// known parts; `None` when neither is known.
pub fn engine_load(s: &EngineSample) -> Option<f64> {
    match (s.waiting, s.running) {
        (None, None) => None,
        (w, r) => Some(w.unwrap_or(0.0) + r.unwrap_or(0.0)),
    }
}

#[cfg(test)]
mod tests;
