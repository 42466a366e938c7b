//! The discrete-event loop: arrivals → routing policy → API-server delay →
//! replica engine steps → first token / completion.
//!
//! Events are ordered by (time, insertion number), so a run is a pure
//! function of its inputs. The router's view of load is what the filter
//! keeps in shared data: per-replica **in-flight** counts, incremented when a
//! request is routed and decremented when its response ends (`on_log`).
//! Replica state (cache, queues) is visible only to the policies that are
//! allowed to see it (the oracle; GIE through 50 ms-old scraped metrics).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use prefix_router::RoutingKey;

use crate::model::ModelParams;
use crate::policies::{Policy, View};
use crate::replica::{Metrics, Outcome, Replica};

/// When a request arrives.
#[derive(Debug, Clone, Copy)]
pub enum Arrival {
    /// At an absolute time, seconds.
    At(f64),
    /// `think` seconds after request `prev` completed (next chat turn).
    After {
        /// The previous turn.
        prev: u32,
        /// User think time, seconds.
        think: f64,
    },
}

/// Keys every policy may need, computed once per request.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    /// `Router::key` outputs, one per router configuration in the key book.
    pub core: Vec<RoutingKey>,
    /// KubeAI: hash of the first 100 characters of the first user message.
    pub kubeai: u64,
    /// GIE: chained hashes of 64-character blocks of the messages JSON (≤ 256).
    pub gie: Vec<u64>,
}

/// A request as the simulator holds it (text already reduced to keys/hashes).
#[derive(Debug, Clone)]
pub struct SimRequest {
    /// Arrival.
    pub arrival: Arrival,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Size of the full prompt text in characters (what the filter sees as the
    /// body size).
    pub body_chars: u32,
    /// Chained hashes of the prompt's full 16-token KV blocks.
    pub blocks: Vec<u64>,
    /// Hashes of the full blocks completed by the output (cached at the end
    /// when the output text is part of later prompts), else empty.
    pub out_blocks: Vec<u64>,
    /// Routing keys.
    pub keys: Keys,
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestRecord {
    /// Arrival time at the router.
    pub arrived: f64,
    /// Replica chosen.
    pub replica: u32,
    /// The policy moved the request away from the replica it considered warm.
    pub spill: bool,
    /// Time to first token, seconds (NaN if never).
    pub ttft: f64,
    /// Prompt tokens served from the cache.
    pub cached: u32,
    /// Completion time.
    pub done: f64,
}

/// Result of one (workload, policy) run.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Per request.
    pub records: Vec<RequestRecord>,
    /// Per replica: seconds spent in engine steps.
    pub busy: Vec<f64>,
    /// Per replica: requests received.
    pub received: Vec<u64>,
    /// Per replica: seconds of prefill compute.
    pub prefill: Vec<f64>,
    /// Engine steps, all replicas.
    pub steps: u64,
    /// Simulated time of the last completion.
    pub end: f64,
    /// Requests that completed.
    pub completed: usize,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Arrive(u32),
    Engine(u32, u32),
    StepEnd(u32),
    Scrape,
}

#[derive(Debug, Clone, Copy)]
struct Ev {
    t: f64,
    n: u64,
    kind: Kind,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Self) -> Ordering {
        self.t.total_cmp(&o.t).then(self.n.cmp(&o.n))
    }
}

struct Queue {
    heap: BinaryHeap<Reverse<Ev>>,
    n: u64,
}

impl Queue {
    fn push(&mut self, t: f64, kind: Kind) {
        self.n += 1;
        self.heap.push(Reverse(Ev { t, n: self.n, kind }));
    }
}

/// Scrape period of the metrics-based policies (GIE's `--refresh-metrics-interval`).
pub const SCRAPE_PERIOD_S: f64 = 0.05;

/// Wall-clock guard and progress reporting of one run.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Give up (with an error) after this instant.
    pub deadline: Option<std::time::Instant>,
    /// Print progress to stderr every this many wall seconds (0 = never).
    pub progress_every_s: f64,
    /// Label of the progress lines.
    pub label: String,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: None,
            progress_every_s: 0.0,
            label: String::new(),
        }
    }
}

/// Events between two wall-clock checks.
const CHECK_EVERY: u64 = 1 << 14;

