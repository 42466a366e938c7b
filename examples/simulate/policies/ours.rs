//! OURS: the `affinity` policy of the routing core, driven exactly as the
//! filter drives it, per request, through the filter's own functions on a
//! router carrying this policy's index and affinity parameters
//! ([`OursParams`], `Router::with_index_config` / `with_affinity_config`):
//! 1. `Router::key` (done once per request at preparation, with this
//!    policy's `prefix_length`);
//! 2. `Router::choose_affinity` (the filter's `choose_affinity_fed` without
//!    engine feedback: `PrefixIndex::lookup` on a slot table, `VecStore`
//!    here, shared data in the filter; request share; placement pressure;
//!    `affinity::choose_tiered` with the router-side in-flight counts, the
//!    queue picture and the current `CostModel` prices), then
//!    `Router::note_routed` and `Router::record_pending`;
//! 3. `Router::record_affinity` of the decision when the response starts;
//! 4. at the first token: `CostModel::observe` (expected uncached tokens,
//!    in-flight at routing, observed TTFT).

use prefix_router::affinity::{self, AffinityConfig, Reason};
use prefix_router::cost::{CostConfig, CostModel};
use prefix_router::engine::load::{host_load, LoadRule};
use prefix_router::feedback::Horizons;
use prefix_router::index::{IndexConfig, Known, NewHolder, VecStore};
use prefix_router::{Config, Loads, Router};

use super::gateways::clock_ms;
use super::{Policy, Routed, View};
use crate::engine::SimRequest;
use crate::model::ModelParams;

/// Parameters of our policy (defaults = the proposed filter defaults).
#[derive(Debug, Clone)]
pub struct OursParams {
    /// Characters hashed into block keys (`prefix_length`).
    pub prefix_length: usize,
    /// Ring points per endpoint.
    pub virtual_nodes: u32,
    /// Index parameters.
    pub index: IndexConfig,
    /// Policy parameters.
    pub affinity: AffinityConfig,
    /// Initial prices and learning.
    pub cost: CostConfig,
    /// Record the prefix in the index when routing (the filter before issue 8)
    /// instead of when the response starts (the filter records after a 2xx
    /// response; modelled at the first token, which is no earlier than the
    /// response headers).
    pub record_at_route: bool,
    /// Load picture from the engines' scraped queues (see [`EngineLoad`]).
    pub engine_load: EngineLoad,
    /// Scrape period of `engine_load`, ms (the filter's `engine.refresh_ms`).
    pub engine_refresh_ms: f64,
    /// Give `affinity::choose` the queued prefill tokens per replica
    /// ([`affinity::Request::queued_prefill`]), counted as the filter does
    /// (`src/cluster/queued.rs`): the decision's expected uncached tokens
    /// added at routing and taken off at the first token (on by default, as
    /// in the filter; `--ours queue=0` turns it off).
    pub queued_prefill: bool,
    /// `ours_feedback` only: expected hits that got misses raise eviction
    /// horizons (the filter's `eviction_horizons`, off by default;
    /// `--ours horizons=1`).
    pub horizons: bool,
}

/// Which load the policy sees per replica (the filter's `engine` block,
/// `src/cluster/engines.rs`, scraping every `engine_refresh_ms`; the sample
/// taken is the simulator's 50 ms-periodic scrape current at that time, our
/// in-flight count stored with it is the one at the first request of the
/// period, and the filter's saturation rule is not modelled). The rules are
/// the core's [`host_load`], the function the filter calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineLoad {
    /// Our in-flight counts only (no `engine` block).
    Off,
    /// [`LoadRule::Max`]: `max(in-flight, waiting + running)` (the filter
    /// before the fourth session).
    Max,
    /// [`LoadRule::Queued`]: `max(in-flight, waiting + running) + waiting`
    /// (fourth session).
    Queued,
    /// [`LoadRule::Delta`], the filter now: `in-flight + max(0, waiting +
    /// running − in-flight at the sample) + waiting`.
    Delta,
}

