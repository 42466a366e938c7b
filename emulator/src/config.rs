//! Flags of the `replica-emulator` binary (every knob is a flag) and the failure modes.

use std::fmt;
use std::str::FromStr;

use clap::Parser;

/// How a replica misbehaves on purpose (flag `--fail`, or `POST /admin/fail?mode=MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    /// Behave normally.
    None,
    /// Answer every model request and `/health` with 503.
    Unavailable,
    /// Accept the request and never answer.
    Hang,
    /// Exit the process (status 1) on the next request, without answering.
    Die,
}

impl FailMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailMode::None => "none",
            FailMode::Unavailable => "503",
            FailMode::Hang => "hang",
            FailMode::Die => "die",
        }
    }

    pub fn to_u8(self) -> u8 {
        self as u8
    }

    pub fn from_u8(v: u8) -> FailMode {
        match v {
            1 => FailMode::Unavailable,
            2 => FailMode::Hang,
            3 => FailMode::Die,
            _ => FailMode::None,
        }
    }
}

impl FromStr for FailMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" | "" => Ok(FailMode::None),
            "503" => Ok(FailMode::Unavailable),
            "hang" => Ok(FailMode::Hang),
            "die" => Ok(FailMode::Die),
            _ => Err(format!("unknown fail mode '{s}' (none|503|hang|die)")),
        }
    }
}

impl fmt::Display for FailMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A vLLM-like OpenAI-compatible model server without a model: prefix (KV) cache, queueing and
/// prefill/decode timing are emulated; the generated text is deterministic filler.
#[derive(Parser, Debug, Clone)]
#[command(name = "replica-emulator", version)]
pub struct EmulatorArgs {
    /// Address to listen on (use loopback addresses only in tests).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port; 0 picks a free one (the chosen address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Replica id, sent back in `x-replica-id` on every response. Default: the port.
    #[arg(long)]
    pub id: Option<String>,
    /// Served model name (`/v1/models`, metrics label `model_name`).
    #[arg(long, default_value = "emulated-model")]
    pub model: String,
    /// Reject requests whose `model` is neither the served model nor a LoRA adapter (404, like vLLM).
    #[arg(long)]
    pub strict_model: bool,
    /// An engine model by name, in place of the capacity and timing flags (`--block-tokens`,
    /// `--cache-blocks`, `--prefill-*`, `--attention-tokens`, `--api-*`, `--decode-*`,
    /// `--max-running`, `--max-num-batched-tokens`, which are then ignored):
    /// `llama70b-h100x8` is the simulator's calibrated model
    /// (`engine_model::Params::llama70b_h100x8` and its API delay).
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Tokens per KV block (vLLM `--block-size`).
    #[arg(long, default_value_t = 16)]
    pub block_tokens: usize,
    /// KV capacity in blocks (vLLM `num_gpu_blocks`).
    #[arg(long, default_value_t = 4096)]
    pub cache_blocks: usize,
    /// Characters per token of the emulated tokenizer.
    #[arg(long, default_value_t = 4)]
    pub chars_per_token: usize,
    /// Prefill cost per UNCACHED prompt token, in microseconds.
    #[arg(long, default_value_t = 100.0)]
    pub prefill_us_per_token: f64,
    /// Fixed prefill cost per request, in milliseconds.
    #[arg(long, default_value_t = 5.0)]
    pub prefill_overhead_ms: f64,
    /// API-server delay before the engine sees a request, in milliseconds (0 = none). Unlike
    /// `--prefill-overhead-ms` it is spent outside the engine: concurrent requests do not add
    /// up, and the engine admits them in the order their delays end.
    #[arg(long, default_value_t = 0.0)]
    pub api_delay_ms: f64,
    /// API-server delay per prompt token (tokenization), in microseconds (0 = none): of
    /// requests that arrive together, the short prompts reach the engine first. The
    /// simulator's calibrated model: `--api-delay-ms 10 --api-us-per-token 1`.
    #[arg(long, default_value_t = 0.0)]
    pub api_us_per_token: f64,
    /// Fixed cost of one engine step, in milliseconds: the inter-token latency of a small batch.
    #[arg(long, default_value_t = 10.0)]
    pub decode_ms_per_token: f64,
    /// Cost of each decoding sequence in an engine step, in microseconds (batch-size term of the
    /// step time; 0 = a step costs the same for 1 or 64 sequences).
    #[arg(long, default_value_t = 0.0)]
    pub decode_us_per_seq: f64,
    /// KV read cost per context token of each decoding sequence in an engine step, in
    /// nanoseconds (0 = none; the simulator's calibrated model: 20).
    #[arg(long, default_value_t = 0.0)]
    pub decode_ns_per_ctx_token: f64,
    /// Attention term of prefill: a token at position `p` costs `1 + p / N` times
    /// `--prefill-us-per-token` (0 = none, linear; the simulator's calibrated model: 53800).
    #[arg(long, default_value_t = 0.0)]
    pub attention_tokens: f64,
    /// Maximum concurrently running sequences (vLLM `--max-num-seqs`); more wait in FIFO order.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// Token budget of one engine step: decode tokens + prefill chunks (vLLM
    /// `--max-num-batched-tokens`); longer prompts are prefilled in chunks.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Maximum sequences prefilling in one engine step; 0 = unlimited (they share the step). With
    /// 1, prefills are serialized like one compute-bound GPU: cache misses then delay everyone.
    #[arg(long, default_value_t = 0)]
    pub prefill_lanes: usize,
    /// Maximum prompt + output tokens of one request (vLLM `--max-model-len`); more is a 400.
    #[arg(long, default_value_t = 131072)]
    pub max_model_len: usize,
    /// LoRA adapters served besides the base model, comma separated (e.g. `a,b`).
    #[arg(long, value_delimiter = ',')]
    pub lora_adapters: Vec<String>,
    /// LoRA adapter slots: 0 = every `--lora-adapters` entry resident, free; N > 0 = at most N
    /// resident (LRU), loading one costs `--lora-load-ms` on the request's TTFT.
    #[arg(long, default_value_t = 0)]
    pub max_loras: usize,
    /// Time to load a LoRA adapter into a slot, in milliseconds (with `--max-loras N > 0`).
    #[arg(long, default_value_t = 200.0)]
    pub lora_load_ms: f64,
    /// Report this many waiting requests in `/metrics` instead of the real count (tests).
    #[arg(long)]
    pub report_waiting: Option<f64>,
    /// Report this many running requests in `/metrics` instead of the real count (tests).
    #[arg(long)]
    pub report_running: Option<f64>,
    /// Report this KV usage (0..1) in `/metrics` instead of the real one (tests).
    #[arg(long)]
    pub report_kv_usage: Option<f64>,
    /// Failure mode at start: none | 503 | hang | die.
    #[arg(long, default_value = "none")]
    pub fail: FailMode,
    /// Runtime worker threads; 1 = a single-threaded runtime (cheapest, default).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

/// Named engine models (`--preset`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Llama-3.1-70B on 8×H100 (TP=8), vLLM V1: the simulator's calibrated model.
    #[value(name = "llama70b-h100x8")]
    Llama70bH100x8,
}

