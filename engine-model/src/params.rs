//! Engine parameters: scheduler limits, KV capacity and the step-time cost model.
//!
//! **Step time** (one forward pass of the batch the scheduler planned):
//!
//! ```text
//! step = step_base_s
//!      + Σ over prefill chunks [from, to):  prefill_s_per_token · ((to − from) + (to² − from²) / (2 · attention_tokens))
//!      + Σ over decoding sequences:         decode_s_per_seq + context_tokens · decode_s_per_ctx_token
//!      + Σ over requests scheduled for the first time: request_overhead_s + their own extra cost (LoRA load)
//! ```
//!
//! i.e. a function of the batch's tokens (prefill chunks, with the attention term growing with
//! the position) and of its size (decoding sequences and their contexts). `step_base_s` is the
//! weight-read floor of a forward pass, which is also the inter-token latency of a small batch.
//!
//! Presets: [`Params::llama70b_h100x8`] is the calibrated default of the simulator (its
//! derivation and sources are in `examples/simulate/README.md`, "Calibration").

/// Engine parameters (see the module documentation for the cost model).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Tokens per KV block (vLLM `--block-size`).
    pub block_tokens: u32,
    /// KV capacity in blocks (vLLM `num_gpu_blocks`).
    pub kv_blocks: u32,
    /// Largest number of running (admitted) sequences (vLLM `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step: decode tokens + prefill chunks (vLLM
    /// `--max-num-batched-tokens`).
    pub max_batched_tokens: u32,
    /// Most sequences with a prefill chunk in one step; 0 = unlimited (vLLM
    /// `--max-num-partial-prefills`, whose default is 1 only with its own
    /// long-prefill rules; 1 here serializes prefills like one compute-bound GPU).
    pub max_partial_prefills: u32,
    /// Prefill cost per token at position 0, seconds.
    pub prefill_s_per_token: f64,
    /// Position at which attention doubles a prefill token's cost (`f64::INFINITY`: none).
    pub attention_tokens: f64,
    /// Fixed cost of one step, seconds.
    pub step_base_s: f64,
    /// Cost per decoding sequence per step, seconds.
    pub decode_s_per_seq: f64,
    /// KV read cost per context token of a decoding sequence per step, seconds.
    pub decode_s_per_ctx_token: f64,
    /// Cost added to the step that schedules a request for the first time, seconds.
    pub request_overhead_s: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params::llama70b_h100x8()
    }
}

impl Params {
    /// Llama-3.1-70B-Instruct bf16 on one 8×H100-80GB node (TP=8), vLLM V1 defaults: the
    /// setup of AWS's SageMaker prefix-aware routing benchmark. 30 µs per uncached prompt
    /// token (+ attention, doubling at 53 800 tokens), 12 ms step floor, 30 µs per decoding
    /// sequence, 20 ns per context token read, 78 000 blocks of 16 tokens, 256 sequences,
    /// 8192 batched tokens.
    pub fn llama70b_h100x8() -> Params {
        Params {
            block_tokens: 16,
            kv_blocks: 78_000,
            max_num_seqs: 256,
            max_batched_tokens: 8192,
            max_partial_prefills: 0,
            prefill_s_per_token: 30e-6,
            attention_tokens: 53_800.0,
            step_base_s: 0.012,
            decode_s_per_seq: 30e-6,
            decode_s_per_ctx_token: 20e-9,
            request_overhead_s: 0.0,
        }
    }

    /// Cost of prefilling positions `[from, to)`, seconds.
    pub fn prefill_cost(&self, from: u32, to: u32) -> f64 {
        let (a, b) = (f64::from(from), f64::from(to.max(from)));
        let attention = if self.attention_tokens.is_finite() && self.attention_tokens > 0.0 {
            (b * b - a * a) / (2.0 * self.attention_tokens)
        } else {
            0.0
        };
        self.prefill_s_per_token * ((b - a) + attention)
    }

    /// Cost of one decoding sequence with `context` tokens in one step, seconds.
    pub fn decode_cost(&self, context: u32) -> f64 {
        self.decode_s_per_seq + f64::from(context) * self.decode_s_per_ctx_token
    }

