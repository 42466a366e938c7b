//! Command line of `prefix-load`: `prefix-load [run] [FLAGS]` replays a workload;
//! `prefix-load table A.json B.json ...` prints summaries side by side.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::client::Client;
use crate::load::report::{self, RunInfo, Summary};
use crate::load::runner::{self, RunConfig};
use crate::load::trace;
use crate::load::workload::{self, Params};

#[derive(Parser, Debug)]
#[command(name = "prefix-load", version, args_conflicts_with_subcommands = true)]
/// Workload driver for prefix-router: streams a deterministic workload through a base URL
/// (Envoy's listener), measures TTFT at the client, and reads the replicas' own prefix-cache
/// counters (and Envoy's prefix_router stats) before and after.
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Cmd {
    /// Run a workload (the default when no subcommand is given).
    Run(RunArgs),
    /// Print JSON summaries side by side (columns = runs, by label).
    Table {
        /// Summary files written with `--json`.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Base URL the requests go to (Envoy's listener, or one replica).
    #[arg(long, default_value = "http://127.0.0.1:10000")]
    pub url: String,
    /// API: `chat` (/v1/chat/completions) or `completions` (/v1/completions).
    #[arg(long, default_value = "chat")]
    pub api: String,
    /// `model` field of every request.
    #[arg(long, default_value = "emulated-model")]
    pub model: String,
    /// Workload: shared-prefix | multi-turn | unique | mixed | sagemaker.
    #[arg(long, default_value = "shared-prefix")]
    pub workload: String,
    /// Seed of the workload (same seed, same requests) and of the arrival times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Total requests (default per workload: 400; multi-turn: conversations x turns).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Prefix groups (shared-prefix 8, sagemaker 16, mixed 4).
    #[arg(long)]
    pub groups: Option<usize>,
    /// Tokens of each shared prefix (shared-prefix/mixed 2000, sagemaker 8000).
    #[arg(long)]
    pub prefix_tokens: Option<usize>,
    /// Tokens of each unique suffix / unique prompt (32; sagemaker 64; unique 128).
    #[arg(long)]
    pub suffix_tokens: Option<usize>,
    /// Chats of the multi-turn workload (32; mixed 12).
    #[arg(long)]
    pub conversations: Option<usize>,
    /// Turns per chat (6; mixed 5).
    #[arg(long)]
    pub turns: Option<usize>,
    /// Tokens of each chat's system prompt (200).
    #[arg(long)]
    pub system_tokens: Option<usize>,
    /// Tokens of each user turn (80).
    #[arg(long)]
    pub turn_tokens: Option<usize>,
    /// Tokens of each synthetic assistant reply in the history (120).
    #[arg(long)]
    pub reply_tokens: Option<usize>,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// Closed loop: this many requests in flight (ignored with --rate).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Open loop: Poisson arrivals at this many requests per second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: at most this many in flight (later arrivals wait).
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout_s: f64,
    /// No request starts after this many seconds.
    #[arg(long, default_value_t = 600.0)]
    pub max_duration_s: f64,
    /// Replica base URL whose /metrics is read before and after (repeatable).
    #[arg(long = "replica")]
    pub replicas: Vec<String>,
    /// Envoy admin base URL: /stats?filter=prefix_router and /clusters before and after.
    #[arg(long)]
    pub envoy_admin: Option<String>,
    /// Extra request header `Name: value` (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// Send this header with the request's group (prefix group / chat id) as a session id.
    #[arg(long)]
    pub session_header: Option<String>,
    /// Label of this run in the summary and in `table`.
    #[arg(long, default_value = "run")]
    pub label: String,
    /// Write the JSON summary here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one JSON line per request here.
    #[arg(long)]
    pub requests_jsonl: Option<PathBuf>,
    /// Replay this Mooncake-style JSONL trace (timestamps, input_length, output_length,
    /// hash_ids) at its own arrival times instead of a workload; the same file the simulator
    /// reads (`--workload trace --trace FILE`). Outputs are capped at --max-tokens.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trace timestamps are multiplied by this (< 1 = faster, more load).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Trace timestamp unit: s | ms | us | ns (default: detected, see the summary line).
    #[arg(long)]
    pub time_unit: Option<String>,
    /// Tokens per trace block (default: inferred from input_length / len(hash_ids)).
    #[arg(long)]
    pub block_tokens: Option<u32>,
    /// Runtime worker threads (1 = single-threaded).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

impl RunArgs {
    pub fn params(&self) -> Params {
        let d = Params::for_workload(&self.workload);
        let mut p = Params {
            groups: self.groups.unwrap_or(d.groups),
            prefix_tokens: self.prefix_tokens.unwrap_or(d.prefix_tokens),
            suffix_tokens: self.suffix_tokens.unwrap_or(d.suffix_tokens),
            conversations: self.conversations.unwrap_or(d.conversations),
            turns: self.turns.unwrap_or(d.turns),
            system_tokens: self.system_tokens.unwrap_or(d.system_tokens),
            turn_tokens: self.turn_tokens.unwrap_or(d.turn_tokens),
            reply_tokens: self.reply_tokens.unwrap_or(d.reply_tokens),
            requests: d.requests,
        };
        p.requests = self.requests.unwrap_or(if self.workload == "multi-turn" {
            p.conversations * p.turns
        } else {
            d.requests
        });
        p
    }
}

fn parse_header(h: &str) -> Result<(String, String), String> {
    let (k, v) = h
        .split_once(':')
        .ok_or_else(|| format!("--header needs 'Name: value': {h}"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

/// Runs one workload and reports; returns the summary.
pub async fn run(a: RunArgs) -> Result<Summary, String> {
    let path = match a.api.as_str() {
        "chat" => "/v1/chat/completions",
        "completions" => "/v1/completions",
        o => return Err(format!("--api must be chat or completions, not {o}")),
    };
    let (items, workload_name) = match &a.trace {
        Some(path) => {
            let opt = trace::TraceOptions {
                time_scale: a.time_scale,
                time_unit: a
                    .time_unit
                    .as_deref()
                    .map(trace::TimeUnit::parse)
                    .transpose()?,
                block_tokens: a.block_tokens,
            };
            let (reqs, st, name) = trace::load_requests(&path.to_string_lossy(), &opt)?;
            eprintln!("prefix-load: trace {name}: {}", st.summary());
            (
                workload::from_trace(&reqs, st.block_tokens as usize, a.max_tokens),
                format!("trace:{name}"),
            )
        }
        None => (
            workload::build(&a.workload, &a.params(), a.seed)?,
            a.workload.clone(),
        ),
    };
    let headers = a
        .headers
        .iter()
        .map(|h| parse_header(h))
        .collect::<Result<Vec<_>, _>>()?;
    let client = Client::new(&a.url).map_err(|e| e.to_string())?;
    let cfg = RunConfig {
        path: path.to_string(),
        model: a.model.clone(),
        max_tokens: a.max_tokens,
        concurrency: a.concurrency,
        rate: a.rate,
        max_in_flight: a.max_in_flight,
        timeout: Duration::from_secs_f64(a.timeout_s.max(0.001)),
        deadline: Duration::from_secs_f64(a.max_duration_s.max(0.0)),
        headers,
        session_header: a.session_header.clone(),
        seed: a.seed,
    };

    let scrape_all = |urls: Vec<String>| async move {
        let mut v = Vec::new();
        for u in &urls {
            v.push(report::scrape_replica(u).await);
        }
        v
    };
    let before = scrape_all(a.replicas.clone()).await;
    let envoy_before = match &a.envoy_admin {
        Some(u) => Some(report::scrape_envoy(u).await),
        None => None,
    };
    for r in &before {
        if let Some(e) = &r.error {
            eprintln!("prefix-load: warning: {}: {e}", r.url);
        }
    }
    eprintln!(
        "prefix-load: {} requests ({}) -> {}{} ({})",
        items.len(),
        workload_name,
        a.url,
        path,
        match (a.trace.is_some(), a.rate) {
            (true, _) => format!("trace times x {}", a.time_scale),
            (false, Some(r)) => format!("{r} req/s open loop"),
            (false, None) => format!("concurrency {}", a.concurrency),
        }
    );
    let (outcomes, wall) = runner::run(client, cfg, items).await;
    let after = scrape_all(a.replicas.clone()).await;
    let envoy_after = match &a.envoy_admin {
        Some(u) => Some(report::scrape_envoy(u).await),
        None => None,
    };
    let pairs: Vec<_> = before.into_iter().zip(after).collect();
    let envoy = envoy_before.as_ref().zip(envoy_after.as_ref());
    let info = RunInfo {
        label: a.label.clone(),
        workload: workload_name,
        seed: a.seed,
        url: a.url.clone(),
        path: path.to_string(),
        concurrency: a.concurrency,
        rate: a.rate,
        max_tokens: a.max_tokens,
        duration_s: wall.as_secs_f64(),
    };
    let summary = report::summarize(info, &outcomes, &pairs, envoy);
    if let Some(p) = &a.requests_jsonl {
        let mut s = String::new();
        for o in &outcomes {
            s.push_str(&serde_json::to_string(o).map_err(|e| e.to_string())?);
            s.push('\n');
        }
        std::fs::write(p, s).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &a.json {
        let j = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
        std::fs::write(p, j + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
    }
    for e in &summary.first_errors {
        eprintln!("prefix-load: error: {e}");
    }
    println!("{}", report::human_line(&summary));
    Ok(summary)
}

/// `prefix-load table FILES...`.
pub fn table(files: &[PathBuf]) -> Result<String, String> {
    let mut runs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let s: Summary = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a summary: {e}", f.display()))?;
        runs.push(s);
    }
    Ok(report::table(&runs))
}

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let args = match cli.cmd {
        Some(Cmd::Table { files }) => {
            return match table(&files) {
                Ok(t) => {
                    print!("{t}");
                    0
                }
                Err(e) => {
                    eprintln!("prefix-load: {e}");
                    2
                }
            };
        }
        Some(Cmd::Run(a)) => a,
        None => cli.run,
    };
    let rt = match crate::runtime(args.threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("prefix-load: runtime: {e}");
            return 2;
        }
    };
    match rt.block_on(run(args)) {
        Ok(s) if s.ok > 0 => 0,
        Ok(_) => {
            eprintln!("prefix-load: no request succeeded");
            1
        }
        Err(e) => {
            eprintln!("prefix-load: {e}");
            2
        }
    }
}
