//! One replica: a vLLM-V1-like engine with continuous batching, chunked
//! prefill and a block-level prefix cache.
//!
//! Each engine **step** runs every decoding sequence for one token, continues
//! the prefills in progress and admits waiting requests in FIFO order while
//! the step's token budget (`max_batched_tokens`), `max_num_seqs` and free KV
//! blocks allow. Step time = base + per-sequence decode cost + KV reads of the
//! decoding contexts + prefill cost of the scheduled chunks
//! ([`ModelParams`]). A request's first token is produced at the end of the
//! step that finishes its prefill (TTFT); one more token per step after that.
//!
//! KV blocks: at admission the longest cached prefix of the prompt's full
//! blocks is reused (at most `(prompt − 1)/16` blocks: vLLM always computes
//! the last prompt token) and the rest of the sequence (uncached prompt and
//! the whole output) is reserved as private blocks, so running sequences are
//! never preempted. When the prefill ends, the prompt's blocks become
//! shareable; when the request ends, its blocks are released tail first (the
//! tail is evicted first, as in vLLM), and the full blocks its output
//! completed are cached too when the output text is known (chat turns).
//!
//! Cost: O(log n) per step plus O(blocks) per admitted/finished request.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::cache::BlockCache;
use crate::engine::SimRequest;
use crate::model::ModelParams;
use crate::text::KV_BLOCK_TOKENS;

#[derive(Debug, Clone)]
struct Seq {
    req: u32,
    prompt: u32,
    output: u32,
    cached: u32,
    prefilled: u32,
    est_uncached: u32,
    held: Vec<u64>,
}

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
}

/// One replica.
#[derive(Debug, Clone)]
pub struct Replica {
    p: ModelParams,
    cache: BlockCache,
    seqs: Vec<Option<Seq>>,
    spare: Vec<u32>,
    waiting: VecDeque<u32>,
    prefilling: VecDeque<u32>,
    decode: BinaryHeap<Reverse<(u64, u32)>>,
    n_decode: u32,
    sum_ctx: u64,
    step: u64,
    plan: Vec<(u32, u32, u32)>,
    planned_decode: u32,
    /// A step is in progress.
    pub busy: bool,
    step_started: f64,
    /// Seconds spent stepping.
    pub busy_time: f64,
    /// Seconds of prefill compute inside those steps.
    pub prefill_time: f64,
    /// Steps run.
    pub steps: u64,
    /// Estimated prefill tokens not yet computed (waiting + in prefill).
    pub backlog_tokens: i64,
    /// Requests received.
    pub received: u64,
}

fn ceil_blocks(tokens: u32) -> u32 {
    tokens.div_ceil(KV_BLOCK_TOKENS)
}

impl Replica {
    /// An idle replica with an empty cache.
    pub fn new(p: &ModelParams) -> Replica {
        Replica {
            p: p.clone(),
            cache: BlockCache::new(p.kv_blocks),
            seqs: Vec::new(),
            spare: Vec::new(),
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            decode: BinaryHeap::new(),
            n_decode: 0,
            sum_ctx: 0,
            step: 0,
            plan: Vec::new(),
            planned_decode: 0,
            busy: false,
            step_started: 0.0,
            busy_time: 0.0,
            prefill_time: 0.0,
            steps: 0,
            backlog_tokens: 0,
            received: 0,
        }
    }

    /// Longest cached prefix of `req`'s prompt, in tokens (what admission would
    /// reuse now). Read-only: the oracle's privilege.
    pub fn cached_tokens(&self, req: &SimRequest) -> u32 {
        let max = ((req.prompt_tokens.saturating_sub(1)) / KV_BLOCK_TOKENS) as usize;
        self.cache.prefix_hits(&req.blocks, max) as u32 * KV_BLOCK_TOKENS
    }

    /// Scraped metrics.
    pub fn metrics(&self) -> Metrics {
        Metrics {
            waiting: self.waiting.len() as u32,
            kv_usage: f64::from(self.cache.used()) / f64::from(self.cache.capacity().max(1)),
        }
    }

    /// Requests waiting or running.
    pub fn outstanding(&self) -> u32 {
        self.waiting.len() as u32 + self.prefilling.len() as u32 + self.n_decode
    }

    /// Decoding sequences and the sum of their context lengths.
    pub fn decode_load(&self) -> (u32, u64) {
        (self.n_decode, self.sum_ctx)
    }

    /// A request reaches the engine.
    pub fn enqueue(&mut self, req_idx: u32, req: &SimRequest) {
        let est = req.prompt_tokens - self.cached_tokens(req);
        self.backlog_tokens += i64::from(est);
        self.received += 1;
        let seq = Seq {
            req: req_idx,
            prompt: req.prompt_tokens,
            output: req.output_tokens.max(1),
            cached: 0,
            prefilled: 0,
            est_uncached: est,
            held: Vec::new(),
        };
        let slot = match self.spare.pop() {
            Some(s) => {
                self.seqs[s as usize] = Some(seq);
                s
            }
            None => {
                self.seqs.push(Some(seq));
                (self.seqs.len() - 1) as u32
            }
        };
        self.waiting.push_back(slot);
    }

