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

mod bound;
mod engine;
mod levels;
mod model;
mod policies;
mod replica;
mod report;
mod rng;
mod stats;
mod text;
mod trace;
/// Trace parsing shared with `prefix-load --trace`.
#[path = "../../emulator/src/load/trace.rs"]
#[allow(dead_code)]
mod trace_file;
mod tracegen;
mod verdict;
mod workload;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

use crate::model::ModelParams;
use crate::policies::ours::OursParams;
use crate::policies::{KeyBook, DEFAULT};
use crate::report::Summary;
use crate::workload::{Knobs, Workload};

const USAGE: &str = "\
usage: simulate [options]
  --workload W[,W..]  sagemaker | chat | rag | unique | trace | all   (default all;
                      `all` includes trace when --trace is given)
  --trace FILE        Mooncake-style JSONL trace (timestamp, input_length,
                      output_length, hash_ids)
  --time-scale F      multiply trace timestamps by F (<1 = more load; default 0.35)
  --time-unit U       trace timestamp unit s|ms|us|ns (default: detected)
  --block-tokens N    tokens per trace block (default: inferred)
  --policies P[,P..]  default: random, round_robin, least_request,
                      least_request_core, session, sagemaker, sagemaker_tuned,
                      chwbl, chwbl_tuned, gie, gie_tuned, sglang, sglang_tuned,
                      greedy_true_state, greedy_true_ttft, ours, ours_2x;
                      baselines take parameters: sagemaker:pl=4096/th=64/least=1
  --replicas N        default 7
  --seed N            default 1
  --seeds N           run seeds seed..seed+N-1 and report means with 95 % CIs
                      and the verdict paired over the seeds (default 5: one
                      seed decides ties by chance; 1 prints every column of
                      that one run)
  --load-levels X,..  measure each workload's saturation rate (levels.rs) and run
                      at these fractions of it (e.g. 0.5,0.8,0.95)
  --max-wall-s S      give up (exit 1, with a message) after S s of wall time
                      (default 600 per seed)
  --gen-trace KIND    write a generated trace to --out and exit; KIND:
                      heldout (Mooncake-like, ms, 512-token chained blocks) or
                      nsblocks (epoch-ns strings, 32-token unchained blocks)
  --out FILE          output of --gen-trace
  --scale F           multiply the synthetic workloads' request counts (default 1)
  --load F            multiply the synthetic workloads' arrival rates (default 1)
  --threads N         worker threads (default 2)
  --ours K=V[,K=V..]  override a parameter of `ours` (see README)
  --json FILE         also write every figure as JSON to FILE ('-' = stdout)
  --gw-modes M[,M..]  add multi-gateway policies MODE/N[/DELAY] (policies/gateways.rs:
                      indep, det, peer, truth, eng, anchor, exc, joined by +)
  --gateways N[,N..]  gateway counts of --gw-modes (default 1,2,4,8)
  --sync-delay-ms D[,D..]  peer delay / engine scrape period (default 0,50,200,1000)
  --gw K=V[,K=V..]    gateway knobs (anchor_block, det_choices, scrape_ms, max_pending,
                      min_publish, refresh_s, pub_pending, peer_end_marks, record_at_route, shared_pressure)
";

