//! Many gateways, one placement: `N` independent Envoys running OURS in
//! front of the same replicas, each receiving a uniformly random share of the
//! requests (a network load balancer), with the options of issue 11 that let
//! them agree on where prefixes live.
//!
//! Each gateway has its **own** slot table (`VecStore`), cost model, in-flight
//! counts and ticket, exactly like a separate Envoy process. A policy name is
//! `MODE/N[/DELAY_MS]`, `MODE` being `+`-joined options:
//!
//! | option | model |
//! |---|---|
//! | `indep` | nothing shared (today's `ours_2x` for N = 2) |
//! | `eng` | load = engine-reported queue + running of every replica, scraped every period (the same numbers for every gateway), plus this gateway's own requests routed since the last scrape |
//! | `anchor` | the ring key is an early block (`anchor_block`, default block 3 = characters 768–1023, or the last full block of a shorter prompt) instead of the whole-window key, and cold placement compares `det_choices` ring candidates: every gateway makes the same first choice for prompts that share that block |
//! | `exc` | the index records only exceptions (decisions other than "cold, ring owner of the anchor") |
//! | `det` | `eng+anchor` (deterministic first) |
//! | `peer` | the slot writes of every index record are logged (`prefix_router::peers::LoggingStore`), encoded and decoded as the wire batch, and merged (`peers::merge`) into every other gateway's table `DELAY` ms later; each gateway's outbox keeps at most `max_pending` slot writes (oldest dropped, counted) |
//! | `chg` | with `peer`: publish only news (a cold or spilled decision, a holder that was not the front one, or a known prefix shorter than half the hashed window); warm repeats update only the local table |
//! | `truth` | at the first token the engine's `cached_tokens` (what the replica really had cached for this request when it was routed) teaches the gateway: the cost model learns from delivered instead of expected uncached tokens, and the index records that the replica holds the delivered prefix |
//!
//! `DELAY_MS` is the peer-exchange delay for `peer` modes and the engine
//! scrape period for `eng`/`det` modes without `peer` (those with `peer` use
//! `scrape_ms`); modes using neither have no delay. The knobs come from
//! `--gw k=v` ([`Knobs`]).
//!
//! Cost per request: one lookup + record in the routing gateway (as OURS),
//! plus `N − 1` lookups + records when a peer insert is applied, plus one
//! lookup + record per `truth` feedback; the engine-load scrape reads `n`
//! replica counters once per period.

use std::collections::VecDeque;
use std::sync::OnceLock;

use prefix_router::affinity::{self, AffinityConfig, Reason};
use prefix_router::cost::CostModel;
use prefix_router::hash::BLOCK_UNITS;
use prefix_router::index::{PrefixIndex, SlotValue, VecStore};
use prefix_router::peers::{self, DeltaLog, LoggingStore};
use prefix_router::{Loads, Router, RoutingKey};

use super::ours::OursParams;
use super::{Policy, Routed, View};
use crate::engine::SimRequest;
use crate::rng::Rng;

/// Knobs shared by every gateway policy of a run (`--gw k=v`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knobs {
    /// Block position of the anchor (ring key) of `anchor` modes.
    pub anchor_block: usize,
    /// Ring candidates compared by cold placement in `anchor` modes.
    pub det_choices: usize,
    /// Engine scrape period of `eng` modes that also use `peer`, ms.
    pub scrape_ms: f64,
    /// Slot writes kept per gateway outbox (the peer log's capacity).
    pub max_pending: usize,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            anchor_block: 3,
            det_choices: 2,
            scrape_ms: 100.0,
            max_pending: 4096,
        }
    }
}

impl Knobs {
    /// Set one knob by name.
    pub fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        let bad = || format!("--gw {k}: bad value {v}");
        let f = || v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0);
        let u = || v.parse::<usize>().ok();
        match k {
            "anchor_block" => self.anchor_block = u().ok_or_else(bad)?,
            "det_choices" => self.det_choices = u().filter(|&c| c >= 1).ok_or_else(bad)?,
            "scrape_ms" => self.scrape_ms = f().ok_or_else(bad)?,
            "max_pending" => self.max_pending = u().filter(|&c| c >= 1).ok_or_else(bad)?,
            _ => return Err(format!("--gw: unknown knob {k}")),
        }
        Ok(())
    }
}

