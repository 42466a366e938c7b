//! Replica model parameters and their calibration. The engine itself is the shared crate
//! `engine-model` ([`ModelParams::engine`] maps these numbers onto it).
//!
//! Target: **Llama-3.1-70B-Instruct, bf16, on one 8×H100-80GB node (TP=8), vLLM
//! V1 with automatic prefix caching** — the setup of AWS's SageMaker
//! prefix-aware benchmark (7 × ml.p5.48xlarge). The derivation of each number is
//! in `examples/simulate/README.md` ("Calibration"); in short:
//!
//! - prefill: 141 GFLOP per token (2 × 70.6 B parameters); 8 × 989 TFLOP/s
//!   dense bf16 at ≈ 55 % MFU for large chunks ⇒ ≈ 33 k tokens/s, i.e.
//!   **30 µs per uncached token**, plus attention: a token at position `p`
//!   costs `4·p·8192·80` FLOP more, i.e. a factor `1 + p/53 800`. An 8 150-token
//!   uncached prompt then takes ≈ 265 ms, the upper end of the 63–280 ms TTFT
//!   range AWS reports for this setup;
//! - decode step: weights (141 GB) read at ≈ 60 % of 8 × 3.35 TB/s plus TP
//!   all-reduces ⇒ **12 ms per step**, plus **30 µs per running sequence**
//!   (its share of the matmuls) and **20 ns per context token** (KV read:
//!   320 KiB per token at ≈ 16 TB/s);
//! - KV capacity: 8 × 80 GB × 0.9 − 141 GB weights − ≈ 25 GB activations ≈
//!   410 GB, at 320 KiB per token (80 layers × 8 KV heads × 128 × 2 × 2 B)
//!   ⇒ 1.25 M tokens = **78 000 blocks of 16 tokens**;
//! - scheduler: vLLM V1 defaults `max_num_seqs` 256, `max_num_batched_tokens`
//!   8192 (chunked prefill), FIFO admission;
//! - API server: **10 ms + 1 µs per prompt token** (HTTP, tokenization) before
//!   the request reaches the engine.

/// Replica (engine) parameters.
#[derive(Debug, Clone)]
pub struct ModelParams {
    /// KV cache capacity in 16-token blocks.
    pub kv_blocks: u32,
    /// Largest number of running sequences.
    pub max_num_seqs: u32,
    /// Token budget of one engine step (decode tokens + prefill chunk).
    pub max_batched_tokens: u32,
    /// Prefill cost per token at position 0, seconds.
    pub prefill_s_per_token: f64,
    /// Position at which attention doubles a prefill token's cost.
    pub attention_tokens: f64,
    /// Fixed cost of one engine step, seconds.
    pub step_base_s: f64,
    /// Cost per running (decoding) sequence per step, seconds.
    pub decode_s_per_seq: f64,
    /// KV read cost per context token per decoding sequence per step, seconds.
    pub decode_s_per_ctx_token: f64,
    /// API-server delay before the engine sees a request, seconds.
    pub api_base_s: f64,
    /// API-server delay per prompt token (tokenization), seconds.
    pub api_s_per_token: f64,
}

impl Default for ModelParams {
    fn default() -> Self {
        ModelParams {
            kv_blocks: 78_000,
            max_num_seqs: 256,
            max_batched_tokens: 8192,
            prefill_s_per_token: 30e-6,
            attention_tokens: 53_800.0,
            step_base_s: 0.012,
            decode_s_per_seq: 30e-6,
            decode_s_per_ctx_token: 20e-9,
            api_base_s: 0.010,
            api_s_per_token: 1e-6,
        }
    }
}

impl ModelParams {
    /// Cost of prefilling positions `[from, to)`, seconds (the engine model's formula).
    pub fn prefill_cost(&self, from: u32, to: u32) -> f64 {
        self.engine().prefill_cost(from, to)
    }

    /// The shared engine model's parameters (16-token blocks, unlimited partial prefills, no
    /// per-request overhead: the API server's delay is charged before the engine).
    pub fn engine(&self) -> engine_model::Params {
        engine_model::Params {
            block_tokens: crate::text::KV_BLOCK_TOKENS,
            kv_blocks: self.kv_blocks,
            max_num_seqs: self.max_num_seqs,
            max_batched_tokens: self.max_batched_tokens,
            max_partial_prefills: 0,
            prefill_s_per_token: self.prefill_s_per_token,
            attention_tokens: self.attention_tokens,
            step_base_s: self.step_base_s,
            decode_s_per_seq: self.decode_s_per_seq,
            decode_s_per_ctx_token: self.decode_s_per_ctx_token,
            request_overhead_s: 0.0,
        }
    }

    /// API-server delay for a prompt of `tokens`.
    pub fn api_delay(&self, tokens: u32) -> f64 {
        self.api_base_s + self.api_s_per_token * f64::from(tokens)
    }
}