impl Default for OursParams {
    /// The filter's defaults, taken from the core's validated configuration
    /// (`{"endpoints": [...]}` with nothing else set), so the simulator measures
    /// exactly what the filter ships.
    fn default() -> Self {
        let shipped = Config::from_json(br#"{"endpoints":["127.0.0.1:1"]}"#)
            .map(Router::new)
            .ok();
        match shipped {
            Some(r) => OursParams {
                prefix_length: r.config().prefix_length,
                virtual_nodes: r.config().virtual_nodes,
                index: r.index().config(),
                affinity: *r.affinity_config(),
                cost: r.cost_config(),
                record_at_route: false,
                engine_load: EngineLoad::Off,
                engine_refresh_ms: 500.0,
                queued_prefill: true,
                horizons: r.config().eviction_horizons,
            },
            None => OursParams {
                prefix_length: 65536,
                virtual_nodes: 256,
                index: IndexConfig::default(),
                affinity: AffinityConfig::default(),
                cost: CostConfig::default(),
                record_at_route: false,
                engine_load: EngineLoad::Off,
                engine_refresh_ms: 500.0,
                queued_prefill: true,
                horizons: false,
            },
        }
    }
}

impl OursParams {
    /// Set one parameter by name (`--ours name=value`).
    pub fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        let bad = || format!("--ours {k}: bad value {v}");
        let f = || v.parse::<f64>().map_err(|_| bad());
        let u = || v.parse::<u64>().map_err(|_| bad());
        let b = || v == "1" || v == "true";
        match k {
            "prefix_length" => self.prefix_length = u()? as usize,
            "virtual_nodes" => self.virtual_nodes = u()? as u32,
            "slots" => self.index.slots = u()? as u32,
            "ways" => self.index.ways = u()? as u32,
            "max_writes" => self.index.max_writes = u()? as usize,
            "ladder_bits" => self.index.ladder_bits = u()? as u32,
            "rewrite_known" => self.index.rewrite_known = b(),
            "new_holder_known" => {
                self.index.new_holder_known = match v {
                    "1" | "true" | "placed" => NewHolder::Placed,
                    "spill" => NewHolder::Spill,
                    _ => NewHolder::Off,
                }
            }
            "concurrency_threshold" => self.affinity.concurrency_threshold = u()? as u32,
            "load_factor" => self.affinity.load_factor = f()?,
            "min_match" => self.affinity.min_match = f()?,
            "routing_budget_ms" => self.affinity.routing_budget_ms = f()?,
            "beyond_window" => self.affinity.beyond_window = f()?,
            "max_age_s" => {
                self.affinity.max_age_ms = (f()? * 1000.0) as u64;
                self.index.max_age_ms = self.affinity.max_age_ms;
            }
            "cold_choices" => self.affinity.cold_choices = u()? as usize,
            "anchor_cold" => self.affinity.anchor_cold = b(),
            "record_pending" => self.affinity.record_pending = b(),
            "prefill_ms_per_ktok" => self.cost.prefill_ms_per_ktok = f()?,
            "wait_ms_per_request" => self.cost.wait_ms_per_request = f()?,
            "learn" => self.cost.learn = b(),
            "forget" => self.cost.forget = f()?,
            "prefill_floor" => self.cost.prefill_floor = b(),
            "record_at_route" => self.record_at_route = b(),
            "engine_load" => {
                self.engine_load = match v {
                    "off" | "0" => EngineLoad::Off,
                    "max" => EngineLoad::Max,
                    "queued" | "1" => EngineLoad::Queued,
                    "delta" => EngineLoad::Delta,
                    _ => return Err(bad()),
                }
            }
            "engine_refresh_ms" => self.engine_refresh_ms = f()?.max(1.0),
            "horizons" => self.horizons = b(),
            "queue" | "queued_prefill" => self.queued_prefill = b(),
            "end_marks" => self.index.end_marks = b(),
            "last_mark" => self.index.last_mark = b(),
            "mirror_from" => self.index.mirror_from = u()? as usize,
            "merge_record" => self.index.merge_record = b(),
            "continuation" => self.affinity.continuation = b(),
            "pressure" | "spread_cold" => self.affinity.spread_cold = b(),
            "share_factor" => self.affinity.share_factor = f()?,
            "share_light_load" => self.affinity.share_light_load = f()?,
            "share_settled" => self.affinity.share_settled = f()?,
            "share_fan_out" => self.affinity.share_fan_out = b(),
            "share_wait_busy" => self.affinity.share_wait_busy = b(),
            "light_slack" => self.affinity.light_slack = f()?,
            "queue_wait_cap" => self.affinity.queue_wait_cap = b(),
            "soft_threshold" => self.affinity.soft_threshold = b(),
            "slot_wait" => self.affinity.slot_wait = b(),
            "pending_warm" => self.affinity.pending_warm = b(),
            // On at the default weight (unless a weight was set), off = weight 0.
            "short_warm" => {
                let on = b();
                let w = self.affinity.short_weight;
                self.affinity.short_weight = match (on, w > 0.0) {
                    (false, _) => 0.0,
                    (true, true) => w,
                    (true, false) => affinity::DEFAULT_SHORT_WEIGHT,
                };
            }
            "short_weight" => self.affinity.short_weight = f()?,
            "short_min_load" => self.affinity.short_min_load = f()?,
            "short_ties" => self.affinity.short_ties = b(),
            "queue_credit" => self.affinity.queue_credit = f()?,
            "light_share" => self.affinity.light_share = f()?,
            "queue_band" => self.affinity.queue_band = f()?,
            "queue_band_min_load" => self.affinity.queue_band_min_load = f()?,
            "overload_weight" => self.affinity.overload_weight = f()?,
            "pending_progress" => self.affinity.pending_progress = b(),
            "tier" => self.affinity.tier = b(),
            "continuation_margin" => self.affinity.continuation_margin = f()?,
            "branch_weight" => self.affinity.branch_weight = f()?,
            _ => return Err(format!("--ours: unknown parameter {k}")),
        }
        Ok(())
    }
}