static KNOBS: OnceLock<Knobs> = OnceLock::new();

/// Fix the knobs of this run (first call wins).
pub fn set_knobs(k: Knobs) {
    let _ = KNOBS.set(k);
}

/// Options of one gateway policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mode {
    /// Load = scraped engine load.
    pub engine_load: bool,
    /// Ring key = anchor block.
    pub anchor: bool,
    /// Record only exceptions.
    pub exceptions: bool,
    /// Peer exchange of index inserts.
    pub peer: bool,
    /// Engine-reported cached tokens teach the gateway.
    pub truth: bool,
    /// Publish only news to the peers.
    pub changes: bool,
}

impl Mode {
    /// Parse `a+b+…` (see the module docs).
    pub fn parse(s: &str) -> Option<Mode> {
        let mut m = Mode::default();
        for t in s.split('+') {
            match t {
                "indep" => {}
                "eng" => m.engine_load = true,
                "anchor" => m.anchor = true,
                "exc" => m.exceptions = true,
                "det" => {
                    m.engine_load = true;
                    m.anchor = true;
                }
                "peer" => m.peer = true,
                "truth" => m.truth = true,
                "chg" => m.changes = true,
                _ => return None,
            }
        }
        Some(m)
    }

    /// Does the mode have a delay dimension?
    pub fn has_delay(&self) -> bool {
        self.peer || self.engine_load
    }
}

/// A parsed policy name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    /// Options.
    pub mode: Mode,
    /// Gateways.
    pub n: usize,
    /// Peer delay (or scrape period), ms.
    pub delay_ms: f64,
}

/// Parse `MODE/N[/DELAY_MS]`.
pub fn parse_name(name: &str) -> Option<Spec> {
    let mut it = name.split('/');
    let mode = Mode::parse(it.next()?)?;
    let n = it
        .next()?
        .parse::<usize>()
        .ok()
        .filter(|&n| (1..=64).contains(&n))?;
    let delay_ms = match it.next() {
        Some(d) => d
            .parse::<f64>()
            .ok()
            .filter(|d| d.is_finite() && *d >= 0.0)?,
        None if !mode.has_delay() => 0.0,
        None => return None,
    };
    if it.next().is_some() || (!mode.has_delay() && delay_ms != 0.0) {
        return None;
    }
    Some(Spec { mode, n, delay_ms })
}

/// Is `name` a gateway policy name?
pub fn is_name(name: &str) -> bool {
    parse_name(name).is_some()
}

/// Policy names of the grid `modes × ns × delays` (a mode without a delay
/// dimension appears once per `n`).
pub fn grid(modes: &[String], ns: &[usize], delays: &[u64]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for m in modes {
        let mode = Mode::parse(m).ok_or_else(|| format!("--gw-modes: unknown mode {m}"))?;
        for &n in ns {
            if mode.has_delay() {
                out.extend(delays.iter().map(|d| format!("{m}/{n}/{d}")));
            } else {
                out.push(format!("{m}/{n}"));
            }
        }
    }
    Ok(out)
}

/// Ring key of the `anchor` option: block `anchor_block`, or the last full
/// block of a shorter window, or the window key when no block is full.
pub fn anchor_key(key: &RoutingKey, anchor_block: usize) -> Option<u64> {
    let full = (key.units / BLOCK_UNITS).min(key.blocks.len());
    if full == 0 {
        return key.key;
    }
    key.blocks.get(anchor_block.min(full - 1)).copied()
}

/// A slot write published to the peers.
#[derive(Debug, Clone, Copy)]
struct Delta {
    at_ms: u64,
    slot: u32,
    value: SlotValue,
}

/// One gateway Envoy.
struct Gateway {
    store: VecStore,
    cost: CostModel,
    in_flight: Vec<u32>,
    since_scrape: Vec<u32>,
    outbox: VecDeque<Delta>,
    log: DeltaLog,
    ticket: u64,
}