    /// KV blocks holding `tokens` tokens.
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_tokens.max(1))
    }

    /// The parameters with every limit at least 1 (a zero budget or capacity would stall).
    pub fn sanitized(mut self) -> Params {
        self.block_tokens = self.block_tokens.max(1);
        self.max_num_seqs = self.max_num_seqs.max(1);
        self.max_batched_tokens = self.max_batched_tokens.max(1);
        for v in [
            &mut self.prefill_s_per_token,
            &mut self.step_base_s,
            &mut self.decode_s_per_seq,
            &mut self.decode_s_per_ctx_token,
            &mut self.request_overhead_s,
        ] {
            if !v.is_finite() || *v < 0.0 {
                *v = 0.0;
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_cost_grows_with_position() {
        let p = Params::default();
        let early = p.prefill_cost(0, 1000);
        let late = p.prefill_cost(50_000, 51_000);
        assert!((early - 1000.0 * 30e-6).abs() < 0.02 * early);
        assert!(late > 1.9 * early, "{late} vs {early}");
        // Chunks add up to the whole.
        let whole = p.prefill_cost(0, 8000);
        let parts = p.prefill_cost(0, 3000) + p.prefill_cost(3000, 8000);
        assert!((whole - parts).abs() < 1e-12);
        let flat = Params {
            attention_tokens: f64::INFINITY,
            ..p
        };
        assert!((flat.prefill_cost(50_000, 51_000) - 0.03).abs() < 1e-9);
    }

    #[test]
    fn sanitized_never_leaves_a_zero_budget() {
        let p = Params {
            max_batched_tokens: 0,
            max_num_seqs: 0,
            block_tokens: 0,
            step_base_s: -1.0,
            ..Params::default()
        }
        .sanitized();
        assert_eq!(
            (p.max_batched_tokens, p.max_num_seqs, p.block_tokens),
            (1, 1, 1)
        );
        assert_eq!(p.step_base_s, 0.0);
    }
}

/// The calibrated preset against the published measurements cited in
/// `examples/simulate/README.md` ("Calibration"), through the engine itself.
#[cfg(test)]
mod calibration {
    use crate::{Engine, EventKind, Params, Request};

    /// (TTFT of a lone request, mean step time of its decode) in seconds.
    fn lone(p: &Params, prompt: u32, cached_family: bool, batch: u32) -> (f64, f64) {
        let mut e = Engine::new(p.clone());
        let blocks: Vec<u64> = (1..=u64::from(prompt / 16)).collect();
        let mut t = 0.0;
        let mut out = Vec::new();
        if cached_family {
            e.submit(
                Request {
                    id: 0,
                    prompt_tokens: prompt,
                    output_tokens: 1,
                    blocks: blocks.clone(),
                    ..Default::default()
                },
                0.0,
            );
            t = e.run_until_idle(0.0, &mut out, 1000);
        }
        let start = t;
        for i in 0..batch {
            e.submit(
                Request {
                    id: u64::from(i) + 1,
                    prompt_tokens: if i == 0 { prompt } else { 32 },
                    output_tokens: 129,
                    blocks: if i == 0 { blocks.clone() } else { Vec::new() },
                    ..Default::default()
                },
                start,
            );
        }
        out.clear();
        e.run_until_idle(t, &mut out, 10_000);
        let at = |want: fn(&EventKind) -> bool| {
            out.iter()
                .find(|x| x.id == 1 && want(&x.kind))
                .map_or(f64::NAN, |x| x.at)
        };
        let first = at(|k| matches!(k, EventKind::FirstToken { .. }));
        let done = at(|k| *k == EventKind::Finished);
        (first - start, (done - first) / 128.0)
    }

    #[test]
    fn preset_matches_the_published_ranges() {
        let p = Params::llama70b_h100x8();
        // AWS SageMaker benchmark (8 000-token shared prefix, 7 × p5.48xlarge): model TTFT
        // 63–280 ms. Uncached 8 150 tokens: the top of the range; a hit: far below it.
        let (cold, _) = lone(&p, 8150, false, 1);
        assert!((0.25..=0.29).contains(&cold), "cold 8k TTFT {cold}");
        let (hit, _) = lone(&p, 8150, true, 1);
        assert!(hit < 0.063, "cached 8k TTFT {hit}");
        // vLLM CI latency test (Llama-3-70B TP4 H200, batch 8, 32 in / 128 out: 2 077 ms,
        // 16.2 ms per step) scaled by HBM bandwidth to 8 × H100 (19.2 → 26.8 TB/s): 11.6 ms.
        let (_, step8) = lone(&p, 32, false, 8);
        assert!(
            (0.0116 * 0.9..=0.0116 * 1.15).contains(&step8),
            "step {step8}"
        );
        // Step time grows with the batch (30 µs per sequence + context reads).
        let (_, step64) = lone(&p, 32, false, 64);
        assert!(step64 > step8 + 0.0015, "{step64} vs {step8}");
        // NVIDIA GH200 NVL32 (TensorRT-LLM, 32 GPUs): 472 ms for a 32 768-token prompt; on 4×
        // fewer GPUs of the same compute, at most 4 × 472 ms; attention makes it super-linear.
        let (long, _) = lone(&p, 32_768, false, 1);
        assert!((1.0..=1.9).contains(&long), "32k TTFT {long}");
        assert!(long > 4.0 * lone(&p, 8192, false, 1).0);
    }
}
