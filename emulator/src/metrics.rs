//! The emulator's Prometheus counters, gauges and histograms, rendered with vLLM's names.
//!
//! Every series carries the labels `model_name="<--model>",engine="0"` like vLLM v1. Counters are
//! monotonic for the life of the process (`/admin/reset-cache` does not reset them). Rendering
//! is O(series) and takes the engine lock once (done by the caller, see `server`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::cache::CacheStats;
use crate::lock;

/// vLLM's bucket bounds for `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's bucket bounds for latency histograms in seconds (queue time, e2e latency).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A fixed-bucket histogram (cumulative on render).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<(Vec<u64>, f64, u64)>, // (per-bucket counts, sum, count)
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            state: Mutex::new((vec![0; bounds.len()], 0.0, 0)),
        }
    }

    pub fn observe(&self, v: f64) {
        let mut s = lock(&self.state);
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            s.0[i] += 1;
        }
        s.1 += v;
        s.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let s = lock(&self.state);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&s.0) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", s.2);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", s.1);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", s.2);
    }
}

/// All live metrics of one emulator.
#[derive(Debug)]
pub struct Metrics {
    pub running: AtomicI64,
    pub waiting: AtomicI64,
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Finished requests by `finished_reason` (`length`, `abort`).
    pub finished: Mutex<BTreeMap<&'static str, u64>>,
    /// Every HTTP request by (path class, status code): the emulator's own extra.
    pub requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Waiting requests per LoRA adapter.
    pub lora_waiting: Mutex<BTreeMap<String, i64>>,
    pub ttft: Histogram,
    pub queue_time: Histogram,
    pub e2e: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            running: AtomicI64::new(0),
            waiting: AtomicI64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            finished: Mutex::new(BTreeMap::new()),
            requests: Mutex::new(BTreeMap::new()),
            lora_waiting: Mutex::new(BTreeMap::new()),
            ttft: Histogram::new(TTFT_BUCKETS),
            queue_time: Histogram::new(LATENCY_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
        }
    }
}

/// What `render` needs besides the live metrics.
pub struct Snapshot<'a> {
    pub model: &'a str,
    pub id: &'a str,
    pub block_tokens: usize,
    pub cache_blocks: usize,
    pub max_running: usize,
    /// Resident LoRA adapters (`running_lora_adapters`) and the slot count (`max_lora`).
    pub lora_resident: &'a [String],
    pub max_lora: usize,
    /// Reported values that replace the live ones (see [`crate::overrides`]).
    pub overrides: crate::overrides::Overrides,
    pub kv_usage: f64,
    pub cached_blocks: usize,
    pub cache: CacheStats,
    pub uptime_s: f64,
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The override if set, else the live value.
fn reported(over: Option<f64>, live: f64) -> String {
    over.unwrap_or(live).to_string()
}

