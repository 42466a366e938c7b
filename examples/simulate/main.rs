//! Discrete-event routing simulator: the routing core of the filter, the
//! baselines it competes with and an oracle, side by side on a model of
//! vLLM replicas with block-level prefix caches.
//!
//! ```text
//! cargo run --release --example simulate -- --workload all \
//!     --trace /path/to/mooncake_conversation_trace.jsonl [--json out.json]
//! ```
//! See `examples/simulate/README.md` for the model, its calibration, the
//! workloads and the policies.

mod cache;
mod engine;
mod model;
mod policies;
mod replica;
mod report;
mod rng;
mod text;
mod trace;
mod workload;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

use crate::model::ModelParams;
use crate::policies::ours::OursParams;
use crate::policies::{KeyBook, ALL};
use crate::report::Summary;
use crate::workload::{Knobs, Workload};

const USAGE: &str = "\
usage: simulate [options]
  --workload W[,W..]  sagemaker | chat | rag | unique | trace | all   (default all;
                      `all` includes trace when --trace is given)
  --trace FILE        Mooncake-format JSONL trace (timestamp ms, input_length,
                      output_length, hash_ids of 512-token blocks)
  --time-scale F      multiply trace timestamps by F (<1 = more load; default 0.35)
  --policies P[,P..]  default: all of random, round_robin, least_request,
                      least_request_core, session, sagemaker, chwbl, gie, sglang,
                      oracle, oracle_ttft, ours, ours_2x
  --replicas N        default 7
  --seed N            default 1
  --scale F           multiply the synthetic workloads' request counts (default 1)
  --load F            multiply the synthetic workloads' arrival rates (default 1)
  --threads N         worker threads (default 2)
  --ours K=V[,K=V..]  override a parameter of `ours` (see README)
  --json FILE         also write every figure as JSON to FILE ('-' = stdout)
  --gw-modes M[,M..]  add multi-gateway policies MODE/N[/DELAY] (policies/gateways.rs:
                      indep, det, peer, truth, eng, anchor, exc, joined by +)
  --gateways N[,N..]  gateway counts of --gw-modes (default 1,2,4,8)
  --sync-delay-ms D[,D..]  peer delay / engine scrape period (default 0,50,200,1000)
  --gw K=V[,K=V..]    gateway knobs (anchor_block, det_choices, scrape_ms, max_pending)
";

struct Args {
    workloads: Vec<String>,
    trace: Option<String>,
    time_scale: f64,
    policies: Vec<String>,
    replicas: usize,
    seed: u64,
    knobs_scale: f64,
    knobs_load: f64,
    threads: usize,
    ours: OursParams,
    json: Option<String>,
    gw: GwArgs,
}

/// Multi-gateway grid (`--gw-modes`, `--gateways`, `--sync-delay-ms`, `--gw`).
struct GwArgs {
    modes: Vec<String>,
    ns: Vec<usize>,
    delays: Vec<u64>,
    knobs: policies::gateways::Knobs,
}

/// Comma-separated numbers.
fn list<T: std::str::FromStr>(v: &str) -> Result<Vec<T>, String> {
    v.split(',')
        .map(|x| x.trim().parse::<T>().map_err(|_| format!("bad number {x}")))
        .collect()
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        workloads: vec!["all".into()],
        trace: None,
        time_scale: 0.35,
        policies: ALL.iter().map(|s| s.to_string()).collect(),
        replicas: 7,
        seed: 1,
        knobs_scale: 1.0,
        knobs_load: 1.0,
        threads: 2,
        ours: OursParams::default(),
        json: None,
        gw: GwArgs {
            modes: Vec::new(),
            ns: vec![1, 2, 4, 8],
            delays: vec![0, 50, 200, 1000],
            knobs: Default::default(),
        },
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            print!("{USAGE}");
            std::process::exit(0);
        }
        let mut val = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let num = |v: String| -> Result<f64, String> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--workload" => a.workloads = val()?.split(',').map(str::to_string).collect(),
            "--trace" => a.trace = Some(val()?),
            "--time-scale" => a.time_scale = num(val()?)?,
            "--policies" => a.policies = val()?.split(',').map(str::to_string).collect(),
            "--replicas" => a.replicas = num(val()?)? as usize,
            "--seed" => a.seed = num(val()?)? as u64,
            "--scale" => a.knobs_scale = num(val()?)?,
            "--load" => a.knobs_load = num(val()?)?,
            "--threads" => a.threads = (num(val()?)? as usize).max(1),
            "--ours" => {
                for kv in val()?.split(',') {
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or_else(|| format!("--ours expects K=V, got {kv}"))?;
                    a.ours.set(k, v)?;
                }
            }
            "--json" => a.json = Some(val()?),
            "--gw-modes" => a.gw.modes = val()?.split(',').map(str::to_string).collect(),
            "--gateways" => a.gw.ns = list(&val()?)?,
            "--sync-delay-ms" => a.gw.delays = list(&val()?)?,
            "--gw" => {
                for kv in val()?.split(',') {
                    let (k, v) = kv
                        .split_once('=')
                        .ok_or(format!("--gw expects K=V, got {kv}"))?;
                    a.gw.knobs.set(k, v)?;
                }
            }
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if a.replicas == 0 || a.replicas > 64 {
        return Err("--replicas must be 1..=64".into());
    }
    if !a.gw.modes.is_empty() {
        if a.policies.len() == ALL.len() {
            a.policies = vec!["ours".into()];
        }
        let grid = policies::gateways::grid(&a.gw.modes, &a.gw.ns, &a.gw.delays)?;
        a.policies.extend(grid);
        policies::gateways::set_knobs(a.gw.knobs);
    }
    for p in &a.policies {
        if !ALL.contains(&p.as_str())
            && !policies::EXTRA.contains(&p.as_str())
            && !policies::gateways::is_name(p)
        {
            return Err(format!("unknown policy {p}; known: {}", ALL.join(", ")));
        }
    }
    Ok(a)
}

