//! Counters before/after a run (replica `/metrics`, Envoy admin), the JSON summary, the one-line
//! human report and the side-by-side table of several summaries.
//!
//! Server-side hit rate = Σ Δhits / Σ Δqueries over the replicas, where for vLLM (and the
//! emulator) hits = `vllm:prefix_cache_hits_total`, queries = `vllm:prefix_cache_queries_total`,
//! and for llama.cpp hits = `llamacpp:prompt_tokens_cached_total`, queries =
//! `llamacpp:prompt_tokens_total` (which excludes cached tokens) + hits.
//!
//! Requests per replica come from the first source that has data: the `x-replica-id` response
//! header (client side), Envoy's per-host `rq_total` (admin `/clusters`), the replicas'
//! `vllm:request_success_total`.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::client::Client;
use crate::load::runner::Outcome;
use crate::prom;

/// One replica's counters at one moment.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ReplicaCounters {
    pub url: String,
    /// `emulator_info{id}` when the replica is an emulator.
    pub id: Option<String>,
    pub kind: String,
    pub queries: f64,
    pub hits: f64,
    pub requests: Option<f64>,
    pub error: Option<String>,
}

/// Scrapes `url/metrics`.
pub async fn scrape_replica(url: &str) -> ReplicaCounters {
    let mut c = ReplicaCounters {
        url: url.to_string(),
        ..Default::default()
    };
    let client = match Client::new(url) {
        Ok(cl) => cl,
        Err(e) => {
            c.error = Some(e.to_string());
            return c;
        }
    };
    let text = match client.get_text("/metrics").await {
        Ok((200, t)) => t,
        Ok((s, _)) => {
            c.error = Some(format!("HTTP {s}"));
            return c;
        }
        Err(e) => {
            c.error = Some(e.to_string());
            return c;
        }
    };
    counters_from_metrics(c, &text)
}

/// Reads the prefix-cache counters of a vLLM/emulator or llama.cpp `/metrics` text.
pub fn counters_from_metrics(mut c: ReplicaCounters, text: &str) -> ReplicaCounters {
    let samples = prom::parse(text);
    let sums = prom::sum_by_name(&samples);
    c.id = samples
        .iter()
        .find(|s| s.name == "emulator_info")
        .and_then(|s| s.label("id"));
    if let (Some(q), Some(h)) = (
        sums.get("vllm:prefix_cache_queries_total"),
        sums.get("vllm:prefix_cache_hits_total"),
    ) {
        c.kind = "vllm".into();
        c.queries = *q;
        c.hits = *h;
        c.requests = sums.get("vllm:request_success_total").copied();
    } else if let Some(h) = sums.get("llamacpp:prompt_tokens_cached_total") {
        c.kind = "llamacpp".into();
        c.hits = *h;
        c.queries = sums
            .get("llamacpp:prompt_tokens_total")
            .copied()
            .unwrap_or(0.0)
            + h;
    } else {
        c.kind = "unknown".into();
        c.error = Some("no prefix-cache counters in /metrics".into());
    }
    c
}

/// Envoy admin counters at one moment.
#[derive(Debug, Clone, Default)]
pub struct EnvoyCounters {
    /// `prefix_router` counters.
    pub stats: BTreeMap<String, u64>,
    /// `prefix_router` gauges (e.g. per-endpoint in-flight counts).
    pub gauges: BTreeMap<String, u64>,
    pub host_rq: BTreeMap<(String, String), u64>,
    pub error: Option<String>,
}

pub async fn scrape_envoy(admin: &str) -> EnvoyCounters {
    let mut e = EnvoyCounters::default();
    let client = match Client::new(admin) {
        Ok(c) => c,
        Err(err) => {
            e.error = Some(err.to_string());
            return e;
        }
    };
    match client
        .get_text("/stats?filter=prefix_router&type=Counters")
        .await
    {
        Ok((200, t)) => e.stats = prom::envoy_stats(&t),
        Ok((s, _)) => e.error = Some(format!("/stats: HTTP {s}")),
        Err(err) => e.error = Some(format!("/stats: {err}")),
    }
    if let Ok((200, t)) = client
        .get_text("/stats?filter=prefix_router&type=Gauges")
        .await
    {
        e.gauges = prom::envoy_stats(&t);
    }
    match client.get_text("/clusters").await {
        Ok((200, t)) => e.host_rq = prom::envoy_host_rq_total(&t),
        Ok((s, _)) => e.error = Some(format!("/clusters: HTTP {s}")),
        Err(err) => e.error = Some(format!("/clusters: {err}")),
    }
    e
}