/// Our policy.
pub struct Ours {
    /// The ring with [`OursParams`]' index and affinity parameters.
    router: Router,
    key: usize,
    store: VecStore,
    cost: CostModel,
    /// First-token times for the cost model's run time.
    run: super::RunClock,
    pending: Vec<(f32, u32)>,
    /// Lookup result per request, kept until its response starts.
    pending_known: Vec<Option<Known>>,
    record_at_route: bool,
    reasons: [u64; 4],
    /// Spills to a holder of a shallower block (the second tier).
    tier_moves: u64,
    routed: u64,
    ticket: u64,
    cold_why: [u64; 3],
    /// Per request: 0 warm, 1 spill, 2 cold unknown, 3 cold stale, 4 cold
    /// short, 5 no key (for the lost-token breakdown).
    class: Vec<u8>,
    /// Prompt tokens not served from the cache, by class, and all prompt tokens.
    lost: [u64; 6],
    prompt: u64,
    engine_load: EngineLoad,
    engine_period_s: f64,
    /// Scrape period index of `snap`, the sample (our own in-flight counts
    /// are live, as in the filter), and the load picture given to the policy.
    epoch: i64,
    snap: Vec<crate::replica::Metrics>,
    snap_own: Vec<u32>,
    loads: Vec<u32>,
    /// With `queued_prefill`: tokens queued per replica, and per request
    /// (replica, tokens) until its first token.
    queued: Option<Vec<u32>>,
    queued_of: Vec<(u32, u32)>,
    /// `SIM_DECIDE` set: one line per decision on stderr ([`Ours::log_decision`]).
    decide_log: bool,
}