/// Per routed request, until its first token.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    gateway: u8,
    expected_uncached: f32,
    in_flight: u32,
    delivered: u32,
}

/// Counters for the report.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    routed: u64,
    reasons: [u64; 4],
    records: u64,
    sets: u64,
    applied: u64,
    dropped: u64,
    taught: u64,
    body_chars: u64,
    wire_bytes: u64,
}

/// `N` gateways (see the module docs).
pub struct Gateways {
    router: Router,
    key: usize,
    cfg: AffinityConfig,
    index: PrefixIndex,
    spec: Spec,
    knobs: Knobs,
    gws: Vec<Gateway>,
    scraped: Vec<u32>,
    next_scrape: f64,
    pending: Vec<Pending>,
    rng: Rng,
    c: Counts,
}

/// Build the policy `name` (see [`parse_name`]).
pub fn build(
    name: &str,
    router: Router,
    key: usize,
    p: &OursParams,
    n: usize,
    seed: u64,
) -> Result<Gateways, String> {
    let spec = parse_name(name).ok_or_else(|| format!("bad gateway policy name {name}"))?;
    Ok(Gateways::new(
        router,
        key,
        p,
        spec,
        KNOBS.get().copied().unwrap_or_default(),
        n,
        seed,
    ))
}

impl Gateways {
    /// `spec.n` gateways over `n` replicas.
    pub fn new(
        router: Router,
        key: usize,
        p: &OursParams,
        spec: Spec,
        knobs: Knobs,
        n: usize,
        seed: u64,
    ) -> Gateways {
        let mut cfg = p.affinity;
        if spec.mode.anchor {
            cfg.anchor_cold = false;
            cfg.cold_choices = knobs.det_choices;
        }
        let gws = (0..spec.n.max(1))
            .map(|_| Gateway {
                store: VecStore::new(p.index.slots),
                cost: CostModel::new(p.cost),
                in_flight: vec![0; n],
                since_scrape: vec![0; n],
                outbox: VecDeque::new(),
                log: DeltaLog::new(knobs.max_pending),
                ticket: 0,
            })
            .collect();
        Gateways {
            router,
            key,
            cfg,
            index: PrefixIndex::new(p.index),
            spec,
            knobs,
            gws,
            scraped: vec![0; n],
            next_scrape: 0.0,
            pending: Vec::new(),
            rng: Rng::new(seed ^ 0x6d75),
            c: Counts::default(),
        }
    }

    fn scrape_period_s(&self) -> f64 {
        if self.spec.mode.peer {
            self.knobs.scrape_ms / 1000.0
        } else {
            self.spec.delay_ms / 1000.0
        }
    }

    /// Engine-load scrape: every gateway reads the same counters once per
    /// period (staleness uniform in [0, period) at a request).
    fn scrape(&mut self, view: &View<'_>) {
        if !self.spec.mode.engine_load || view.now < self.next_scrape {
            return;
        }
        for (s, r) in self.scraped.iter_mut().zip(view.replicas) {
            *s = r.outstanding();
        }
        for g in &mut self.gws {
            g.since_scrape.iter_mut().for_each(|x| *x = 0);
        }
        let p = self.scrape_period_s();
        self.next_scrape = if p > 0.0 {
            (view.now / p).floor() * p + p
        } else {
            view.now
        };
    }

    /// Merge every published slot write older than the delay into the
    /// other gateways' tables.
    fn sync(&mut self, now_ms: u64) {
        if !self.spec.mode.peer {
            return;
        }
        let delay = self.spec.delay_ms as u64;
        for from in 0..self.gws.len() {
            while let Some(d) = self.gws[from]
                .outbox
                .front()
                .copied()
                .filter(|d| d.at_ms + delay <= now_ms)
            {
                self.gws[from].outbox.pop_front();
                for (to, g) in self.gws.iter_mut().enumerate() {
                    if to != from {
                        peers::merge(&mut g.store, d.slot, &d.value);
                        self.c.applied += 1;
                    }
                }
            }
        }
    }