/// Nearest-rank percentiles and mean of a sample (ms).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Dist {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Dist {
    pub fn of(mut v: Vec<f64>) -> Dist {
        if v.is_empty() {
            return Dist::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Dist {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: v[0],
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// One replica in the summary.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ReplicaSummary {
    /// The replica's URL (when given with `--replica`).
    pub url: Option<String>,
    /// The replica's id (`x-replica-id`, `emulator_info`, or Envoy's host address).
    pub id: Option<String>,
    pub requests: u64,
    pub share: f64,
    /// Δ prefix-cache queries / hits (tokens), from the replica's metrics.
    pub queries: Option<f64>,
    pub hits: Option<f64>,
    pub hit_rate: Option<f64>,
}

/// Envoy's prefix_router counters during the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EnvoySummary {
    /// Every counter whose name contains `prefix_router`, as a difference.
    pub counters: BTreeMap<String, u64>,
    /// `...branch.<name>` counters, by branch name.
    pub branches: BTreeMap<String, u64>,
    pub hit: u64,
    pub spill: u64,
    /// Prefix-strategy fallbacks: every branch other than hit, spill and the baselines
    /// (least_loaded, no_key, bad_input, ...).
    pub fallback: u64,
    /// Decisions of the baseline strategies (random, round_robin, least_request).
    pub baseline: u64,
    /// spill / (hit + spill + fallback).
    pub spill_rate: Option<f64>,
    /// `prefix_router` gauges after the run (per-endpoint in-flight counts should be 0 again).
    pub gauges_after: BTreeMap<String, u64>,
    pub error: Option<String>,
}

/// The machine-readable result of one run (`--json FILE`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub label: String,
    pub workload: String,
    pub seed: u64,
    pub url: String,
    pub path: String,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub max_tokens: usize,
    pub requests: usize,
    pub ok: usize,
    pub errors: usize,
    pub status_counts: BTreeMap<String, usize>,
    pub first_errors: Vec<String>,
    pub duration_s: f64,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    pub ttft_ms: Dist,
    pub latency_ms: Dist,
    /// Server-side hit rate from the replicas' counters (None without `--replica`).
    pub hit_rate: Option<f64>,
    pub hit_rate_source: Option<String>,
    /// Σ cached_tokens / Σ prompt_tokens from the responses' usage.
    pub client_hit_rate: Option<f64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub replicas: Vec<ReplicaSummary>,
    pub share_source: Option<String>,
    pub share_min: Option<f64>,
    pub share_max: Option<f64>,
    /// Values of `x-prefix-router-decision` seen in responses (if the upstream echoes them).
    pub decisions: BTreeMap<String, usize>,
    pub envoy: Option<EnvoySummary>,
    /// TTFT per workload part (mixed runs).
    pub ttft_by_kind: BTreeMap<String, Dist>,
}

fn delta(a: u64, b: u64) -> u64 {
    b.saturating_sub(a)
}

/// Envoy counter differences, with branches picked out generically.
pub fn envoy_summary(before: &EnvoyCounters, after: &EnvoyCounters) -> EnvoySummary {
    let mut s = EnvoySummary {
        error: after.error.clone().or(before.error.clone()),
        ..Default::default()
    };
    for (k, v) in &after.stats {
        if !k.contains("prefix_router") {
            continue;
        }
        let d = delta(before.stats.get(k).copied().unwrap_or(0), *v);
        s.counters.insert(k.clone(), d);
        if let Some((_, branch)) = k.rsplit_once(".branch.") {
            *s.branches.entry(branch.to_string()).or_insert(0) += d;
        }
    }
    for (b, n) in &s.branches {
        match b.as_str() {
            "hit" => s.hit += n,
            "spill" => s.spill += n,
            "random" | "round_robin" | "least_request" => s.baseline += n,
            _ => s.fallback += n,
        }
    }
    let prefix_total = s.hit + s.spill + s.fallback;
    s.spill_rate = (prefix_total > 0).then(|| s.spill as f64 / prefix_total as f64);
    s.gauges_after = after.gauges.clone();
    s
}