impl Ours {
    /// Build; `key` indexes `Keys::core`; `router` is given `p`'s index
    /// and affinity parameters.
    ///
    /// # Errors
    /// Never today (kept for parameter validation).
    pub fn new(
        router: Router,
        key: usize,
        p: OursParams,
        _m: &ModelParams,
    ) -> Result<Ours, String> {
        let router = router
            .with_index_config(p.index)
            .with_affinity_config(p.affinity);
        Ok(Ours {
            router,
            key,
            store: VecStore::new(p.index.slots),
            cost: CostModel::new(p.cost),
            pending: Vec::new(),
            pending_known: Vec::new(),
            record_at_route: p.record_at_route,
            reasons: [0; 4],
            tier_moves: 0,
            routed: 0,
            ticket: 0,
            cold_why: [0; 3],
            class: Vec::new(),
            lost: [0; 6],
            prompt: 0,
            engine_load: p.engine_load,
            engine_period_s: p.engine_refresh_ms / 1000.0,
            epoch: -1,
            snap: Vec::new(),
            snap_own: Vec::new(),
            loads: Vec::new(),
            queued: p.queued_prefill.then(Vec::new),
            queued_of: Vec::new(),
            decide_log: std::env::var_os("SIM_DECIDE").is_some(),
            run: super::RunClock::default(),
        })
    }
}

impl Ours {
    /// The load picture of [`EngineLoad`]: a scrape at every multiple of
    /// the period (the filter's polling timer), our in-flight counts live.
    fn engine_loads(&mut self, view: &View<'_>) {
        let n = view.in_flight.len();
        let epoch = (view.now / self.engine_period_s).floor() as i64;
        if epoch != self.epoch || self.snap.len() != n {
            self.epoch = epoch;
            self.snap = view.scraped.to_vec();
            self.snap_own = view.in_flight.to_vec();
        }
        self.loads.clear();
        let rule = match self.engine_load {
            EngineLoad::Off => None,
            EngineLoad::Max => Some(LoadRule::Max),
            EngineLoad::Queued => Some(LoadRule::Queued),
            EngineLoad::Delta => Some(LoadRule::Delta),
        };
        for i in 0..n {
            let own = view.in_flight.get(i).copied().unwrap_or(0);
            let m = self.snap.get(i).copied().unwrap_or_default();
            // The scrape as the filter's parser would read it.
            let sample = m.as_sample();
            let then = self.snap_own.get(i).copied();
            self.loads
                .push(rule.map_or(own, |r| host_load(r, own, &sample, then)));
        }
    }
}

impl Ours {
    /// `SIM_DECIDE=1`: one CSV line per decision on stderr, `DEC,idx,reason,
    /// primary,in-flight of the primary,its queued prefill tokens,least
    /// loaded holder (−1: none),its in-flight,its queued tokens,fleet's least
    /// in-flight,mean in-flight,wait price ms/request,prefill price ms/1000
    /// tokens,expected cached tokens,fleet's least queued tokens`, read with
    /// the `SIM_DUMP` CSV by `spill_diag.py` (what the spill rule saw).
    fn log_decision(&self, idx: u32, c: &affinity::Choice, known: Option<&Known>, view: &View<'_>) {
        let n = view.in_flight.len();
        let load = |i: usize| view.in_flight.get(i).copied().unwrap_or(0);
        let queued = |i: usize| {
            self.queued
                .as_ref()
                .and_then(|q| q.get(i).copied())
                .unwrap_or(0)
        };
        let holder = known.and_then(|k| k.entry.holders().min_by_key(|&h| load(h)));
        let mean = view.in_flight.iter().map(|&x| f64::from(x)).sum::<f64>() / n.max(1) as f64;
        let (b, w) = self.cost.prices();
        eprintln!(
            "DEC,{idx},{},{},{},{},{},{},{},{},{mean:.1},{w:.3},{b:.2},{:.0},{}",
            c.reason.as_str(),
            c.primary,
            load(c.primary),
            queued(c.primary),
            holder.map_or(-1, |h| h as i64),
            holder.map_or(0, load),
            holder.map_or(0, queued),
            (0..n).map(load).min().unwrap_or(0),
            c.expected_cached_tokens,
            (0..n).map(queued).min().unwrap_or(0),
        );
        if std::env::var_os("SIM_DECIDE_HOLDERS").is_some() {
            let hs: Vec<String> = known
                .map(|k| k.entry.holders().map(|h| h.to_string()).collect())
                .unwrap_or_default();
            eprintln!(
                "HOL,{idx},{},{}",
                known.map_or(0, |k| k.depth),
                hs.join("/")
            );
        }
    }
}

