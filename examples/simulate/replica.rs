//! One replica: the shared vLLM-like engine model ([`engine_model::Engine`]: continuous
//! batching, a token budget per step, chunked prefill, the prefix cache looked up at schedule
//! time, LRU eviction, recompute preemption) driven in virtual time, plus what the policies may
//! read (cached prefix, backlog, decode load, scraped metrics).
//!
//! The engine model is the same one the replica emulator drives in real time; its algorithm and
//! invariants are documented in `engine-model/src/engine.rs`, its calibration in
//! `examples/simulate/README.md` ("Calibration").
//!
//! Cost: O(running + scheduled blocks) per step; O(prompt blocks) per admitted request.

use engine_model::{Engine, EventKind, Request};

use crate::engine::SimRequest;
use crate::model::ModelParams;
use crate::text::KV_BLOCK_TOKENS;

/// What a finished step produced.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    /// First token of `req`; `cached` prompt tokens came from the cache.
    FirstToken {
        /// Request index.
        req: u32,
        /// Cached prompt tokens.
        cached: u32,
    },
    /// `req` finished.
    Done {
        /// Request index.
        req: u32,
    },
}

/// Metrics a scraper would read (`vllm:num_requests_waiting`,
/// `vllm:kv_cache_usage_perc`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics {
    /// Requests waiting for admission.
    pub waiting: u32,
    /// Fraction of KV blocks held by running requests.
    pub kv_usage: f64,
    /// Requests waiting or running.
    pub outstanding: u32,
}

impl Metrics {
    /// The scrape as the filter's Prometheus parser would read it (the
    /// engine sample `ours` and the gateways mode feed to the load rule).
    pub fn as_sample(&self) -> prefix_router::engine::EngineSample {
        prefix_router::engine::EngineSample {
            waiting: Some(f64::from(self.waiting)),
            running: Some(f64::from(self.outstanding.saturating_sub(self.waiting))),
            kv_usage: Some(self.kv_usage),
            ..prefix_router::engine::EngineSample::default()
        }
    }
}

/// One replica.
#[derive(Debug, Clone)]
pub struct Replica {
    engine: Engine,
    events: Vec<engine_model::Event>,
    /// Estimated uncached prompt tokens of each request not past its first token (the
    /// oracle's view of the prefill backlog), by request index.
    pending_est: Vec<(u32, u32)>,
    /// Time of the step end the event loop has scheduled for this replica.
    scheduled: Option<f64>,
    clock: f64,
    /// Estimated prefill tokens not yet computed (waiting + in prefill).
    pub backlog_tokens: i64,
    /// Requests received.
    pub received: u64,
}

impl Replica {
    /// An idle replica with an empty cache.
    pub fn new(p: &ModelParams) -> Replica {
        Replica {
            engine: Engine::new(p.engine()),
            events: Vec::new(),
            pending_est: Vec::new(),
            scheduled: None,
            clock: 0.0,
            backlog_tokens: 0,
            received: 0,
        }
    }

    /// Longest cached prefix of `req`'s prompt, in tokens (what scheduling would reuse now).
    /// Read-only: the oracle's privilege.
    pub fn cached_tokens(&self, req: &SimRequest) -> u32 {
        self.engine.cached_tokens(&req.blocks, req.prompt_tokens)
    }

    /// Scraped metrics.
    pub fn metrics(&self) -> Metrics {
        let m = self.engine.metrics();
        Metrics {
            waiting: m.waiting,
            kv_usage: m.kv_usage,
            outstanding: self.engine.outstanding(),
        }
    }

    /// Requests waiting or running.
    pub fn outstanding(&self) -> u32 {
        self.engine.outstanding()
    }

    /// Decoding sequences and the sum of their context lengths.
    pub fn decode_load(&self) -> (u32, u64) {
        let m = self.engine.metrics();
        (m.decoding, m.decoding_ctx)
    }

    /// Seconds spent stepping.
    pub fn busy_time(&self) -> f64 {
        self.engine.metrics().busy_s
    }