struct Args {
    workloads: Vec<String>,
    trace: Option<String>,
    trace_opt: trace::TraceOptions,
    seeds: u64,
    load_levels: Vec<f64>,
    /// Wall-clock limit, s; `None`: [`WALL_S_PER_SEED`] × seeds.
    max_wall_s: Option<f64>,
    gen: Option<String>,
    out: Option<String>,
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

/// Seeds of a run unless `--seeds` says otherwise: issue 9 asks every table
/// for at least 5 seeds with 95 % CIs, and on one seed a tie decides the
/// verdict by chance (`ours` within 1 ms of the best p90 on light
/// small-block traces, a baseline's lucky tie-break on the public trace).
const DEFAULT_SEEDS: u64 = 5;

/// Default wall-clock limit per seed, s (`--max-wall-s` unset).
const WALL_S_PER_SEED: f64 = 600.0;

impl Args {
    /// The wall-clock limit of this run, s: `--max-wall-s`, else
    /// [`WALL_S_PER_SEED`] × seeds; within 1 s … 10⁷ s.
    fn wall_limit_s(&self) -> f64 {
        self.max_wall_s
            .unwrap_or(WALL_S_PER_SEED * self.seeds as f64)
            .clamp(1.0, 1e7)
    }
}

fn parse_args() -> Result<Args, String> {
    parse_args_from(std::env::args().skip(1).collect())
}

fn parse_args_from(argv: Vec<String>) -> Result<Args, String> {
    let mut a = Args {
        workloads: vec!["all".into()],
        trace: None,
        trace_opt: trace::TraceOptions::default(),
        seeds: DEFAULT_SEEDS,
        load_levels: Vec::new(),
        max_wall_s: None,
        gen: None,
        out: None,
        time_scale: 0.35,
        policies: DEFAULT.iter().map(|s| s.to_string()).collect(),
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
    let mut it = argv.into_iter();
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
            "--time-unit" => a.trace_opt.time_unit = Some(trace::TimeUnit::parse(&val()?)?),
            "--block-tokens" => a.trace_opt.block_tokens = Some(num(val()?)? as u32),
            "--seeds" => a.seeds = (num(val()?)? as u64).max(1),
            "--max-wall-s" => a.max_wall_s = Some(num(val()?)?),
            "--load-levels" => {
                a.load_levels = val()?
                    .split(',')
                    .map(|x| num(x.to_string()))
                    .collect::<Result<_, _>>()?
            }
            "--gen-trace" => a.gen = Some(val()?),
            "--out" => a.out = Some(val()?),
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
        if a.policies.len() == DEFAULT.len() {
            a.policies = vec!["ours".into()];
        }
        let grid = policies::gateways::grid(&a.gw.modes, &a.gw.ns, &a.gw.delays)?;
        a.policies.extend(grid);
        policies::gateways::set_knobs(a.gw.knobs);
    }
    for p in &a.policies {
        policies::resolve(p)?;
    }
    a.trace_opt.time_scale = a.time_scale;
    Ok(a)
}

fn workloads(a: &Args, seed: u64) -> Result<Vec<Workload>, String> {
    let k = Knobs {
        scale: a.knobs_scale,
        load: a.knobs_load,
        seed,
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
                let (w, stats) = trace::load(path, &a.trace_opt)?;
                if seed == a.seed {
                    eprintln!("trace: {}", stats.summary());
                }
                w
            }
            other => return Err(format!("unknown workload {other}")),
        });
    }
    Ok(out)
}

/// Rows of one (workload, seed) and the infinite-cache bound.
fn run_workload(
    a: &Args,
    w: &Workload,
    model: &ModelParams,
    seed: u64,
    mult: Option<f64>,
    deadline: Instant,
) -> Result<(Vec<Summary>, f64), String> {
    let t0 = Instant::now();
    let book = KeyBook::new(&a.policies, a.replicas, &a.ours)?;
    let mut reqs = workload::prepare(&w.specs, &book, a.threads)?;
    if let Some(m) = mult {
        reqs = levels::with_load(&reqs, m);
    }
    eprintln!(
        "{} (seed {seed}): {} requests prepared in {:.1} s",
        w.name,
        reqs.len(),
        t0.elapsed().as_secs_f64()
    );
    let bound: Mutex<Option<f64>> = Mutex::new(None);
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
                let limits = engine::Limits {
                    deadline: Some(deadline),
                    progress_every_s: 15.0,
                    label: format!("{} {name}", w.name),
                };
                let out = policies::build(name, &book, a.replicas, seed, model, &a.ours).and_then(
                    |mut p| {
                        let res = engine::run(p.as_mut(), &reqs, model, a.replicas, &limits)?;
                        if let Ok(mut b) = bound.lock() {
                            if b.is_none() {
                                *b = Some(bound::infinite_cache_hit_rate(&reqs, &res.records));
                            }
                        }
                        let mut sum =
                            report::summarize(name, &reqs, &res, t.elapsed().as_secs_f64());
                        sum.extra = p.extra();
                        Ok(sum)
                    },
                );
                if let Ok(mut r) = results.lock() {
                    r[i] = Some(out);
                }
            });
        }
    });
    let results = results.into_inner().map_err(|e| e.to_string())?;
    let rows = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a simulation thread died".into())))
        .collect::<Result<Vec<_>, _>>()?;
    let bound = bound
        .into_inner()
        .map_err(|e| e.to_string())?
        .unwrap_or(f64::NAN);
    Ok((rows, bound))
}