impl Policy for Ours {
    fn needs_scrape(&self) -> bool {
        self.engine_load != EngineLoad::Off
    }

    fn route(&mut self, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let now_ms = clock_ms(view.now);
        self.store.new_callback();
        let Some(key) = req.keys.core.get(self.key) else {
            return Routed {
                replica: 0,
                spill: false,
            };
        };
        if self.engine_load != EngineLoad::Off {
            self.engine_loads(view);
        }
        self.ticket += 1;
        let n = self.router.ring().len();
        if let Some(q) = &mut self.queued {
            q.resize(n, 0);
        }
        let loads = Loads::new(if self.engine_load == EngineLoad::Off {
            view.in_flight
        } else {
            &self.loads
        });
        // The filter's decision without engine feedback (`src/filter/http.rs`,
        // `select_affinity`, with no horizon).
        let (_, c, known) = self.router.choose_affinity_fed(
            key,
            req.body_chars as usize,
            loads,
            &self.store,
            &self.cost,
            (now_ms, self.ticket),
            &Horizons::default(),
            self.queued.as_deref(),
        );
        self.router.note_routed(&mut self.store, c.primary);
        if self.decide_log {
            self.log_decision(idx, &c, known.as_ref(), view);
        }
        let mut class = match c.reason {
            Reason::Warm => 0,
            Reason::Spill => 1,
            Reason::Cold => 2,
            Reason::NoKey => 5,
        };
        if c.reason == Reason::Cold {
            // Why cold: nothing known, known but stale, known but too short.
            let why = match &known {
                None => 0,
                Some(k) if k.age_ms > self.router.affinity_config().max_age_ms => 1,
                Some(_) => 2,
            };
            self.cold_why[why] += 1;
            class += why as u8;
        }
        if self.class.len() <= idx as usize {
            self.class.resize(idx as usize + 1, 0);
        }
        self.class[idx as usize] = class;
        if self.record_at_route {
            self.router.record_affinity(
                &mut self.store,
                &key.blocks,
                known.as_ref(),
                c.primary,
                now_ms,
            );
        } else {
            self.router
                .record_pending(&mut self.store, &key.blocks, known.as_ref(), &c, now_ms);
        }
        if self.pending.len() <= idx as usize {
            self.pending.resize(idx as usize + 1, (0.0, 0));
            self.pending_known.resize(idx as usize + 1, None);
        }
        self.pending_known[idx as usize] = known;
        if self.queued.is_some() {
            let tokens = super::queue_start(
                self.queued.as_mut(),
                c.primary,
                c.expected_uncached_tokens(),
            );
            if self.queued_of.len() <= idx as usize {
                self.queued_of.resize(idx as usize + 1, (0, 0));
            }
            self.queued_of[idx as usize] = (c.primary as u32, tokens);
        }
        self.pending[idx as usize] = (
            c.expected_uncached_tokens() as f32,
            view.in_flight.get(c.primary).copied().unwrap_or(0),
        );
        self.reasons[match c.reason {
            Reason::Warm => 0,
            Reason::Spill => 1,
            Reason::Cold => 2,
            Reason::NoKey => 3,
        }] += 1;
        self.routed += 1;
        if c.reason == Reason::Spill && c.expected_cached_tokens > 0.0 {
            self.tier_moves += 1;
        }
        Routed {
            replica: c.primary,
            spill: c.reason == Reason::Spill,
        }
    }

