//! One sequence's life: submitted to the replica's engine (the shared engine model, driven in
//! real time by [`crate::driver`]), then its events turned into the OpenAI response bodies (JSON
//! and SSE).
//!
//! Timing is the engine's: continuous batching with a token budget per step, chunked prefill,
//! the prefix cache looked up when the request is scheduled, preemption when KV memory runs
//! out; the first token comes at the end of the step that finishes the prefill (TTFT), each
//! further token at the end of a later step. No thread is held while waiting: a sequence is one
//! task awaiting its events.
//!
//! Every resource a sequence takes (engine slot and KV blocks, LoRA waiting gauge) is owned by a
//! guard whose `Drop` gives it back, so an abandoned request (client gone, task dropped) never
//! leaks.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use engine_model::{EventKind, Request};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::cache::{block_hashes, root_hash};
use crate::lock;
use crate::prompt::Api;
use crate::server::Emulator;

/// Deterministic filler: output token `i` is `WORDS[i % WORDS.len()]`.
pub const WORDS: &[&str] = &[
    " The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".", " Lorem",
    " ipsum", " dolor", " sit", " amet", ",",
];

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct Job {
    pub api: Api,
    pub seq: u64,
    pub model: String,
    pub lora: Option<String>,
    pub cache_salt: Option<String>,
    pub tokens: Vec<u64>,
    pub max_tokens: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub arrived: Instant,
}

/// What the sequence reports when it ends.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub queued_ms: f64,
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    pub text: String,
    pub aborted: bool,
}

/// Decrements a LoRA adapter's waiting count on drop (unless taken).
struct LoraWaiting<'a> {
    emu: &'a Emulator,
    lora: Option<String>,
}

impl LoraWaiting<'_> {
    fn done(&mut self) {
        if let Some(l) = self.lora.take() {
            let m = &self.emu.metrics;
            m.lora_add(&m.lora_waiting, &l, -1);
        }
    }
}

impl Drop for LoraWaiting<'_> {
    fn drop(&mut self) {
        self.done();
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Formats OpenAI objects for one job.
pub struct Format<'a> {
    pub job: &'a Job,
    pub created: u64,
}

impl Format<'_> {
    fn id(&self) -> String {
        match self.job.api {
            Api::Chat => format!("chatcmpl-emu-{}", self.job.seq),
            Api::Completions => format!("cmpl-emu-{}", self.job.seq),
        }
    }

    pub fn usage(o: &Outcome) -> Value {
        json!({
            "prompt_tokens": o.prompt_tokens,
            "total_tokens": o.prompt_tokens + o.completion_tokens,
            "completion_tokens": o.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
        })
    }

    /// The non-streaming response body.
    pub fn full(&self, o: &Outcome) -> Value {
        let j = self.job;
        let choice = match j.api {
            Api::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": o.text, "tool_calls": []},
                "logprobs": null, "finish_reason": "length", "stop_reason": null,
            }),
            Api::Completions => json!({
                "index": 0, "text": o.text, "logprobs": null,
                "finish_reason": "length", "stop_reason": null,
            }),
        };
        json!({
            "id": self.id(),
            "object": if j.api == Api::Chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": j.model,
            "choices": [choice],
            "usage": Self::usage(o),
        })
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let j = self.job;
        let mut v = json!({
            "id": self.id(),
            "object": if j.api == Api::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": j.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        Bytes::from(format!("data: {v}\n\n"))
    }

    /// The SSE event carrying output token `i` (the first one also carries the chat role).
    /// Built as a string (not a `Value`): this runs once per output token.
    pub fn token_event(&self, i: usize, text: &str, last: bool) -> Bytes {
        let j = self.job;
        let text = Value::from(text);
        let model = Value::from(j.model.as_str());
        let finish = if last { "\"length\"" } else { "null" };
        let (object, choice) = match j.api {
            Api::Chat => {
                let role = if i == 0 {
                    "\"role\":\"assistant\","
                } else {
                    ""
                };
                (
                    "chat.completion.chunk",
                    format!(
                        "{{\"index\":0,\"delta\":{{{role}\"content\":{text}}},\"logprobs\":null,\
                         \"finish_reason\":{finish}}}"
                    ),
                )
            }
            Api::Completions => (
                "text_completion",
                format!(
                    "{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":{finish}}}"
                ),
            ),
        };
        Bytes::from(format!(
            "data: {{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{},\"model\":{model},\
             \"choices\":[{choice}]}}\n\n",
            self.id(),
            self.created
        ))
    }

    /// The final usage chunk (`stream_options.include_usage`), then `data: [DONE]`.
    pub fn tail(&self, o: &Outcome) -> Bytes {
        let mut out = Vec::new();
        if self.job.include_usage {
            out.extend_from_slice(&self.chunk(json!([]), Some(Self::usage(o))));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }
}

/// The API-server delay of a prompt of `tokens`: `ms` + `us_per_token` × tokens; `None` when
/// it is zero or not a valid duration (negative, NaN, infinite).
fn api_delay(ms: f64, us_per_token: f64, tokens: usize) -> Option<Duration> {
    let s = ms / 1e3 + us_per_token * tokens as f64 / 1e6;
    Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero())
}