fn print_extra(rows: &[Summary]) {
    for r in rows {
        if !r.extra.is_empty() {
            let extra: Vec<String> = r.extra.iter().map(|(k, v)| format!("{k}={v:.3}")).collect();
            println!("  {}: {}", r.policy, extra.join(" "));
        }
    }
}

/// `(label, arrival-rate multiplier)` of each load level of `w`: the nominal
/// rate when `--load-levels` is not given, else fractions of the measured
/// saturation multiplier.
fn load_levels(
    a: &Args,
    w: &Workload,
    model: &ModelParams,
    deadline: Instant,
) -> Result<Vec<(String, Option<f64>)>, String> {
    if a.load_levels.is_empty() {
        return Ok(vec![(String::new(), None)]);
    }
    let t = Instant::now();
    let book = KeyBook::new(&[levels::PROBE.to_string()], a.replicas, &a.ours)?;
    let reqs = workload::prepare(&w.specs, &book, a.threads)?;
    let sat = levels::saturation(&reqs, a.replicas, model, deadline, &w.name)?;
    eprintln!(
        "{}: {} ({:.0} s)",
        w.name,
        sat.why,
        t.elapsed().as_secs_f64()
    );
    let of = if sat.reached {
        "saturation".to_string()
    } else {
        format!("×{:.0}, NOT saturated there (search cap)", levels::MAX_MULT)
    };
    Ok(a.load_levels
        .iter()
        .map(|x| {
            (
                format!(
                    " | load {:.0} % of {of} (rate ×{:.2})",
                    100.0 * x,
                    x * sat.mult
                ),
                Some(x * sat.mult),
            )
        })
        .collect())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Some(kind) = &args.gen {
        let Some(out) = &args.out else {
            eprintln!("--gen-trace needs --out FILE");
            std::process::exit(2);
        };
        match tracegen::generate(kind, args.seed, args.knobs_scale) {
            Ok(text) => {
                if let Err(e) = std::fs::write(out, text) {
                    eprintln!("cannot write {out}: {e}");
                    std::process::exit(1);
                }
                return;
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        }
    }
    let model = ModelParams::default();
    let started = Instant::now();
    let deadline = started + std::time::Duration::from_secs_f64(args.wall_limit_s());
    let names = match workloads(&args, args.seed) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut doc = Vec::new();
    for (wi, w0) in names.iter().enumerate() {
        let loads = match load_levels(&args, w0, &model, deadline) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{}: {e}", w0.name);
                std::process::exit(1);
            }
        };
        for (level, mult) in loads {
            let mut per_seed: Vec<(Vec<Summary>, f64)> = Vec::new();
            let mut description = w0.description.clone();
            for s in 0..args.seeds {
                let seed = args.seed + s;
                let regenerated;
                let w = if s == 0 {
                    w0
                } else {
                    regenerated = match workloads(&args, seed) {
                        Ok(mut ws) if wi < ws.len() => ws.swap_remove(wi),
                        Ok(_) => continue,
                        Err(e) => {
                            eprintln!("{e}");
                            std::process::exit(2);
                        }
                    };
                    &regenerated
                };
                description = format!("{}{level}", w.description);
                match run_workload(&args, w, &model, seed, mult, deadline) {
                    Ok((rows, bound)) => {
                        if args.seeds == 1 {
                            print!("{}", report::table(&w.name, &description, &rows, bound));
                            print_extra(&rows);
                        }
                        per_seed.push((rows, bound));
                    }
                    Err(e) => {
                        eprintln!("{}: {e}", w.name);
                        std::process::exit(1);
                    }
                }
            }
            let agg = stats::aggregate(&per_seed);
            if args.seeds > 1 {
                print!(
                    "{}",
                    stats::table(&w0.name, &description, &agg, args.seeds, args.replicas)
                );
            }
            let verdict = verdict::judge(&per_seed, "ours");
            if let Some(v) = &verdict {
                println!("{v}");
            }
            doc.push(json!({
                "workload": w0.name,
                "description": description,
                "load_multiplier": mult,
                "seeds": args.seeds,
                "aggregate": stats::to_json(&agg),
                "criterion": verdict.as_ref().map(verdict::to_json),
                "runs": per_seed.iter().map(|(rows, bound)| json!({
                    "bound_hit_rate": bound,
                    "policies": rows.iter().map(report::to_json).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            }));
        }
    }
    eprintln!("total wall time {:.1} s", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        let out = json!({
            "replicas": args.replicas,
            "seed": args.seed,
            "seeds": args.seeds,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults: 5 seeds (a verdict paired over seeds), a wall-clock limit
    /// of 600 s per seed unless `--max-wall-s` sets one.
    #[test]
    fn five_seeds_and_a_wall_limit_per_seed_by_default() {
        let args = |v: &[&str]| parse_args_from(v.iter().map(|s| s.to_string()).collect()).unwrap();
        let a = args(&[]);
        assert_eq!(a.seeds, 5);
        assert_eq!(a.wall_limit_s(), 3000.0);
        let a = args(&["--seeds", "1"]);
        assert_eq!((a.seeds, a.wall_limit_s()), (1, 600.0));
        let a = args(&["--seeds", "3", "--max-wall-s", "30"]);
        assert_eq!((a.seeds, a.wall_limit_s()), (3, 30.0));
        assert_eq!(args(&["--max-wall-s", "0"]).wall_limit_s(), 1.0);
    }

    /// The fast mode in miniature: synthetic workloads and both generated
    /// trace shapes, 5 seeds, every policy family. No policy may beat the
    /// infinite-cache bound (an invariant, seed by seed), the runs finish,
    /// and the aggregate carries intervals.
    #[test]
    fn fast_mode_bound_holds_for_every_policy_and_seed() {
        let dir = std::env::temp_dir().join(format!("simulate-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ns = dir.join("ns.jsonl");
        std::fs::write(&ns, tracegen::generate("nsblocks", 2, 0.025).unwrap()).unwrap();
        let mut a = parse_args_from(Vec::new()).unwrap();
        a.knobs_scale = 0.01;
        a.threads = 2;
        a.policies = [
            "random",
            "sagemaker_tuned",
            "sglang",
            "gie",
            "greedy_true_state",
            "ours",
        ]
        .map(String::from)
        .to_vec();
        a.trace = Some(ns.to_string_lossy().into_owned());
        a.trace_opt.time_scale = 0.05;
        let deadline = Instant::now() + std::time::Duration::from_secs(120);
        let model = ModelParams::default();
        for w0 in ["sagemaker", "chat", "trace"] {
            a.workloads = vec![w0.to_string()];
            let mut runs = Vec::new();
            for seed in 1..=5 {
                let w = workloads(&a, seed).unwrap().swap_remove(0);
                let (rows, bound) = run_workload(&a, &w, &model, seed, None, deadline).unwrap();
                assert!(bound > 0.0 && bound <= 1.0, "{w0}: bound {bound}");
                for r in &rows {
                    assert_eq!(r.completed, r.total, "{w0} {}", r.policy);
                    assert!(
                        r.hit_rate <= bound + 1e-9,
                        "{w0} {}: {} > bound {bound}",
                        r.policy,
                        r.hit_rate
                    );
                }
                runs.push((rows, bound));
            }
            let agg = stats::aggregate(&runs);
            assert_eq!(agg.len(), a.policies.len());
            assert!(agg.iter().all(|x| x.hit.half.is_finite()));
            let t = stats::table(w0, "", &agg, 5, a.replicas);
            assert!(t.contains('±'), "{t}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