/// Inputs of [`summarize`] besides the outcomes.
pub struct RunInfo {
    pub label: String,
    pub workload: String,
    pub seed: u64,
    pub url: String,
    pub path: String,
    pub concurrency: usize,
    pub rate: Option<f64>,
    pub max_tokens: usize,
    pub duration_s: f64,
}

/// Builds the summary from outcomes and before/after counters.
pub fn summarize(
    info: RunInfo,
    outcomes: &[Outcome],
    replicas: &[(ReplicaCounters, ReplicaCounters)],
    envoy: Option<(&EnvoyCounters, &EnvoyCounters)>,
) -> Summary {
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok()).collect();
    let mut s = Summary {
        label: info.label,
        workload: info.workload,
        seed: info.seed,
        url: info.url,
        path: info.path,
        concurrency: info.concurrency,
        rate: info.rate,
        max_tokens: info.max_tokens,
        requests: outcomes.len(),
        ok: ok.len(),
        errors: outcomes.len() - ok.len(),
        duration_s: info.duration_s,
        ..Default::default()
    };
    for o in outcomes {
        let key = if o.status == 0 {
            "transport".to_string()
        } else {
            o.status.to_string()
        };
        *s.status_counts.entry(key).or_insert(0) += 1;
        if let (Some(e), true) = (&o.error, s.first_errors.len() < 5) {
            s.first_errors.push(format!("#{} {}", o.index, e));
        }
        if let Some(d) = &o.decision {
            *s.decisions.entry(d.clone()).or_insert(0) += 1;
        }
    }
    if s.duration_s > 0.0 {
        s.throughput_rps = s.ok as f64 / s.duration_s;
        let out: u64 = ok
            .iter()
            .map(|o| o.completion_tokens.unwrap_or(o.chunks))
            .sum();
        s.output_tokens_per_s = out as f64 / s.duration_s;
    }
    s.ttft_ms = Dist::of(ok.iter().filter_map(|o| o.ttft_ms).collect());
    s.latency_ms = Dist::of(ok.iter().map(|o| o.latency_ms).collect());
    let mut kinds: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for o in &ok {
        if let Some(t) = o.ttft_ms {
            kinds.entry(o.kind.clone()).or_default().push(t);
        }
    }
    s.ttft_by_kind = kinds.into_iter().map(|(k, v)| (k, Dist::of(v))).collect();
    s.prompt_tokens = ok.iter().filter_map(|o| o.prompt_tokens).sum();
    s.cached_tokens = ok.iter().filter_map(|o| o.cached_tokens).sum();
    if ok.iter().any(|o| o.cached_tokens.is_some()) && s.prompt_tokens > 0 {
        s.client_hit_rate = Some(s.cached_tokens as f64 / s.prompt_tokens as f64);
    }

    // Server-side counters.
    let mut rows: Vec<ReplicaSummary> = Vec::new();
    let (mut q, mut h) = (0.0, 0.0);
    let mut kinds_seen: Vec<String> = Vec::new();
    for (b, a) in replicas {
        let mut r = ReplicaSummary {
            url: Some(a.url.clone()),
            id: a.id.clone().or(b.id.clone()),
            ..Default::default()
        };
        if a.error.is_none() && b.error.is_none() {
            let dq = (a.queries - b.queries).max(0.0);
            let dh = (a.hits - b.hits).max(0.0);
            q += dq;
            h += dh;
            r.queries = Some(dq);
            r.hits = Some(dh);
            r.hit_rate = (dq > 0.0).then(|| dh / dq);
            if !kinds_seen.contains(&a.kind) {
                kinds_seen.push(a.kind.clone());
            }
        }
        rows.push(r);
    }
    if q > 0.0 {
        s.hit_rate = Some(h / q);
        s.hit_rate_source = Some(kinds_seen.join("+"));
    }

    // Requests per replica.
    let by_header: BTreeMap<String, u64> =
        ok.iter()
            .filter_map(|o| o.replica.clone())
            .fold(BTreeMap::new(), |mut m, id| {
                *m.entry(id).or_insert(0) += 1;
                m
            });
    let port_of = |url: &str| {
        crate::client::BaseUrl::parse(url)
            .ok()
            .and_then(|u| u.port())
    };
    let find_row = |rows: &mut Vec<ReplicaSummary>, id: &str| -> usize {
        let pos = rows.iter().position(|r| {
            r.id.as_deref() == Some(id)
                || r.url
                    .as_deref()
                    .and_then(port_of)
                    .map(|p| p.to_string())
                    .as_deref()
                    == Some(id)
                || r.url
                    .as_deref()
                    .is_some_and(|u| u.ends_with(&format!("//{id}")))
        });
        pos.unwrap_or_else(|| {
            rows.push(ReplicaSummary {
                id: Some(id.to_string()),
                ..Default::default()
            });
            rows.len() - 1
        })
    };
    let envoy_hosts: BTreeMap<String, u64> = match envoy {
        Some((b, a)) => a
            .host_rq
            .iter()
            .fold(BTreeMap::new(), |mut m, ((_, host), v)| {
                let before = b
                    .host_rq
                    .iter()
                    .find(|((_, h), _)| h == host)
                    .map(|(_, v)| *v);
                *m.entry(host.clone()).or_insert(0) += delta(before.unwrap_or(0), *v);
                m
            }),
        None => BTreeMap::new(),
    };
    if !by_header.is_empty() {
        s.share_source = Some("x-replica-id".into());
        for (id, n) in &by_header {
            let i = find_row(&mut rows, id);
            rows[i].requests = *n;
            if rows[i].id.is_none() {
                rows[i].id = Some(id.clone());
            }
        }
    } else if envoy_hosts.values().any(|v| *v > 0) {
        s.share_source = Some("envoy rq_total".into());
        for (host, n) in envoy_hosts.iter().filter(|(_, n)| **n > 0) {
            let i = find_row(&mut rows, host);
            rows[i].requests = *n;
        }
    } else if replicas.iter().any(|(_, a)| a.requests.is_some()) {
        s.share_source = Some("vllm:request_success_total".into());
        for (row, (b, a)) in rows.iter_mut().zip(replicas) {
            if let (Some(x), Some(y)) = (b.requests, a.requests) {
                row.requests = (y - x).max(0.0) as u64;
            }
        }
    }
    let total: u64 = rows.iter().map(|r| r.requests).sum();
    if total > 0 {
        for r in &mut rows {
            r.share = r.requests as f64 / total as f64;
        }
        // Replicas given with --replica that got nothing still count (share 0).
        s.share_min = rows.iter().map(|r| r.share).reduce(f64::min);
        s.share_max = rows.iter().map(|r| r.share).reduce(f64::max);
    }
    s.replicas = rows;
    s.envoy = envoy.map(|(b, a)| envoy_summary(b, a));
    s
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// The one-line human report of a run.
pub fn human_line(s: &Summary) -> String {
    let mut o = format!(
        "[{}] {} n={} ok={} err={} | hit {} (server), {} (usage) | TTFT p50 {:.1} p90 {:.1} p99 {:.1} ms \
         | {:.1} req/s",
        s.label,
        s.workload,
        s.requests,
        s.ok,
        s.errors,
        pct(s.hit_rate),
        pct(s.client_hit_rate),
        s.ttft_ms.p50,
        s.ttft_ms.p90,
        s.ttft_ms.p99,
        s.throughput_rps
    );
    if let (Some(a), Some(b)) = (s.share_min, s.share_max) {
        let _ = write!(
            o,
            " | share min {} max {} ({} replicas)",
            pct(Some(a)),
            pct(Some(b)),
            s.replicas.len()
        );
    }
    if let Some(e) = &s.envoy {
        if e.hit + e.spill + e.fallback > 0 {
            let _ = write!(
                o,
                " | router hit {} spill {} fallback {}",
                e.hit, e.spill, e.fallback
            );
        } else if e.baseline > 0 {
            let _ = write!(o, " | router baseline {}", e.baseline);
        }
    }
    o
}