    fn on_first_token(&mut self, idx: u32, req: &SimRequest, replica: usize, ttft: f64, now: f64) {
        self.store.new_callback();
        if let Some(&(r, tokens)) = self.queued_of.get(idx as usize) {
            super::queue_finish(self.queued.as_mut(), r as usize, tokens);
        }
        if !self.record_at_route {
            if let Some(key) = req.keys.core.get(self.key) {
                let known = self.pending_known.get(idx as usize).copied().flatten();
                let now_ms = clock_ms(now);
                self.router.record_affinity(
                    &mut self.store,
                    &key.blocks,
                    known.as_ref(),
                    replica,
                    now_ms,
                );
            }
        }
        if let Some(&(u, l)) = self.pending.get(idx as usize) {
            self.cost.observe(f64::from(u), f64::from(l), ttft * 1000.0);
        }
        self.run.first_token(idx, now);
    }

    fn on_done(&mut self, idx: u32, _replica: usize, now: f64) {
        if let Some(ms) = self.run.done(idx, now) {
            self.cost.observe_run(ms);
        }
    }

    fn on_delivered(&mut self, idx: u32, req: &SimRequest, _replica: usize, cached: u32) {
        let class = self.class.get(idx as usize).copied().unwrap_or(5) as usize;
        self.prompt += u64::from(req.prompt_tokens);
        if let Some(l) = self.lost.get_mut(class) {
            *l += u64::from(req.prompt_tokens.saturating_sub(cached));
        }
    }

    fn extra(&self) -> Vec<(String, f64)> {
        let n = self.routed.max(1) as f64;
        let (_, c) = self.cost.prices();
        let b = self.cost.learned_prefill_ms_per_ktok();
        let t = self.prompt.max(1) as f64;
        let names = [
            "warm",
            "spill",
            "cold_unknown",
            "cold_stale",
            "cold_short",
            "no_key",
        ];
        let lost = names
            .iter()
            .zip(self.lost)
            .map(|(name, l)| (format!("miss_{name}"), l as f64 / t));
        vec![
            ("warm".into(), self.reasons[0] as f64 / n),
            ("spill".into(), self.reasons[1] as f64 / n),
            ("spill_tier".into(), self.tier_moves as f64 / n),
            ("cold".into(), self.reasons[2] as f64 / n),
            ("cold_unknown".into(), self.cold_why[0] as f64 / n),
            ("cold_stale".into(), self.cold_why[1] as f64 / n),
            ("cold_short".into(), self.cold_why[2] as f64 / n),
            ("gets_per_req".into(), self.store.gets() as f64 / n),
            ("sets_per_req".into(), self.store.sets() as f64 / n),
            ("slots_used".into(), self.store.occupied() as f64),
            ("learned_prefill_ms_per_ktok".into(), b),
            ("learned_wait_ms_per_req".into(), c),
        ]
        .into_iter()
        .chain(lost)
        .collect()
    }
}

/// Several independent Envoy processes, each running OURS with its own
/// index, its own cost model and its **own** in-flight counts (shared data is
/// per Envoy), behind a load balancer that spreads requests at random. Shows
/// what the ring buys: cold placement and tie-breaks agree across routers
/// without any shared state.
pub struct OursMulti {
    routers: Vec<Ours>,
    local: Vec<Vec<u32>>,
    owner: Vec<u8>,
    rng: crate::rng::Rng,
}