/// Run `reqs` through `policy` on `n` replicas.
///
/// Cost: O(events · log events); events are arrivals, engine steps (one per
/// busy replica step) and, for scraping policies, scrapes only while
/// something happens (an idle gap is jumped over in whole periods, which
/// reads the same metrics as scraping through it).
///
/// # Errors
/// When `limits.deadline` passes before the run ends (the message says how
/// far it got).
pub fn run(
    policy: &mut dyn Policy,
    reqs: &[SimRequest],
    model: &ModelParams,
    n: usize,
    limits: &Limits,
) -> Result<RunResult, String> {
    let mut replicas: Vec<Replica> = (0..n).map(|_| Replica::new(model)).collect();
    let mut in_flight = vec![0u32; n];
    let mut scraped = vec![Metrics::default(); n];
    let mut records = vec![
        RequestRecord {
            ttft: f64::NAN,
            done: f64::NAN,
            ..Default::default()
        };
        reqs.len()
    ];
    let mut children: Vec<Vec<u32>> = vec![Vec::new(); reqs.len()];
    let mut q = Queue {
        heap: BinaryHeap::with_capacity(reqs.len() + 2 * n + 8),
        n: 0,
    };
    for (i, r) in reqs.iter().enumerate() {
        match r.arrival {
            Arrival::At(t) => q.push(t, Kind::Arrive(i as u32)),
            Arrival::After { prev, .. } => {
                if let Some(c) = children.get_mut(prev as usize) {
                    c.push(i as u32);
                }
            }
        }
    }
    let scrape = policy.needs_scrape();
    if scrape {
        q.push(0.0, Kind::Scrape);
    }
    let total = reqs.len();
    let mut completed = 0usize;
    let mut end = 0.0f64;
    let mut outcomes = Vec::new();
    let mut events = 0u64;
    let started = std::time::Instant::now();
    let mut last_progress = 0.0f64;

    while let Some(Reverse(ev)) = q.heap.pop() {
        let now = ev.t;
        events += 1;
        if events % CHECK_EVERY == 0 {
            let wall = started.elapsed().as_secs_f64();
            if limits
                .deadline
                .is_some_and(|d| std::time::Instant::now() > d)
            {
                return Err(format!(
                    "{}: wall-clock limit reached after {wall:.0} s: {completed} of {total} requests done at simulated time {now:.0} s ({events} events); raise --max-wall-s, or check --time-unit/--time-scale (a wrong unit stretches the trace)",
                    limits.label
                ));
            }
            if limits.progress_every_s > 0.0 && wall - last_progress >= limits.progress_every_s {
                last_progress = wall;
                eprintln!(
                    "  {}: {completed}/{total} done, simulated {now:.0} s, wall {wall:.0} s",
                    limits.label
                );
            }
        }
        outcomes.clear();
        let mut from = 0u32;
        match ev.kind {
            Kind::Arrive(i) => {
                let req = &reqs[i as usize];
                let view = View {
                    now,
                    in_flight: &in_flight,
                    replicas: &replicas,
                    scraped: &scraped,
                    model,
                };
                let routed = policy.route(i, req, &view);
                let r = routed.replica.min(n - 1);
                in_flight[r] += 1;
                let rec = &mut records[i as usize];
                rec.arrived = now;
                rec.replica = r as u32;
                rec.spill = routed.spill;
                q.push(
                    now + model.api_delay(req.prompt_tokens),
                    Kind::Engine(i, r as u32),
                );
            }
            Kind::Engine(i, r) => {
                let rep = &mut replicas[r as usize];
                rep.enqueue_at(now, i, &reqs[i as usize]);
                if let Some(t) = rep.advance(now, &mut outcomes) {
                    q.push(t, Kind::StepEnd(r));
                }
                from = r;
            }
            Kind::StepEnd(r) => {
                if let Some(t) = replicas[r as usize].advance(now, &mut outcomes) {
                    q.push(t, Kind::StepEnd(r));
                }
                from = r;
            }
            Kind::Scrape => {
                for (m, rep) in scraped.iter_mut().zip(&replicas) {
                    *m = rep.metrics();
                }
                // Stop when nothing else is pending (every request done).
                // Nothing changes before the next event: jump to the first
                // scrape time at or after it.
                if completed < total {
                    if let Some(Reverse(next)) = q.heap.peek() {
                        let periods = ((next.t - now) / SCRAPE_PERIOD_S).ceil().max(1.0);
                        q.push(now + periods * SCRAPE_PERIOD_S, Kind::Scrape);
                    }
                }
            }
        }
        let r = from;
        for o in &outcomes {
            match *o {
                Outcome::FirstToken { req, cached } => {
                    let rec = &mut records[req as usize];
                    rec.ttft = now - rec.arrived;
                    rec.cached = cached;
                    policy.on_first_token(req, &reqs[req as usize], r as usize, rec.ttft, now);
                    policy.on_delivered(req, &reqs[req as usize], r as usize, cached);
                }
                Outcome::Done { req } => {
                    in_flight[r as usize] = in_flight[r as usize].saturating_sub(1);
                    policy.on_done(req, r as usize, now);
                    records[req as usize].done = now;
                    completed += 1;
                    end = end.max(now);
                    for &c in &children[req as usize] {
                        if let Arrival::After { think, .. } = reqs[c as usize].arrival {
                            q.push(now + think, Kind::Arrive(c));
                        }
                    }
                }
            }
        }
    }
    Ok(RunResult {
        records,
        busy: replicas.iter().map(Replica::busy_time).collect(),
        received: replicas.iter().map(|r| r.received).collect(),
        prefill: replicas.iter().map(Replica::prefill_time).collect(),
        steps: replicas.iter().map(Replica::steps).sum(),
        end,
        completed,
    })
}