/// Side-by-side table of several summaries (columns = runs, by label). Later columns show the
/// change of TTFT against the first column.
pub fn table(runs: &[Summary]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut add = |name: &str, f: &dyn Fn(&Summary) -> String| {
        rows.push((name.to_string(), runs.iter().map(f).collect()));
    };
    let rel = |v: f64, base: f64| -> String {
        if base > 0.0 && (v - base).abs() > 1e-9 {
            format!(" ({:+.0}%)", (v - base) / base * 100.0)
        } else {
            String::new()
        }
    };
    let base = runs.first().cloned().unwrap_or_default();
    add("workload", &|s| s.workload.clone());
    add("requests (ok/err)", &|s| format!("{}/{}", s.ok, s.errors));
    add("hit rate (server)", &|s| pct(s.hit_rate));
    add("hit rate (usage)", &|s| pct(s.client_hit_rate));
    add("TTFT p50 ms", &|s| {
        format!(
            "{:.1}{}",
            s.ttft_ms.p50,
            rel(s.ttft_ms.p50, base.ttft_ms.p50)
        )
    });
    add("TTFT p90 ms", &|s| {
        format!(
            "{:.1}{}",
            s.ttft_ms.p90,
            rel(s.ttft_ms.p90, base.ttft_ms.p90)
        )
    });
    add("TTFT p99 ms", &|s| {
        format!(
            "{:.1}{}",
            s.ttft_ms.p99,
            rel(s.ttft_ms.p99, base.ttft_ms.p99)
        )
    });
    add("latency p50 ms", &|s| format!("{:.1}", s.latency_ms.p50));
    add("throughput req/s", &|s| {
        format!(
            "{:.2}{}",
            s.throughput_rps,
            rel(s.throughput_rps, base.throughput_rps)
        )
    });
    add("share min/max", &|s| {
        format!("{} / {}", pct(s.share_min), pct(s.share_max))
    });
    add("router hit/spill/fallback", &|s| match &s.envoy {
        Some(e) if e.hit + e.spill + e.fallback > 0 => {
            format!("{}/{}/{}", e.hit, e.spill, e.fallback)
        }
        Some(e) if e.baseline > 0 => format!("baseline {}", e.baseline),
        _ => "-".into(),
    });
    add("router spill rate", &|s| {
        pct(s.envoy.as_ref().and_then(|e| e.spill_rate))
    });
    let head: Vec<String> = runs.iter().map(|s| s.label.clone()).collect();
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(6);
    let widths: Vec<usize> = (0..runs.len())
        .map(|i| {
            rows.iter()
                .map(|r| r.1[i].len())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(out, "{:<w0$}", "metric");
    for (h, w) in head.iter().zip(&widths) {
        let _ = write!(out, " | {h:>w$}");
    }
    out.push('\n');
    let _ = write!(out, "{}", "-".repeat(w0));
    for w in &widths {
        let _ = write!(out, "-+-{}", "-".repeat(*w));
    }
    out.push('\n');
    for (name, vals) in &rows {
        let _ = write!(out, "{name:<w0$}");
        for (v, w) in vals.iter().zip(&widths) {
            let _ = write!(out, " | {v:>w$}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_and_llamacpp_counters() {
        let base = || ReplicaCounters {
            url: "http://127.0.0.1:1".into(),
            ..Default::default()
        };
        let v = counters_from_metrics(
            base(),
            "vllm:prefix_cache_queries_total{model_name=\"m\"} 100\n\
             vllm:prefix_cache_hits_total{model_name=\"m\"} 40\n\
             vllm:request_success_total{finished_reason=\"length\"} 3\n\
             vllm:request_success_total{finished_reason=\"stop\"} 2\n\
             emulator_info{id=\"r1\",model_name=\"m\"} 1\n",
        );
        assert_eq!((v.kind.as_str(), v.queries, v.hits), ("vllm", 100.0, 40.0));
        assert_eq!((v.requests, v.id.as_deref()), (Some(5.0), Some("r1")));
        let l = counters_from_metrics(
            base(),
            "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1129\n\
             llamacpp:prompt_tokens_cached_total 2057\nllamacpp:tokens_predicted_total 80\n",
        );
        assert_eq!(
            (l.kind.as_str(), l.queries, l.hits),
            ("llamacpp", 3186.0, 2057.0)
        );
        assert!(l.error.is_none());
        let u = counters_from_metrics(base(), "process_cpu_seconds_total 1\n");
        assert!(u.error.is_some());
    }

    #[test]
    fn percentiles_nearest_rank() {
        let d = Dist::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (d.p50, d.p90, d.p99, d.max, d.min),
            (50.0, 90.0, 99.0, 100.0, 1.0)
        );
        assert_eq!(Dist::of(vec![]).n, 0);
        assert_eq!(Dist::of(vec![7.0]).p99, 7.0);
    }

    fn outcome(i: usize, replica: &str, ttft: f64, cached: u64) -> Outcome {
        Outcome {
            index: i,
            status: 200,
            replica: Some(replica.into()),
            ttft_ms: Some(ttft),
            latency_ms: ttft + 10.0,
            prompt_tokens: Some(100),
            cached_tokens: Some(cached),
            completion_tokens: Some(4),
            kind: "shared-prefix".into(),
            ..Default::default()
        }
    }

    fn info() -> RunInfo {
        RunInfo {
            label: "x".into(),
            workload: "w".into(),
            seed: 1,
            url: "http://127.0.0.1:1".into(),
            path: "/v1/chat/completions".into(),
            concurrency: 1,
            rate: None,
            max_tokens: 4,
            duration_s: 2.0,
        }
    }

    #[test]
    fn summary_uses_counter_deltas_and_header_shares() {
        let outs = vec![
            outcome(0, "8001", 100.0, 0),
            outcome(1, "8001", 10.0, 96),
            outcome(2, "8002", 12.0, 96),
            Outcome {
                index: 3,
                status: 503,
                error: Some("HTTP 503".into()),
                ..Default::default()
            },
        ];
        let rc = |url: &str, id: &str, q: f64, h: f64| ReplicaCounters {
            url: url.into(),
            id: Some(id.into()),
            kind: "vllm".into(),
            queries: q,
            hits: h,
            requests: None,
            error: None,
        };
        let reps = vec![
            (
                rc("http://127.0.0.1:8001", "8001", 1000.0, 500.0),
                rc("http://127.0.0.1:8001", "8001", 1200.0, 596.0),
            ),
            (
                rc("http://127.0.0.1:8002", "8002", 0.0, 0.0),
                rc("http://127.0.0.1:8002", "8002", 100.0, 96.0),
            ),
            (
                rc("http://127.0.0.1:8003", "8003", 0.0, 0.0),
                rc("http://127.0.0.1:8003", "8003", 0.0, 0.0),
            ),
        ];
        let mut eb = EnvoyCounters::default();
        eb.stats
            .insert("wasmcustom.prefix_router.branch.hit".into(), 10);
        let mut ea = EnvoyCounters::default();
        ea.stats
            .insert("wasmcustom.prefix_router.branch.hit".into(), 12);
        ea.stats
            .insert("wasmcustom.prefix_router.branch.spill".into(), 1);
        ea.stats
            .insert("wasmcustom.prefix_router.branch.no_key".into(), 1);
        ea.stats
            .insert("wasmcustom.prefix_router.branch.round_robin".into(), 5);
        let s = summarize(info(), &outs, &reps, Some((&eb, &ea)));
        assert_eq!((s.ok, s.errors), (3, 1));
        assert_eq!(s.status_counts["503"], 1);
        assert!((s.hit_rate.unwrap() - 192.0 / 300.0).abs() < 1e-9);
        assert!((s.client_hit_rate.unwrap() - 192.0 / 300.0).abs() < 1e-9);
        assert_eq!(s.replicas.len(), 3);
        assert_eq!(s.replicas[0].requests, 2);
        assert_eq!(s.replicas[2].requests, 0);
        assert_eq!(s.share_min, Some(0.0));
        assert!((s.share_max.unwrap() - 2.0 / 3.0).abs() < 1e-9);
        let e = s.envoy.as_ref().unwrap();
        assert_eq!((e.hit, e.spill, e.fallback, e.baseline), (2, 1, 1, 5));
        assert_eq!(e.spill_rate, Some(0.25));
        assert_eq!(s.ttft_ms.p50, 12.0);
        // Round trip through JSON, then the table shows both runs.
        let j = serde_json::to_string(&s).unwrap();
        let mut s2: Summary = serde_json::from_str(&j).unwrap();
        assert_eq!(s2, s);
        s2.label = "y".into();
        s2.ttft_ms.p50 = 6.0;
        let t = table(&[s, s2]);
        assert!(t.contains("-50%"), "{t}");
        assert!(t.lines().next().unwrap().contains(" x") && t.contains(" y"));
    }

    #[test]
    fn shares_fall_back_to_envoy_hosts() {
        let mut o = outcome(0, "", 1.0, 0);
        o.replica = None;
        let eb = EnvoyCounters::default();
        let mut ea = EnvoyCounters::default();
        ea.host_rq.insert(("c".into(), "127.0.0.1:9001".into()), 3);
        ea.host_rq.insert(("c".into(), "127.0.0.1:9002".into()), 1);
        let s = summarize(info(), &[o], &[], Some((&eb, &ea)));
        assert_eq!(s.share_source.as_deref(), Some("envoy rq_total"));
        assert_eq!(s.share_max, Some(0.75));
    }
}