fn workloads(a: &Args) -> Result<Vec<Workload>, String> {
    let k = Knobs {
        scale: a.knobs_scale,
        load: a.knobs_load,
        seed: a.seed,
    };
    let mut names: Vec<String> = Vec::new();
    for w in &a.workloads {
        if w == "all" {
            names.extend(["sagemaker", "chat", "rag", "unique"].map(String::from));
            if a.trace.is_some() {
                names.push("trace".into());
            }
        } else {
            names.push(w.clone());
        }
    }
    let mut out = Vec::new();
    for n in names {
        out.push(match n.as_str() {
            "sagemaker" => workload::sagemaker(&k),
            "chat" => workload::chat(&k),
            "rag" => workload::rag(&k),
            "unique" => workload::unique(&k),
            "trace" => {
                let path = a
                    .trace
                    .as_deref()
                    .ok_or("workload `trace` needs --trace FILE")?;
                let (w, stats) = trace::load(path, a.time_scale)?;
                eprintln!("trace: {}", stats.summary());
                w
            }
            other => return Err(format!("unknown workload {other}")),
        });
    }
    Ok(out)
}

fn run_workload(a: &Args, w: &Workload, model: &ModelParams) -> Result<Vec<Summary>, String> {
    let t0 = Instant::now();
    let book = KeyBook::new(&a.policies, a.replicas, &a.ours)?;
    let reqs = workload::prepare(&w.specs, &book, a.threads)?;
    eprintln!(
        "{}: {} requests prepared in {:.1} s",
        w.name,
        reqs.len(),
        t0.elapsed().as_secs_f64()
    );
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Summary, String>>>> =
        Mutex::new(vec![None; a.policies.len()]);
    std::thread::scope(|s| {
        for _ in 0..a.threads.min(a.policies.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(name) = a.policies.get(i) else {
                    break;
                };
                let t = Instant::now();
                let out = policies::build(name, &book, a.replicas, a.seed, model, &a.ours).map(
                    |mut p| {
                        let res = engine::run(p.as_mut(), &reqs, model, a.replicas);
                        let mut sum =
                            report::summarize(name, &reqs, &res, t.elapsed().as_secs_f64());
                        sum.extra = p.extra();
                        sum
                    },
                );
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(out);
                }
            });
        }
    });
    let results = results.into_inner().map_err(|e| e.to_string())?;
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a simulation thread died".into())))
        .collect()
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let model = ModelParams::default();
    let started = Instant::now();
    let ws = match workloads(&args) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut doc = Vec::new();
    for w in &ws {
        match run_workload(&args, w, &model) {
            Ok(rows) => {
                print!("{}", report::table(&w.name, &w.description, &rows));
                for r in &rows {
                    if !r.extra.is_empty() {
                        let extra: Vec<String> =
                            r.extra.iter().map(|(k, v)| format!("{k}={v:.3}")).collect();
                        println!("  {}: {}", r.policy, extra.join(" "));
                    }
                }
                doc.push(json!({
                    "workload": w.name,
                    "description": w.description,
                    "policies": rows.iter().map(report::to_json).collect::<Vec<_>>(),
                }));
            }
            Err(e) => {
                eprintln!("{}: {e}", w.name);
                std::process::exit(1);
            }
        }
    }
    eprintln!("total wall time {:.1} s", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        let out = json!({
            "replicas": args.replicas,
            "seed": args.seed,
            "model": format!("{model:?}"),
            "ours": format!("{:?}", args.ours),
            "workloads": doc,
        });
        let text = serde_json::to_string_pretty(&out).unwrap_or_default();
        if path == "-" {
            println!("{text}");
        } else if let Err(e) = std::fs::write(path, text) {
            eprintln!("cannot write {path}: {e}");
            std::process::exit(1);
        }
    }
}