    /// Try to admit the head of the waiting queue: take the cached prefix and
    /// reserve the rest. False if the KV blocks are not available.
    fn admit(&mut self, slot: u32, reqs: &[SimRequest]) -> bool {
        let Some(seq) = self.seqs[slot as usize].as_ref() else {
            return true;
        };
        let req = &reqs[seq.req as usize];
        let max_hit = ((seq.prompt - 1) / KV_BLOCK_TOKENS) as usize;
        let hits = self.cache.prefix_hits(&req.blocks, max_hit);
        let evictable_hits = req.blocks[..hits]
            .iter()
            .filter(|&&h| self.cache.is_evictable(h))
            .count() as u32;
        let total = ceil_blocks(seq.prompt + seq.output);
        let mut need = total - hits as u32;
        let nothing_running = self.n_decode == 0 && self.prefilling.is_empty();
        if need + evictable_hits > self.cache.available() {
            if !nothing_running {
                return false;
            }
            // A request larger than the whole cache: run it with what exists.
            need = self.cache.available() - evictable_hits;
        }
        let mut held = Vec::with_capacity(req.blocks.len() + req.out_blocks.len());
        for &h in &req.blocks[..hits] {
            if self.cache.acquire(h) {
                held.push(h);
            }
        }
        self.cache.alloc_private(need);
        let cached = hits as u32 * KV_BLOCK_TOKENS;
        if let Some(seq) = self.seqs[slot as usize].as_mut() {
            seq.cached = cached;
            seq.prefilled = cached;
            self.backlog_tokens += i64::from(seq.prompt - cached) - i64::from(seq.est_uncached);
            seq.held = held;
        }
        true
    }

    /// Plan and start a step at `now`; returns its duration, or `None` when
    /// there is nothing to run.
    pub fn start_step(&mut self, now: f64, reqs: &[SimRequest]) -> Option<f64> {
        self.plan.clear();
        let mut budget = self.p.max_batched_tokens.saturating_sub(self.n_decode);
        let mut cost = 0.0;
        for &slot in &self.prefilling {
            if budget == 0 {
                break;
            }
            if let Some(seq) = self.seqs[slot as usize].as_ref() {
                let n = (seq.prompt - seq.prefilled).min(budget);
                budget -= n;
                self.plan.push((slot, seq.prefilled, seq.prefilled + n));
            }
        }
        while budget > 0 && (self.n_decode + self.prefilling.len() as u32) < self.p.max_num_seqs {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            if !self.admit(slot, reqs) {
                break;
            }
            self.waiting.pop_front();
            self.prefilling.push_back(slot);
            if let Some(seq) = self.seqs[slot as usize].as_ref() {
                let n = (seq.prompt - seq.prefilled).min(budget);
                budget -= n;
                self.plan.push((slot, seq.prefilled, seq.prefilled + n));
            }
        }
        if self.plan.is_empty() && self.n_decode == 0 {
            self.busy = false;
            return None;
        }
        for &(_, a, b) in &self.plan {
            cost += self.p.prefill_cost(a, b);
        }
        self.prefill_time += cost;
        self.steps += 1;
        cost += self.p.step_base_s
            + f64::from(self.n_decode) * self.p.decode_s_per_seq
            + self.sum_ctx as f64 * self.p.decode_s_per_ctx_token;
        self.planned_decode = self.n_decode;
        self.busy = true;
        self.step_started = now;
        Some(cost)
    }

    /// Finish the step started last; outcomes are appended to `out`.
    pub fn end_step(&mut self, now: f64, reqs: &[SimRequest], out: &mut Vec<Outcome>) {
        self.busy_time += now - self.step_started;
        self.step += 1;
        // Every sequence that decoded in this step produced one token.
        self.sum_ctx += u64::from(self.planned_decode);
        while let Some(&Reverse((fin, slot))) = self.decode.peek() {
            if fin > self.step {
                break;
            }
            self.decode.pop();
            self.n_decode -= 1;
            if let Some(seq) = self.seqs[slot as usize].as_ref() {
                self.sum_ctx -= u64::from(seq.prompt + seq.output);
            }
            self.finish(slot, reqs, out);
        }
        let plan = std::mem::take(&mut self.plan);
        for &(slot, a, b) in &plan {
            self.backlog_tokens -= i64::from(b - a);
            let Some(seq) = self.seqs[slot as usize].as_mut() else {
                continue;
            };
            seq.prefilled = b;
            if b < seq.prompt {
                continue;
            }
            // Prefill done: the prompt's full blocks become shareable.
            let req = &reqs[seq.req as usize];
            let hits = (seq.cached / KV_BLOCK_TOKENS) as usize;
            for &h in &req.blocks[hits..] {
                if self.cache.publish(h, true) {
                    seq.held.push(h);
                }
            }
            out.push(Outcome::FirstToken {
                req: seq.req,
                cached: seq.cached,
            });
            let (prompt, output) = (seq.prompt, seq.output);
            if output <= 1 {
                self.finish(slot, reqs, out);
            } else {
                self.n_decode += 1;
                self.sum_ctx += u64::from(prompt + 1);
                self.decode
                    .push(Reverse((self.step + u64::from(output - 1), slot)));
            }
        }
        self.prefilling.retain(|&s| {
            self.seqs[s as usize]
                .as_ref()
                .is_some_and(|q| q.prefilled < q.prompt)
        });
        self.plan = plan;
        self.plan.clear();
        self.busy = false;
    }

    fn finish(&mut self, slot: u32, reqs: &[SimRequest], out: &mut Vec<Outcome>) {
        let Some(seq) = self.seqs[slot as usize].take() else {
            return;
        };
        let req = &reqs[seq.req as usize];
        // Output blocks first, tail first, then the prompt's blocks tail first:
        // the LRU evicts a finished sequence's tail before its head.
        let total = ceil_blocks(seq.prompt + seq.output);
        let published_prompt = seq.held.len() as u32;
        let mut private = total.saturating_sub(published_prompt);
        for &h in req.out_blocks.iter().rev() {
            if private == 0 {
                break;
            }
            self.cache.publish(h, false);
            private -= 1;
        }
        self.cache.free_private(private);
        for &h in seq.held.iter().rev() {
            self.cache.release(h);
        }
        self.spare.push(slot);
        out.push(Outcome::Done { req: seq.req });
    }
}