fn active(map: &Mutex<BTreeMap<String, i64>>) -> String {
    lock(map)
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

impl Metrics {
    pub fn count_request(&self, class: &'static str, status: u16) {
        *lock(&self.requests).entry((class, status)).or_insert(0) += 1;
    }

    pub fn count_finished(&self, reason: &'static str) {
        *lock(&self.finished).entry(reason).or_insert(0) += 1;
    }

    pub fn lora_add(&self, map: &Mutex<BTreeMap<String, i64>>, name: &str, delta: i64) {
        *lock(map).entry(name.to_string()).or_insert(0) += delta;
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn render(&self, s: &Snapshot<'_>) -> String {
        let l = format!("model_name=\"{}\",engine=\"0\"", esc(s.model));
        let mut o = String::with_capacity(8192);
        let gauge = |o: &mut String, name: &str, help: &str, v: String| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {v}"
            );
        };
        gauge(
            &mut o,
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            reported(s.overrides.running, self.running.load(Relaxed) as f64),
        );
        gauge(
            &mut o,
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            reported(s.overrides.waiting, self.waiting.load(Relaxed) as f64),
        );
        gauge(
            &mut o,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            reported(s.overrides.kv_usage, s.kv_usage),
        );
        gauge(
            &mut o,
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage (deprecated name, same value).",
            reported(s.overrides.kv_usage, s.kv_usage),
        );
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {v}"
            );
        };
        counter(
            &mut o,
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.cache.queries,
        );
        counter(
            &mut o,
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            s.cache.hits,
        );
        counter(
            &mut o,
            "vllm:gpu_prefix_cache_queries_total",
            "Prefix cache queries (deprecated name).",
            s.cache.queries,
        );
        counter(
            &mut o,
            "vllm:gpu_prefix_cache_hits_total",
            "Prefix cache hits (deprecated name).",
            s.cache.hits,
        );
        counter(
            &mut o,
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            self.prompt_tokens.load(Relaxed),
        );
        counter(
            &mut o,
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            self.generation_tokens.load(Relaxed),
        );
        counter(
            &mut o,
            "vllm:num_preemptions_total",
            "Cumulative number of preemptions.",
            s.cache.preemptions,
        );
        {
            let name = "vllm:request_success_total";
            let _ = writeln!(
                o,
                "# HELP {name} Count of successfully processed requests.\n# TYPE {name} counter"
            );
            let fin = lock(&self.finished);
            let n = fin.get("length").copied().unwrap_or(0);
            let _ = writeln!(o, "{name}{{{l},finished_reason=\"length\"}} {n}");
        }
        {
            let name = "vllm:lora_requests_info";
            let _ = writeln!(
                o,
                "# HELP {name} Running stats on lora requests.\n# TYPE {name} gauge\n\
                 {name}{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}",
                s.max_lora,
                esc(&s.lora_resident.join(",")),
                esc(&active(&self.lora_waiting)),
                s.uptime_s
            );
        }
        {
            let name = "vllm:cache_config_info";
            let _ = writeln!(
                o,
                "# HELP {name} Information of the LLMEngine CacheConfig\n# TYPE {name} gauge\n\
                 {name}{{block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",\
                 engine=\"0\",num_gpu_blocks=\"{}\"}} 1.0",
                s.block_tokens, s.cache_blocks
            );
        }
        self.ttft.render(
            &mut o,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &l,
        );
        self.queue_time.render(
            &mut o,
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &l,
        );
        self.e2e.render(
            &mut o,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &l,
        );
        // Emulator extras.
        let _ = writeln!(
            o,
            "# HELP emulator_info Emulator identity and limits.\n# TYPE emulator_info gauge\n\
             emulator_info{{id=\"{}\",model_name=\"{}\",max_running=\"{}\"}} 1",
            esc(s.id),
            esc(s.model),
            s.max_running
        );
        let _ = writeln!(
            o,
            "# HELP emulator_cached_blocks Blocks whose KV content is reusable.\n\
             # TYPE emulator_cached_blocks gauge\nemulator_cached_blocks{{{l}}} {}",
            s.cached_blocks
        );
        let _ = writeln!(
            o,
            "# HELP emulator_cache_evictions_total Cached blocks evicted.\n\
             # TYPE emulator_cache_evictions_total counter\nemulator_cache_evictions_total{{{l}}} {}",
            s.cache.evictions
        );
        let _ = writeln!(
            o,
            "# HELP emulator_requests_total HTTP requests by path class and status.\n\
             # TYPE emulator_requests_total counter"
        );
        for ((class, code), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                o,
                "emulator_requests_total{{path=\"{class}\",code=\"{code}\"}} {n}"
            );
        }
        let aborted = lock(&self.finished).get("abort").copied().unwrap_or(0);
        let _ = writeln!(
            o,
            "# HELP emulator_requests_aborted_total Generations cut short (client gone).\n\
             # TYPE emulator_requests_aborted_total counter\n\
             emulator_requests_aborted_total{{{l}}} {aborted}"
        );
        o
    }
}