    /// Publish gateway `k`'s log from `seq` on: through the wire format
    /// (encode, validate, decode), into its outbox.
    fn publish(&mut self, k: usize, seq: u64, now_ms: u64) {
        let layout = peers::layout(self.index.config().slots, &[]);
        let g = &mut self.gws[k];
        // Writes the bounded log forgot before this pull count as dropped.
        self.c.dropped += g.log.oldest_seq().saturating_sub(seq);
        let wire = g.log.encode_since(seq, usize::MAX, layout, 0);
        self.c.wire_bytes += (wire.len() - peers::HEADER_BYTES) as u64;
        let slots = self.index.config().slots;
        let replicas = g.in_flight.len();
        let Ok(batch) = peers::decode(&wire, layout, usize::MAX, slots, replicas) else {
            return;
        };
        for (slot, value) in batch.entries {
            if g.outbox.len() >= self.knobs.max_pending {
                g.outbox.pop_front();
                self.c.dropped += 1;
            }
            g.outbox.push_back(Delta {
                at_ms: now_ms,
                slot,
                value,
            });
        }
    }

    /// Route request `idx` through gateway `k`.
    fn route_on(&mut self, k: usize, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let now_ms = (view.now * 1000.0) as u64;
        self.sync(now_ms);
        self.scrape(view);
        let Some(key) = req.keys.core.get(self.key) else {
            return Routed {
                replica: 0,
                spill: false,
            };
        };
        let mode = self.spec.mode;
        let loads: Vec<u32> = if mode.engine_load {
            let g = &self.gws[k];
            self.scraped
                .iter()
                .zip(&g.since_scrape)
                .map(|(a, b)| a + b)
                .collect()
        } else {
            self.gws[k].in_flight.clone()
        };
        let anchored;
        let rkey = if mode.anchor {
            anchored = RoutingKey {
                key: anchor_key(key, self.knobs.anchor_block),
                ..key.clone()
            };
            &anchored
        } else {
            key
        };
        let g = &mut self.gws[k];
        let known = self.index.lookup(&g.store, &key.blocks, now_ms);
        g.ticket += 1;
        let request = affinity::Request {
            key: rkey,
            prompt_chars: req.body_chars as usize,
            known: known.as_ref(),
            loads: Loads::new(&loads),
            ticket: g.ticket,
            // Ring order on load ties: the modes compare agreement without
            // shared state.
            pressure: None,
        };
        let c = affinity::choose(self.router.ring(), &request, &g.cost, &self.cfg);
        let first_choice = rkey
            .key
            .and_then(|rk| self.router.ring().candidates(rk).next());
        let exception = c.reason != Reason::Cold || Some(c.primary) != first_choice;
        let seq = g.log.next_seq();
        // News for the peers: a new prefix or holder, or a known prefix
        // that covers less than half of the hashed window.
        let news = c.reason != Reason::Warm
            || known.as_ref().is_some_and(|k| {
                k.entry.holders().next() != Some(c.primary) || 2 * k.depth * BLOCK_UNITS < key.units
            });
        if !mode.exceptions || exception {
            self.c.records += 1;
            let sets = if mode.peer && (news || !mode.changes) {
                let mut store = LoggingStore {
                    inner: &mut g.store,
                    log: &mut g.log,
                };
                self.index
                    .record(&mut store, &key.blocks, known.as_ref(), c.primary, now_ms)
            } else {
                self.index
                    .record(&mut g.store, &key.blocks, known.as_ref(), c.primary, now_ms)
            };
            self.c.sets += sets as u64;
        }
        if let Some(x) = g.in_flight.get_mut(c.primary) {
            *x += 1;
        }
        if let Some(x) = g.since_scrape.get_mut(c.primary) {
            *x += 1;
        }
        let delivered = if mode.truth {
            view.replicas
                .get(c.primary)
                .map_or(0, |r| r.cached_tokens(req))
        } else {
            0
        };
        if self.pending.len() <= idx as usize {
            self.pending.resize(idx as usize + 1, Pending::default());
        }
        self.pending[idx as usize] = Pending {
            gateway: k as u8,
            expected_uncached: c.expected_uncached_tokens() as f32,
            in_flight: loads.get(c.primary).copied().unwrap_or(0),
            delivered,
        };
        self.c.reasons[match c.reason {
            Reason::Warm => 0,
            Reason::Spill => 1,
            Reason::Cold => 2,
            Reason::NoKey => 3,
        }] += 1;
        self.c.routed += 1;
        self.c.body_chars += u64::from(req.body_chars);
        if mode.peer {
            self.publish(k, seq, now_ms);
            if self.spec.delay_ms == 0.0 {
                self.sync(now_ms);
            }
        }
        Routed {
            replica: c.primary,
            spill: c.reason == Reason::Spill,
        }
    }