    /// Seconds of prefill compute inside those steps.
    pub fn prefill_time(&self) -> f64 {
        self.engine.metrics().prefill_s
    }

    /// Steps run.
    pub fn steps(&self) -> u64 {
        self.engine.metrics().steps
    }

    /// A request reaches the engine at the replica's last known time (see [`Replica::advance`]).
    pub fn enqueue(&mut self, req_idx: u32, req: &SimRequest) {
        let est = req.prompt_tokens - self.cached_tokens(req);
        self.backlog_tokens += i64::from(est);
        self.pending_est.push((req_idx, est));
        self.received += 1;
        self.engine.submit(
            Request {
                id: u64::from(req_idx),
                prompt_tokens: req.prompt_tokens,
                output_tokens: req.output_tokens.max(1),
                blocks: req.blocks.clone(),
                out_blocks: req.out_blocks.clone(),
                extra_s: 0.0,
            },
            self.clock,
        );
    }

    /// A request reaches the engine at `now`; call [`Replica::advance`] next.
    pub fn enqueue_at(&mut self, now: f64, req_idx: u32, req: &SimRequest) {
        self.clock = now;
        self.enqueue(req_idx, req);
    }

    /// Run the engine up to `now`; outcomes are appended to `out`. Returns the time of a step
    /// end the event loop must schedule (none if it already has one or the engine is idle).
    /// A step-end event whose time is not the one returned last is stale: calling this for it
    /// is harmless.
    pub fn advance(&mut self, now: f64, out: &mut Vec<Outcome>) -> Option<f64> {
        self.clock = now;
        self.events.clear();
        self.engine.step(now, &mut self.events);
        for e in &self.events {
            let req = e.id as u32;
            match e.kind {
                EventKind::FirstToken { cached } => {
                    if let Some(i) = self.pending_est.iter().position(|&(r, _)| r == req) {
                        let (_, est) = self.pending_est.swap_remove(i);
                        self.backlog_tokens -= i64::from(est);
                    }
                    out.push(Outcome::FirstToken { req, cached });
                }
                EventKind::Finished => out.push(Outcome::Done { req }),
                _ => {}
            }
        }
        let next = self.engine.next_event_time();
        if next.is_some() && next != self.scheduled {
            self.scheduled = next;
            next
        } else {
            None
        }
    }
}

const _: () = assert!(
    KV_BLOCK_TOKENS == 16,
    "model.rs maps the engine's block size"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Arrival, Keys};

    fn req(fam: u64, prompt: u32, output: u32) -> SimRequest {
        SimRequest {
            arrival: Arrival::At(0.0),
            prompt_tokens: prompt,
            output_tokens: output,
            body_chars: prompt * 4,
            blocks: (0..u64::from(prompt / 16)).map(|i| fam << 32 | i).collect(),
            out_blocks: Vec::new(),
            keys: Keys::default(),
        }
    }

    #[test]
    fn advance_reports_first_tokens_and_completions_once() {
        let m = ModelParams::default();
        let mut r = Replica::new(&m);
        let a = req(1, 8000, 4);
        r.enqueue(0, &a);
        assert_eq!(r.backlog_tokens, 8000);
        let mut out = Vec::new();
        let mut t = r.advance(0.0, &mut out);
        assert!(t.is_some());
        let mut steps = 0;
        while let Some(x) = t {
            t = r.advance(x, &mut out);
            // A stale event (same time again) changes nothing.
            assert!(r.advance(x, &mut out).is_none());
            steps += 1;
            assert!(steps < 100);
        }
        let firsts = out
            .iter()
            .filter(|o| matches!(o, Outcome::FirstToken { .. }))
            .count();
        let dones = out
            .iter()
            .filter(|o| matches!(o, Outcome::Done { .. }))
            .count();
        assert_eq!((firsts, dones, steps), (1, 1, 4));
        assert_eq!(r.backlog_tokens, 0);
        assert_eq!(r.cached_tokens(&a), 7984);
        assert!(r.busy_time() > r.prefill_time() && r.prefill_time() > 0.2);
    }
}