/// Runs `job` to completion. With `sink`, each token is sent as an SSE event as it is produced
/// (and the final usage/[DONE] events); a failed send means the client left: the sequence stops
/// (and leaves the engine).
pub async fn run(emu: Arc<Emulator>, job: Job, sink: Option<mpsc::Sender<Bytes>>) -> Outcome {
    let cfg = &emu.cfg;
    let m = &emu.metrics;
    let n = job.tokens.len();
    let mut out = Outcome {
        prompt_tokens: n,
        ..Default::default()
    };
    if let Some(l) = &job.lora {
        m.lora_add(&m.lora_waiting, l, 1);
    }
    let mut lora_waiting = LoraWaiting {
        emu: &emu,
        lora: job.lora.clone(),
    };
    // An adapter that is not resident is loaded when the request is first scheduled.
    let extra_s = match &job.lora {
        Some(l) if lock(&emu.lora).touch(l) => cfg.lora_load_ms.max(0.0) / 1e3,
        _ => 0.0,
    };
    let root = root_hash(job.lora.as_deref(), job.cache_salt.as_deref());
    m.prompt_tokens.fetch_add(n as u64, Relaxed);
    let sat = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    // The API server's delay (tokenization) before the engine sees the request; it counts in
    // the TTFT and the queue time (measured from `arrived`).
    if let Some(d) = api_delay(cfg.api_delay_ms, cfg.api_us_per_token, n) {
        tokio::time::sleep(d).await;
    }
    let mut ticket = emu.driver.submit(Request {
        id: 0,
        prompt_tokens: sat(n),
        output_tokens: sat(job.max_tokens),
        blocks: block_hashes(&job.tokens, cfg.block_tokens, root),
        out_blocks: Vec::new(),
        extra_s,
    });
    let fmt = Format {
        job: &job,
        created: unix_now(),
    };
    while let Some(ev) = ticket.next().await {
        let index = match ev {
            EventKind::Scheduled { .. } => {
                out.queued_ms = ms(job.arrived.elapsed());
                m.queue_time.observe(out.queued_ms / 1e3);
                lora_waiting.done();
                continue;
            }
            EventKind::FirstToken { cached } => {
                out.cached_tokens = cached as usize;
                let ttft = job.arrived.elapsed();
                out.ttft_ms = Some(ms(ttft));
                m.ttft.observe(ttft.as_secs_f64());
                0
            }
            EventKind::Token { index } => index as usize,
            EventKind::Preempted => continue,
            EventKind::Finished => break,
        };
        let word = WORDS[index % WORDS.len()];
        out.text.push_str(word);
        out.completion_tokens += 1;
        m.generation_tokens.fetch_add(1, Relaxed);
        if let Some(tx) = &sink {
            if tx
                .send(fmt.token_event(index, word, index + 1 == job.max_tokens))
                .await
                .is_err()
            {
                out.aborted = true;
                break;
            }
        }
    }
    if out.completion_tokens < job.max_tokens {
        out.aborted = true;
    }
    out.total_ms = ms(job.arrived.elapsed());
    drop(ticket);
    drop(lora_waiting);
    if out.aborted {
        m.count_finished("abort");
    } else {
        m.count_finished("length");
        m.e2e.observe(out.total_ms / 1e3);
        if let Some(tx) = &sink {
            let _ = tx.send(fmt.tail(&out)).await;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(api: Api) -> Job {
        Job {
            api,
            seq: 7,
            model: "m\"x".into(),
            lora: None,
            cache_salt: None,
            tokens: vec![1, 2, 3],
            max_tokens: 2,
            stream: true,
            include_usage: true,
            arrived: Instant::now(),
        }
    }

    fn parse(b: &Bytes) -> Value {
        let t = std::str::from_utf8(b).unwrap();
        let t = t
            .strip_prefix("data: ")
            .unwrap()
            .strip_suffix("\n\n")
            .unwrap();
        serde_json::from_str(t).unwrap()
    }

    #[test]
    fn api_delay_is_base_plus_per_token_and_never_invalid() {
        let d = |ms, us, n| api_delay(ms, us, n).map(|d| d.as_secs_f64());
        assert_eq!(d(0.0, 0.0, 100_000), None);
        assert_eq!(d(10.0, 0.0, 100_000), Some(0.010));
        let long = d(10.0, 1.0, 100_000).unwrap();
        assert!((long - 0.110).abs() < 1e-9, "{long}");
        assert!(d(10.0, 1.0, 1_000).unwrap() < long);
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(d(bad, 0.0, 10), None);
        }
    }

    #[test]
    fn token_events_are_valid_openai_chunks() {
        let j = job(Api::Chat);
        let f = Format {
            job: &j,
            created: 5,
        };
        let first = parse(&f.token_event(0, " \"hi\"", false));
        assert_eq!(first["id"], "chatcmpl-emu-7");
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(first["model"], "m\"x");
        assert_eq!(first["created"], 5);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(first["choices"][0]["delta"]["content"], " \"hi\"");
        assert!(first["choices"][0]["finish_reason"].is_null());
        let last = parse(&f.token_event(1, " x", true));
        assert!(last["choices"][0]["delta"].get("role").is_none());
        assert_eq!(last["choices"][0]["finish_reason"], "length");

        let j = job(Api::Completions);
        let f = Format {
            job: &j,
            created: 5,
        };
        let c = parse(&f.token_event(0, " y", true));
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"][0]["text"], " y");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
    }
}
