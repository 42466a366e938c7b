//! Sends a workload: closed loop (`concurrency` workers) or open loop (Poisson arrivals at
//! `rate` per second, at most `max_in_flight` at once), every request streamed (SSE).
//!
//! Per request it measures, at the client: TTFT (send -> first SSE event carrying output text),
//! latency (send -> end of stream), the status, `x-replica-id` and `x-prefix-router-decision`
//! response headers, and the usage of the final chunk (`stream_options.include_usage`).
//! A request waits for its `after` request (the previous turn of its chat) to finish first.
//! Everything is bounded: a per-request timeout and an overall deadline after which no new
//! request starts.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};

use crate::client::Client;
use crate::load::rng::Rng;
use crate::load::workload::{as_prompt, Item};
use crate::lock;

/// What one request did.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Outcome {
    pub index: usize,
    pub group: String,
    pub kind: String,
    /// HTTP status; 0 for a transport error or timeout.
    pub status: u16,
    pub error: Option<String>,
    pub replica: Option<String>,
    pub decision: Option<String>,
    /// Start, ms after the run began.
    pub start_ms: f64,
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// SSE events with output text.
    pub chunks: u64,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }
}

/// How to send.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// `/v1/chat/completions` or `/v1/completions`.
    pub path: String,
    pub model: String,
    pub max_tokens: usize,
    pub concurrency: usize,
    /// Requests per second (open loop) instead of `concurrency` workers.
    pub rate: Option<f64>,
    pub max_in_flight: usize,
    pub timeout: Duration,
    pub deadline: Duration,
    pub headers: Vec<(String, String)>,
    /// Header set to the item's group (session affinity id).
    pub session_header: Option<String>,
    pub seed: u64,
}

fn body_of(cfg: &RunConfig, item: &Item) -> Bytes {
    let mut v = if cfg.path.ends_with("/chat/completions") {
        let msgs: Vec<Value> = item
            .messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        json!({"model": cfg.model, "messages": msgs})
    } else {
        json!({"model": cfg.model, "prompt": as_prompt(&item.messages)})
    };
    v["max_tokens"] = json!(item.max_tokens.unwrap_or(cfg.max_tokens));
    v["stream"] = json!(true);
    v["stream_options"] = json!({"include_usage": true});
    Bytes::from(v.to_string())
}

/// Reads an SSE stream, noting the first output text and the usage.
async fn consume_sse(
    mut body: hyper::body::Incoming,
    t0: Instant,
    o: &mut Outcome,
) -> Result<(), String> {
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {e}"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        // Process complete events (terminated by a blank line).
        while let Some((end, sep)) = find_event_end(&buf) {
            let event: Vec<u8> = buf.drain(..end + sep).collect();
            let text = String::from_utf8_lossy(&event[..end]);
            for line in text.lines() {
                let Some(payload) = line.strip_prefix("data:") else {
                    continue;
                };
                let payload = payload.trim();
                if payload == "[DONE]" {
                    return Ok(());
                }
                let Ok(v) = serde_json::from_str::<Value>(payload) else {
                    continue;
                };
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    o.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
                    o.completion_tokens = u.get("completion_tokens").and_then(Value::as_u64);
                    o.cached_tokens = u
                        .pointer("/prompt_tokens_details/cached_tokens")
                        .and_then(Value::as_u64);
                }
                if let Some(e) = v.get("error") {
                    return Err(format!("error event: {e}"));
                }
                let c = v.pointer("/choices/0");
                let has_text = c
                    .and_then(|c| c.pointer("/delta/content").or_else(|| c.get("text")))
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty());
                if has_text {
                    o.chunks += 1;
                    if o.ttft_ms.is_none() {
                        o.ttft_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
        }
    }
    Err("stream ended without [DONE]".into())
}

fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