impl OursMulti {
    /// `m` routers over `n` replicas.
    ///
    /// # Errors
    /// As [`Ours::new`].
    pub fn new(
        router: Router,
        key: usize,
        p: OursParams,
        model: &ModelParams,
        m: usize,
        n: usize,
        seed: u64,
    ) -> Result<OursMulti, String> {
        let routers = (0..m.max(1))
            .map(|_| Ours::new(router.clone(), key, p.clone(), model))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(OursMulti {
            local: vec![vec![0; n]; routers.len()],
            routers,
            owner: Vec::new(),
            rng: crate::rng::Rng::new(seed ^ 0x6d75),
        })
    }
}

impl Policy for OursMulti {
    fn route(&mut self, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let k = self.rng.below(self.routers.len() as u64) as usize;
        let local = View {
            now: view.now,
            in_flight: &self.local[k],
            replicas: view.replicas,
            scraped: view.scraped,
            model: view.model,
        };
        let r = self.routers[k].route(idx, req, &local);
        if let Some(c) = self.local[k].get_mut(r.replica) {
            *c += 1;
        }
        if self.owner.len() <= idx as usize {
            self.owner.resize(idx as usize + 1, 0);
        }
        self.owner[idx as usize] = k as u8;
        r
    }

    fn on_first_token(&mut self, idx: u32, req: &SimRequest, replica: usize, ttft: f64, now: f64) {
        let k = self.owner.get(idx as usize).copied().unwrap_or(0) as usize;
        if let Some(r) = self.routers.get_mut(k) {
            r.on_first_token(idx, req, replica, ttft, now);
        }
    }

    fn on_done(&mut self, idx: u32, replica: usize, now: f64) {
        let k = self.owner.get(idx as usize).copied().unwrap_or(0) as usize;
        if let Some(c) = self.local.get_mut(k).and_then(|l| l.get_mut(replica)) {
            *c = c.saturating_sub(1);
        }
        if let Some(r) = self.routers.get_mut(k) {
            r.on_done(idx, replica, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::Metrics;

    fn ours(mode: EngineLoad) -> Ours {
        let router = Router::new(
            Config::from_json(br#"{"endpoints":["127.0.0.1:1","127.0.0.1:2"]}"#).unwrap(),
        );
        let p = OursParams {
            engine_load: mode,
            ..OursParams::default()
        };
        Ours::new(router, 0, p, &ModelParams::default()).unwrap()
    }

    fn loads(o: &mut Ours, now: f64, scraped: &[Metrics]) -> Vec<u32> {
        let m = ModelParams::default();
        let view = View {
            now,
            in_flight: &[2, 4],
            replicas: &[],
            scraped,
            model: &m,
        };
        o.engine_loads(&view);
        o.loads.clone()
    }

    #[test]
    fn engine_load_modes_follow_the_filter_and_its_scrape_period() {
        let m = |waiting, outstanding| Metrics {
            waiting,
            outstanding,
            kv_usage: 0.0,
        };
        let first = [m(3, 5), m(0, 1)];
        let later = [m(0, 0), m(9, 12)];
        for (mode, want) in [
            (EngineLoad::Off, [2, 4]),
            (EngineLoad::Max, [5, 4]),
            (EngineLoad::Queued, [8, 4]),
            // 2 + (5 − 2) + 3, 4 + 0 + 0 (in-flight at the scrape: 2, 4).
            (EngineLoad::Delta, [8, 4]),
        ] {
            let mut o = ours(mode);
            assert_eq!(loads(&mut o, 0.1, &first), want, "{mode:?}");
            // Same 500 ms period: the sample taken at its start is kept.
            assert_eq!(loads(&mut o, 0.4, &later), want, "{mode:?}");
        }
        // The next period reads the new sample: max(2, 0) + 0, max(4, 12) + 9.
        let mut o = ours(EngineLoad::Queued);
        loads(&mut o, 0.1, &first);
        assert_eq!(loads(&mut o, 0.6, &later), [2, 21]);
        assert!(o.needs_scrape() && !ours(EngineLoad::Off).needs_scrape());
    }
}