    /// What gateway `k`'s index knows about `blocks` (tests).
    #[cfg(test)]
    fn known_depth(&self, k: usize, blocks: &[u64], now_ms: u64) -> usize {
        self.index
            .lookup(&self.gws[k].store, blocks, now_ms)
            .map_or(0, |x| x.depth)
    }
}

impl Policy for Gateways {
    fn route(&mut self, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let k = self.rng.below(self.gws.len() as u64) as usize;
        self.route_on(k, idx, req, view)
    }

    fn on_first_token(&mut self, idx: u32, req: &SimRequest, replica: usize, ttft: f64, now: f64) {
        let Some(p) = self.pending.get(idx as usize).copied() else {
            return;
        };
        let Some(g) = self.gws.get_mut(usize::from(p.gateway)) else {
            return;
        };
        if !self.spec.mode.truth {
            g.cost.observe(
                f64::from(p.expected_uncached),
                f64::from(p.in_flight),
                ttft * 1000.0,
            );
            return;
        }
        let uncached = req.prompt_tokens.saturating_sub(p.delivered);
        g.cost
            .observe(f64::from(uncached), f64::from(p.in_flight), ttft * 1000.0);
        let Some(key) = req.keys.core.get(self.key) else {
            return;
        };
        // Delivered tokens → hashed characters → index blocks.
        let chars = f64::from(p.delivered) * self.cfg.chars_per_token;
        let depth = ((chars as usize) / BLOCK_UNITS).min(key.blocks.len());
        if depth > 0 {
            let now_ms = (now * 1000.0) as u64;
            let blocks = &key.blocks[..depth];
            let known = self.index.lookup(&g.store, blocks, now_ms);
            self.index
                .record(&mut g.store, blocks, known.as_ref(), replica, now_ms);
            self.c.taught += 1;
        }
    }

    fn on_done(&mut self, idx: u32, replica: usize) {
        let k = self.pending.get(idx as usize).map_or(0, |p| p.gateway) as usize;
        if let Some(c) = self
            .gws
            .get_mut(k)
            .and_then(|g| g.in_flight.get_mut(replica))
        {
            *c = c.saturating_sub(1);
        }
    }