async fn one(
    client: &Client,
    cfg: &RunConfig,
    item: &Item,
    index: usize,
    t_run: Instant,
) -> Outcome {
    let mut o = Outcome {
        index,
        group: item.group.clone(),
        kind: item.kind.to_string(),
        start_ms: t_run.elapsed().as_secs_f64() * 1e3,
        ..Default::default()
    };
    let mut headers = cfg.headers.clone();
    if let Some(h) = &cfg.session_header {
        headers.push((h.clone(), item.group.clone()));
    }
    let body = body_of(cfg, item);
    let t0 = Instant::now();
    let work = async {
        let (resp, conn) = client
            .send(Method::POST, &cfg.path, &headers, body)
            .await
            .map_err(|e| format!("send: {e}"))?;
        o.status = resp.status().as_u16();
        let hv = |k: &str| {
            resp.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        o.replica = hv("x-replica-id");
        o.decision = hv("x-prefix-router-decision");
        if o.status != 200 {
            let b = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?;
            conn.done();
            let t = String::from_utf8_lossy(&b.to_bytes())
                .chars()
                .take(200)
                .collect::<String>();
            return Err(format!("HTTP {}: {t}", o.status));
        }
        consume_sse(resp.into_body(), t0, &mut o).await?;
        conn.done();
        Ok::<(), String>(())
    };
    let res = tokio::time::timeout(cfg.timeout, work).await;
    o.latency_ms = t0.elapsed().as_secs_f64() * 1e3;
    match res {
        Ok(Ok(())) => {}
        Ok(Err(e)) => o.error = Some(e),
        Err(_) => o.error = Some(format!("timeout after {:?}", cfg.timeout)),
    }
    o
}

struct Shared {
    client: Client,
    cfg: RunConfig,
    items: Vec<Item>,
    done: Vec<watch::Sender<bool>>,
    results: Mutex<Vec<Option<Outcome>>>,
    t_run: Instant,
}

impl Shared {
    async fn run_one(&self, i: usize) {
        if let Some(a) = self.items[i].after {
            let mut rx = self.done[a].subscribe();
            let left = self.cfg.deadline.saturating_sub(self.t_run.elapsed()) + self.cfg.timeout;
            let _ = tokio::time::timeout(left, rx.wait_for(|d| *d)).await;
        }
        let o = one(&self.client, &self.cfg, &self.items[i], i, self.t_run).await;
        lock(&self.results)[i] = Some(o);
        self.done[i].send_replace(true);
    }
}

/// Runs `items` against `client`; returns the outcomes of the requests that started (in
/// workload order) and the wall time.
pub async fn run(client: Client, cfg: RunConfig, items: Vec<Item>) -> (Vec<Outcome>, Duration) {
    let n = items.len();
    let shared = Arc::new(Shared {
        client,
        done: (0..n).map(|_| watch::channel(false).0).collect(),
        results: Mutex::new(vec![None; n]),
        items,
        t_run: Instant::now(),
        cfg,
    });
    let mut tasks = Vec::new();
    let timed = shared.items.first().is_some_and(|i| i.at_s.is_some());
    let rate = shared.cfg.rate.filter(|r| *r > 0.0);
    if timed || rate.is_some() {
        // Open loop: each item at its trace time (`--trace`), else Poisson at `rate`; at most
        // max_in_flight at once.
        let limit = Arc::new(Semaphore::new(shared.cfg.max_in_flight.max(1)));
        let mut rng = Rng::new(shared.cfg.seed).fork(99);
        let mut at = Duration::ZERO;
        for i in 0..n {
            if timed {
                at = Duration::from_secs_f64(shared.items[i].at_s.unwrap_or(0.0).clamp(0.0, 1e9));
            } else if let Some(rate) = rate.filter(|_| i > 0) {
                at += Duration::from_secs_f64(rng.exp(1.0 / rate));
            }
            if at > shared.cfg.deadline {
                break;
            }
            tokio::time::sleep_until((shared.t_run + at).into()).await;
            let Ok(permit) = limit.clone().acquire_owned().await else {
                break;
            };
            let s = shared.clone();
            tasks.push(tokio::spawn(async move {
                s.run_one(i).await;
                drop(permit);
            }));
        }
    } else {
        let next = Arc::new(AtomicUsize::new(0));
        for _ in 0..shared.cfg.concurrency.max(1) {
            let (s, next) = (shared.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= s.items.len() || s.t_run.elapsed() > s.cfg.deadline {
                        break;
                    }
                    s.run_one(i).await;
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let wall = shared.t_run.elapsed();
    let out = lock(&shared.results).iter().flatten().cloned().collect();
    (out, wall)
}