/// The simulator's API-server delay (`examples/simulate/model.rs`): 10 ms plus 1 µs per
/// prompt token, before the engine.
const SIM_API_DELAY: (f64, f64) = (10.0, 1.0);

impl EmulatorArgs {
    /// Arguments with every default (for tests and embedding).
    pub fn defaults() -> Self {
        EmulatorArgs::parse_from(["replica-emulator"])
    }

    /// The arguments with `--preset`'s values in place of the capacity and timing flags
    /// (unchanged without a preset). Called once, at start.
    pub fn resolved(mut self) -> Self {
        let Some(Preset::Llama70bH100x8) = self.preset else {
            return self;
        };
        let p = engine_model::Params::llama70b_h100x8();
        let us = |s: f64| s * 1e6;
        self.block_tokens = p.block_tokens as usize;
        self.cache_blocks = p.kv_blocks as usize;
        self.max_running = p.max_num_seqs as usize;
        self.max_num_batched_tokens = p.max_batched_tokens as usize;
        self.prefill_lanes = p.max_partial_prefills as usize;
        self.prefill_us_per_token = us(p.prefill_s_per_token);
        self.attention_tokens = p.attention_tokens;
        self.prefill_overhead_ms = p.request_overhead_s * 1e3;
        self.decode_ms_per_token = p.step_base_s * 1e3;
        self.decode_us_per_seq = us(p.decode_s_per_seq);
        self.decode_ns_per_ctx_token = p.decode_s_per_ctx_token * 1e9;
        (self.api_delay_ms, self.api_us_per_token) = SIM_API_DELAY;
        self
    }
}