    fn extra(&self) -> Vec<(String, f64)> {
        let n = self.c.routed.max(1) as f64;
        let sets = self.c.sets as f64 / n;
        // Each published slot write goes to N − 1 peers (batch headers,
        // 24 bytes per pull, not counted).
        let peers = self.gws.len().saturating_sub(1) as f64;
        let bytes = self.c.wire_bytes as f64 / n * peers;
        let body = self.c.body_chars as f64 / n;
        vec![
            ("warm".into(), self.c.reasons[0] as f64 / n),
            ("spill".into(), self.c.reasons[1] as f64 / n),
            ("cold".into(), self.c.reasons[2] as f64 / n),
            ("records_per_req".into(), self.c.records as f64 / n),
            ("sets_per_req".into(), sets),
            ("sync_bytes_per_req".into(), bytes),
            ("sync_share_of_body".into(), bytes / body.max(1.0)),
            ("peer_applies_per_req".into(), self.c.applied as f64 / n),
            ("peer_dropped".into(), self.c.dropped as f64),
            ("taught_per_req".into(), self.c.taught as f64 / n),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine;
    use crate::model::ModelParams;
    use crate::policies::{ours::Ours, KeyBook};
    use crate::workload::{self, prepare_one};

    fn sagemaker(scale: f64) -> (KeyBook, Vec<SimRequest>) {
        let k = workload::Knobs {
            scale,
            load: 1.0,
            seed: 3,
        };
        let w = workload::sagemaker(&k);
        let book = KeyBook::new(&["ours".to_string()], 7, &OursParams::default()).unwrap();
        let reqs = w
            .specs
            .iter()
            .map(|s| prepare_one(s, &book, book.max_chars()))
            .collect();
        (book, reqs)
    }

    fn gateways(book: &KeyBook, name: &str, knobs: Knobs) -> Gateways {
        Gateways::new(
            book.routers[0].1.clone(),
            0,
            &OursParams::default(),
            parse_name(name).unwrap(),
            knobs,
            7,
            1,
        )
    }

    #[test]
    fn names_and_grid() {
        let s = parse_name("det+truth/4/200").unwrap();
        assert!(s.mode.engine_load && s.mode.anchor && s.mode.truth && !s.mode.peer);
        assert_eq!((s.n, s.delay_ms), (4, 200.0));
        assert_eq!(parse_name("indep/2").unwrap().n, 2);
        for bad in [
            "indep/2/50",
            "peer/2",
            "bogus/2",
            "det/0/50",
            "ours",
            "peer/2/5/5",
        ] {
            assert!(parse_name(bad).is_none(), "{bad}");
        }
        let g = grid(&["indep".into(), "peer".into()], &[1, 2], &[0, 50]).unwrap();
        assert_eq!(
            g,
            [
                "indep/1",
                "indep/2",
                "peer/1/0",
                "peer/1/50",
                "peer/2/0",
                "peer/2/50"
            ]
        );
        assert!(g.iter().all(|n| is_name(n)));
        assert!(grid(&["nope".into()], &[1], &[0]).is_err());
    }

    #[test]
    fn one_independent_gateway_is_ours() {
        let (book, reqs) = sagemaker(0.04);
        let m = ModelParams::default();
        // The gateways record at routing (as `ours` with `record_at_route`)
        // and place by ring order at equal loads (no pressure counters).
        let d = OursParams::default();
        let p = OursParams {
            record_at_route: true,
            affinity: prefix_router::affinity::AffinityConfig {
                spread_cold: false,
                ..d.affinity
            },
            ..d
        };
        let mut ours = Ours::new(book.routers[0].1.clone(), 0, p, &m).unwrap();
        let mut one = gateways(&book, "indep/1", Knobs::default());
        let a = engine::run(&mut ours, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        let b = engine::run(&mut one, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        let pick = |r: &engine::RunResult| r.records.iter().map(|x| x.replica).collect::<Vec<_>>();
        assert_eq!(pick(&a), pick(&b));
        // Two gateways that share nothing do not reproduce it.
        let mut two = gateways(&book, "indep/2", Knobs::default());
        let c = engine::run(&mut two, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        assert_ne!(pick(&a), pick(&c));
    }

    fn view<'a>(now: f64, reps: &'a [crate::replica::Replica], m: &'a ModelParams) -> View<'a> {
        View {
            now,
            in_flight: &[0; 7],
            replicas: reps,
            scraped: &[],
            model: m,
        }
    }

    #[test]
    fn peer_writes_arrive_after_the_delay_and_the_outbox_is_bounded() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let mut g = gateways(&book, "peer/2/200", Knobs::default());
        let blocks = |i: usize| &reqs[i].keys.core[0].blocks;
        let full = blocks(0).len();
        g.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        assert_eq!(g.known_depth(0, blocks(0), 1000), full);
        assert_eq!(g.known_depth(1, blocks(0), 1000), 0);
        // Not yet due at 1.1 s; merged at 1.2 s (before routing request 2).
        g.route_on(0, 1, &reqs[1], &view(1.1, &reps, &m));
        assert_eq!(g.known_depth(1, blocks(0), 1100), 0);
        g.route_on(0, 2, &reqs[2], &view(1.2, &reps, &m));
        assert_eq!(g.known_depth(1, blocks(0), 1200), full);
        assert!(g.c.wire_bytes >= (g.c.sets * peers::ITEM_BYTES as u64));
        // An outbox of 4 slot writes keeps the last 4 of a record and counts the rest.
        let knobs = Knobs {
            max_pending: 4,
            ..Knobs::default()
        };
        let mut small = gateways(&book, "peer/2/200", knobs);
        small.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        assert_eq!(small.gws[0].outbox.len(), 4);
        assert_eq!(small.c.dropped, small.c.sets - 4);
        small.route_on(1, 1, &reqs[1], &view(5.0, &reps, &m));
        assert_eq!(small.c.applied, 4);
    }

    #[test]
    fn only_news_is_published_with_chg() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let mut g = gateways(&book, "peer+chg/2/0", Knobs::default());
        g.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        let first = g.c.wire_bytes;
        assert!(first > 0);
        assert_eq!(
            g.known_depth(1, &reqs[0].keys.core[0].blocks, 1000),
            reqs[0].keys.core[0].blocks.len()
        );
        // The same prompt again through gateway 0: warm at the front holder, nothing sent.
        g.route_on(0, 1, &reqs[0], &view(1.5, &reps, &m));
        assert_eq!(g.c.reasons[0], 1);
        assert_eq!(g.c.wire_bytes, first);
        // Without chg the repeat is published.
        let mut all = gateways(&book, "peer/2/0", Knobs::default());
        all.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        all.route_on(0, 1, &reqs[0], &view(1.5, &reps, &m));
        assert!(all.c.wire_bytes > first);
    }

    #[test]
    fn anchor_is_an_early_full_block() {
        let (_, reqs) = sagemaker(0.1);
        let k = &reqs[0].keys.core[0];
        assert_eq!(anchor_key(k, 3), Some(k.blocks[3]));
        // Requests of the same group share the anchor though their windows
        // differ; other groups do not.
        let (same, other): (Vec<_>, Vec<_>) = reqs[1..]
            .iter()
            .map(|r| &r.keys.core[0])
            .partition(|o| o.blocks[..100] == k.blocks[..100]);
        assert!(!same.is_empty());
        for o in same {
            assert_ne!(o.key, k.key);
            assert_eq!(anchor_key(o, 3), anchor_key(k, 3));
        }
        assert!(other.iter().all(|o| anchor_key(o, 3) != anchor_key(k, 3)));
        // Short windows: last full block, or the window key with none.
        let mut short = k.clone();
        short.units = 2 * BLOCK_UNITS + 10;
        short.blocks.truncate(3);
        assert_eq!(anchor_key(&short, 3), Some(short.blocks[1]));
        short.units = 10;
        short.blocks.truncate(1);
        assert_eq!(anchor_key(&short, 3), short.key);
    }

    #[test]
    fn engine_load_is_scraped_once_per_period_plus_own_routes() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let mut reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let mut g = gateways(&book, "eng/2/100", Knobs::default());
        g.route_on(0, 0, &reqs[0], &view(0.0, &reps, &m));
        assert_eq!(g.scraped, vec![0; 7]);
        let r0 = g.pending[0].in_flight;
        assert_eq!(r0, 0);
        // Replica 2 gets 3 requests; not visible before the next period.
        for i in 0..3 {
            reps[2].enqueue(10 + i, &reqs[1]);
        }
        g.route_on(1, 1, &reqs[1], &view(0.05, &reps, &m));
        assert_eq!(g.scraped[2], 0);
        g.route_on(1, 2, &reqs[2], &view(0.1, &reps, &m));
        assert_eq!(g.scraped[2], 3);
        // Gateway 1's own routes since the scrape count in its loads only.
        assert!(g.gws[1].since_scrape.iter().sum::<u32>() == 1);
        assert!(g.gws[0].since_scrape.iter().sum::<u32>() == 0);
    }
}
