//! Many gateways, one placement: `N` independent Envoys running OURS in
//! front of the same replicas, each receiving a uniformly random share of the
//! requests (a network load balancer), with the options of issue 11 that let
//! them agree on where prefixes live.
//!
//! Each gateway has its **own** slot table (`VecStore`), cost model, in-flight
//! counts, `spread_cold` counters and ticket, exactly like a separate Envoy
//! process, and drives the core as the filter does (as [`super::ours::Ours`]
//! does: pending record at routing for a cold or spilled decision, the record
//! when the response starts; `record_at_route=1` records at routing instead). A policy name is
//! `MODE/N[/DELAY_MS]`, `MODE` being `+`-joined options:
//!
//! | option | model |
//! |---|---|
//! | `indep` | nothing shared (today's `ours_2x` for N = 2) |
//! | `eng` | load = engine-reported queue + running of every replica, scraped every period (the same numbers for every gateway), plus this gateway's own requests routed since the last scrape |
//! | `anchor` | the ring key is an early block (`anchor_block`, default block 3 = characters 768–1023, or the last full block of a shorter prompt) instead of the whole-window key, and cold placement compares `det_choices` ring candidates: every gateway makes the same first choice for prompts that share that block |
//! | `exc` | the index records only exceptions (decisions other than "cold, ring owner of the anchor") |
//! | `det` | `eng+anchor` (deterministic first) |
//! | `peer` | peer exchange as the filter runs it: the record after the response goes through `prefix_router::peers_log::Publishing` (the filter's news rule: new blocks if the record added `min_publish` characters, placement changes, refreshes, confirmed pending records), the news is logged (`peers::DeltaLog`), encoded and decoded as the wire batch, and merged (`peers::merge`) into every other gateway's table `DELAY` ms later; each gateway's outbox keeps at most `max_pending` slot writes (oldest dropped, counted). Pending records and the `spread_cold` counters stay local, as in the filter (`pub_pending=1` publishes pending records too) |
//! | `truth` | at the first token the engine's `cached_tokens` (what the replica really had cached for this request when it was routed) teaches the gateway: the cost model learns from delivered instead of expected uncached tokens, and the index records that the replica holds the delivered prefix |
//!
//! `DELAY_MS` is the peer-exchange delay for `peer` modes and the engine
//! scrape period for `eng`/`det` modes without `peer` (those with `peer` use
//! `scrape_ms`); modes using neither have no delay. The knobs come from
//! `--gw k=v` ([`Knobs`]).
//!
//! With `peer`, the report carries a profile of the exchange ([`Profile`],
//! `docs/multi-gateway.md`, "what peers use"): every published write by
//! kind, block position and rank, whether a peer's lookup ever read it or
//! found its depth there, how each merge changed the peer's slot, and the
//! wire bytes by part. Its cost: one slot hash per block of each lookup and
//! record, and a map of merged slots per gateway (simulator only).
//!
//! Cost per request: one lookup + record in the routing gateway (as OURS),
//! plus `N − 1` lookups + records when a peer insert is applied, plus one
//! lookup + record per `truth` feedback; the engine-load scrape reads `n`
//! replica counters once per period.

use std::collections::VecDeque;
use std::sync::OnceLock;

use prefix_router::affinity::{self, AffinityConfig, Reason};
use prefix_router::cost::CostModel;
use prefix_router::engine::load::{host_load, LoadRule};
use prefix_router::hash::BLOCK_UNITS;
use prefix_router::index::{
    on_ladder, Entry, IndexConfig, Known, PrefixIndex, SlotStore, SlotValue, VecStore,
};
use prefix_router::peers::{self, DeltaLog};
use prefix_router::peers_budget::{Budget, Offer};
use prefix_router::peers_log::{News, NewsRule, PeerLadder, Publishing};
use prefix_router::pressure::Pressure;
use prefix_router::share::{self, Share};
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
    /// The filter's `peers.min_publish_chars`.
    pub min_publish: usize,
    /// The filter's `peers.refresh_publish_s`.
    pub refresh_s: u32,
    /// Publish pending records too (the filter does not).
    pub pub_pending: bool,
    /// End marks in `peer` modes (the filter turns them off with `peers`,
    /// [`prefix_router::router::index_config`]).
    pub peer_end_marks: bool,
    /// Record at routing instead of at the response (no pending records).
    pub record_at_route: bool,
    /// One set of `spread_cold` counters for all gateways (the upper bound
    /// of publishing them; the filter keeps one set per Envoy).
    pub shared_pressure: bool,
    /// Each gateway multiplies its own in-flight counts by N (its estimate
    /// of every gateway's requests on a replica, under a uniform spread).
    pub scale_load: bool,
    /// The filter's `peers.sync_budget_bp`: sync item bytes (sent +
    /// received) per gateway at most this many basis points of its request
    /// bytes ([`prefix_router::peers_budget`]); 0: no budget.
    pub budget_bp: u32,
    /// Load rule of every gateway: its own in-flight counts (`None`, the
    /// filter without an `engine` block), or the filter's `engine` block
    /// ([`LoadRule`], `engine=max|queued|delta`): each gateway scrapes the
    /// replicas every `engine_ms` at its own phase and combines the sample
    /// with its own live in-flight counts by the core's [`host_load`] (the
    /// function the filter calls), so the other gateways' requests count.
    pub engine: Option<LoadRule>,
    /// Scrape period of `engine`, ms (the filter's `engine.refresh_ms`).
    pub engine_ms: f64,
    /// Peer load exchange (`peer` modes): every `share_load_ms` each gateway
    /// copies every other gateway's in-flight counts and queued-prefill
    /// tokens per replica and adds them to its own live counts (see
    /// `share_part`, `extrapolate`). Default: the filter's exchange
    /// (`peers.share_queued`, [`prefix_router::peers_queue`]): queued tokens
    /// only, every `pull_ms`, extrapolated; `off`: own counts only; 0: live
    /// (the upper bound).
    pub share_load_ms: Option<f64>,
    /// With `share_load_ms`: estimate the other gateways' changes since the
    /// exchange as N − 1 times this gateway's own (they route the same
    /// share of the traffic by a similar picture): per replica
    /// `max(own, own + Σ peers' last + (N − 1)·(own − own at the exchange))`.
    pub extrapolate: bool,
    /// With `share_load_ms`: which counts are exchanged (`share_part`:
    /// 0 both, 1 in-flight only, 2 queued tokens only).
    pub share_part: u8,
    /// Hold a confirmed first placement (a cold prompt's blocks) back until
    /// this gateway sees the prefix reused (a later record whose known
    /// prefix covers a held slot publishes it); `held_s`: or until it is
    /// this old (0: only on reuse). Placement changes and new blocks of a
    /// known prefix are published as before.
    pub publish_reused: bool,
    /// See `publish_reused`.
    pub held_s: f64,
    /// Ring candidates compared by placement at N ≥ 2 (`choices`; 0: the
    /// `ours` value): power of d choices against the herd of a stale
    /// queue picture.
    pub choices: usize,
    /// Push (`push_tokens`; 0 off; not in the filter): a gateway that
    /// routes a request with at least this many uncached tokens sends its
    /// queue table to every peer at once (they see it live; its
    /// extrapolation base moves with it). Each push costs a request and a
    /// response head (`PULL_BYTES`) per peer, counted in the sync total.
    pub push_tokens: u32,
    /// The filter's `peers.ladder_last`: a record's last block is
    /// published only when it is a ladder position
    /// ([`prefix_router::peers_log::PeerLadder`]).
    pub ladder_last: bool,
    /// The filter's `peers.publish_bits`: only the ladder positions with at
    /// most this many significant bits are published (0: all), and every
    /// gateway's lookup tolerates the coarser ladder (`peer_bits`).
    pub publish_bits: u32,
    /// With each gateway's own in-flight counts as the load (no engine
    /// block, no exchanged counts, no `scale_load`): tell the core that a
    /// count stands for N requests (`Loads::per_count`, the floor
    /// of the spill price). Off: 1, the core before `gwcap11`.
    pub own_scale: bool,
    /// Experiment (`sync11b`, not in the filter): of a record's new ladder
    /// blocks, publish only the `top_k` deepest (0: all) and, below them,
    /// those on the `coarse_below`-bit ladder (0: none; the lookups then
    /// tolerate it as with `publish_bits`).
    pub top_k: usize,
    /// See `top_k`.
    pub coarse_below: u32,
    /// With `top_k`: thin only confirmed placements (cold or spilled
    /// prompts), not the new blocks of warm records.
    pub thin_confirmed: bool,
    /// With `top_k`: thin only records whose lookup found nothing (new
    /// roots).
    pub thin_roots: bool,
    /// With `top_k`: also keep the `bottom_k` shallowest new ladder blocks
    /// fine.
    pub bottom_k: usize,
    /// With `top_k`: 1, a gateway remembers the slots it thinned and
    /// publishes one when a later record's known prefix ends there; 2,
    /// without memory, a record whose known prefix ends at a ladder block
    /// off the `coarse_below` ladder publishes that block.
    pub refine: u8,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            anchor_block: 3,
            det_choices: 2,
            scrape_ms: 100.0,
            max_pending: 4096,
            min_publish: shipped_peers().0,
            refresh_s: shipped_peers().1,
            pub_pending: false,
            peer_end_marks: false,
            record_at_route: false,
            shared_pressure: false,
            scale_load: false,
            budget_bp: shipped_peers().2,
            engine: None,
            engine_ms: 500.0,
            // The filter's exchange: queued tokens only, extrapolated.
            share_load_ms: shipped_peers().3,
            extrapolate: true,
            share_part: 2,
            publish_reused: false,
            held_s: 0.0,
            choices: 0,
            push_tokens: 0,
            ladder_last: shipped_peers().4,
            publish_bits: shipped_peers().5,
            own_scale: true,
            top_k: 0,
            coarse_below: 0,
            thin_confirmed: false,
            thin_roots: false,
            bottom_k: 0,
            refine: 0,
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
            "min_publish" => self.min_publish = u().ok_or_else(bad)?,
            "refresh_s" => self.refresh_s = u().ok_or_else(bad)? as u32,
            "pub_pending" => self.pub_pending = v == "1" || v == "true",
            "peer_end_marks" => self.peer_end_marks = v == "1" || v == "true",
            "record_at_route" => self.record_at_route = v == "1" || v == "true",
            "shared_pressure" => self.shared_pressure = v == "1" || v == "true",
            "scale_load" => self.scale_load = v == "1" || v == "true",
            "own_scale" => self.own_scale = v == "1" || v == "true",
            "budget_bp" => self.budget_bp = u().ok_or_else(bad)? as u32,
            "engine" => {
                self.engine = match v {
                    "off" | "0" => None,
                    "max" => Some(LoadRule::Max),
                    "queued" => Some(LoadRule::Queued),
                    "delta" => Some(LoadRule::Delta),
                    _ => return Err(bad()),
                }
            }
            "engine_ms" => self.engine_ms = f().filter(|&x| x >= 1.0).ok_or_else(bad)?,
            "extrapolate" => self.extrapolate = v == "1" || v == "true",
            "share_part" => self.share_part = u().filter(|&x| x <= 2).ok_or_else(bad)? as u8,
            "publish_reused" => self.publish_reused = v == "1" || v == "true",
            "held_s" => self.held_s = f().ok_or_else(bad)?,
            "choices" => self.choices = u().ok_or_else(bad)?,
            "push_tokens" => self.push_tokens = u().ok_or_else(bad)? as u32,
            "refine" => self.refine = u().filter(|&x| x <= 2).ok_or_else(bad)? as u8,
            "bottom_k" => self.bottom_k = u().ok_or_else(bad)?,
            "thin_roots" => self.thin_roots = v == "1" || v == "true",
            "thin_confirmed" => self.thin_confirmed = v == "1" || v == "true",
            "top_k" => self.top_k = u().ok_or_else(bad)?,
            "coarse_below" => self.coarse_below = u().filter(|&b| b <= 16).ok_or_else(bad)? as u32,
            "ladder_last" => self.ladder_last = v == "1" || v == "true",
            "publish_bits" => self.publish_bits = u().filter(|&b| b <= 16).ok_or_else(bad)? as u32,
            "share_load_ms" => {
                self.share_load_ms = if v == "off" {
                    None
                } else {
                    Some(f().ok_or_else(bad)?)
                }
            }
            _ => return Err(format!("--gw: unknown knob {k}")),
        }
        Ok(())
    }
}

/// The filter's shipped `min_publish_chars`, `refresh_publish_s`,
/// `sync_budget_bp` and queue exchange (`share_queued`: every `pull_ms`)
/// (from the core's validated configuration, so the simulator runs its
/// defaults).
fn shipped_peers() -> (usize, u32, u32, Option<f64>, bool, u32) {
    let json = br#"{"endpoints":["127.0.0.1:1"],
        "peers":{"cluster":"c","admin_cluster":"a","secret":"0123456789abcdef0123"}}"#;
    let shipped = prefix_router::Config::from_json(json)
        .ok()
        .and_then(|c| c.peers);
    shipped.map_or((512, 120, 0, None, false, 0), |p| {
        (
            p.min_publish_chars as usize,
            p.refresh_publish_s,
            p.sync_budget_bp,
            p.queue_period_ms().map(f64::from),
            p.ladder_last,
            p.publish_bits,
        )
    })
}

/// The filter's `peers::peer_ladder`: which blocks of a record are
/// published (`ladder_last`, `publish_bits`).
fn peer_ladder(index: &PrefixIndex, knobs: &Knobs) -> PeerLadder {
    PeerLadder {
        ladder_bits: index.config().ladder_bits,
        publish_bits: knobs.publish_bits,
        ladder_last: knobs.ladder_last,
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
/// block of a shorter window (every block but a last one shorter than
/// `BLOCK_UNITS`: blocks end at message boundaries), or the window key when
/// no block is full.
pub fn anchor_key(key: &RoutingKey, anchor_block: usize) -> Option<u64> {
    let n = key.blocks.len();
    let last = key
        .units_at(n)
        .saturating_sub(key.units_at(n.saturating_sub(1)));
    let full = if last < BLOCK_UNITS {
        n.saturating_sub(1)
    } else {
        n
    };
    if full == 0 {
        return key.key;
    }
    key.blocks.get(anchor_block.min(full - 1)).copied()
}

/// The routers' clock, ms (the gateways' and `ours`'): simulated time
/// after a base of 2^32 ms (as a real clock is far from 0), so that a
/// pending record's time, set back by `max_age − PENDING_MS`, does not
/// saturate at 0 during the first minutes (then it would read as a fresh
/// confirmed entry, and its confirmation as a warm repeat).
pub const CLOCK_BASE_MS: u64 = 1 << 32;

pub fn clock_ms(now_s: f64) -> u64 {
    CLOCK_BASE_MS + (now_s * 1000.0) as u64
}

/// Characters a record adds beyond the known prefix (the filter's measure).
fn new_chars(key: &RoutingKey, known: Option<&Known>) -> usize {
    key.units
        .saturating_sub(key.units_at(known.map_or(0, |k| k.depth)))
}

/// The record puts a known prefix on a replica that was not its front holder.
fn moved(known: Option<&Known>, served: usize) -> bool {
    known.is_some_and(|k| k.entry.holders().next() != Some(served))
}

/// Bytes of one pull besides its items, both directions: the request and
/// the response head with the 28-byte batch header, as measured on the wire
/// by the e2e test (`tests/e2e/gateways.rs`, Envoy's counters of the peers
/// cluster): 97 B over HTTP/2 (HPACK-indexed headers on a kept connection,
/// the shipped `envoy/envoy-peers.yaml`), 390 B over HTTP/1.1.
const PULL_BYTES: f64 = 100.0;
/// The filter's default pull period, ms.
const PULL_PERIOD_MS: f64 = 100.0;

/// A slot write published to the peers.
#[derive(Debug, Clone, Copy)]
struct Delta {
    at_ms: u64,
    slot: u32,
    value: SlotValue,
    /// Index of this write in [`Profile::pubs`].
    id: u32,
}

/// One published write in the profile ([`Profile::pubs`]).
#[derive(Debug, Clone, Copy, Default)]
struct PubNote {
    kind: u8,
    pos: u8,
    rank: u8,
    used: u8,
}

/// What a published write was, for the profile ([`Profile`]).
const PUB_BLOCK: u8 = 0;
const PUB_CONFIRMED: u8 = 1;
const PUB_REFRESH: u8 = 2;
const PUB_HOLDERS: u8 = 3;
const PUB_STAND_IN: u8 = 4;
const PUB_OTHER: u8 = 5;
const PUB_KINDS: usize = 6;
const PUB_NAMES: [&str; PUB_KINDS] = [
    "block",
    "confirmed",
    "refresh",
    "holders",
    "stand_in",
    "other",
];

/// How a merge changed a peer's slot (what the peer did not know before).
const MERGE_NEW: u8 = 0;
const MERGE_HOLDERS: u8 = 1;
const MERGE_ORDER: u8 = 2;
const MERGE_TIME: u8 = 3;
const MERGE_KINDS: usize = 4;
const MERGE_NAMES: [&str; MERGE_KINDS] = ["new", "holders", "order", "time"];

/// The profile of the peer exchange (`docs/multi-gateway.md`, eleventh
/// session `sync11b`): every published write, what it was and whether a
/// peer's lookup ever read it, and the wire bytes by part. A peer **uses**
/// a merged write when its lookup reads the slot while the slot still holds
/// the merged value (probed: the search read it; deepest: it is the entry
/// of the depth found, whose holders and age the decision reads).
#[derive(Debug, Clone, Default)]
struct Profile {
    /// Per published write: kind (`PUB_*`), its block position (0: a
    /// ladder position, 1: the last block, 2: both, 3: neither), its rank
    /// among the record's published ladder blocks from the deepest (0: the
    /// deepest), and bit flags: 1 read and found by a peer's lookup, 2 the
    /// entry of the depth a peer's lookup found, 4 that and the merge
    /// mattered for that lookup (not a time-only refresh of a copy still
    /// live), 8 the entry a peer's second tier returned.
    pubs: Vec<PubNote>,
    /// Merges that changed a peer's slot, by `MERGE_*`.
    merges: [u64; MERGE_KINDS],
    /// Deepest reads of merged writes by `MERGE_*` of their merge.
    deepest_by_merge: [u64; MERGE_KINDS],
    /// Wire bytes: entries (5 B), stamp pairs, run heads and bitmaps.
    entry_bytes: u64,
    stamp_bytes: u64,
    run_bytes: u64,
}

/// The set of an entry's holders (sorted).
fn holder_set(e: &Entry) -> Vec<u16> {
    let mut v: Vec<u16> = e.holders.iter().flatten().copied().collect();
    v.sort_unstable();
    v
}

/// A read-only [`SlotStore`] that remembers the slots a lookup read.
struct Probe<'a> {
    inner: &'a VecStore,
    read: std::cell::RefCell<Vec<u32>>,
}

impl SlotStore for Probe<'_> {
    fn get(&self, slot: u32) -> Option<SlotValue> {
        self.read.borrow_mut().push(slot);
        self.inner.get(slot)
    }

    fn set(&mut self, _slot: u32, _value: SlotValue) {}
}

impl Profile {
    /// Gateway `g`'s lookup read `read` and found its depth at `deepest`
    /// (`(now, max_age)` ms: a time-only refresh mattered when the copy it
    /// replaced would have expired by now).
    fn note_lookup(
        &mut self,
        c: &mut Counts,
        g: &Gateway,
        read: &[u32],
        found: &[u32],
        (now_ms, max_age_ms): (u64, u64),
    ) {
        let current = |slot: u32| {
            g.prov
                .get(&slot)
                .filter(|p| g.store.get(slot) == Some(p.1))
                .copied()
        };
        for &slot in read {
            if !found.contains(&slot) {
                continue;
            }
            if let Some(p) = current(slot) {
                if let Some(x) = self.pubs.get_mut(p.0 as usize) {
                    x.used |= 1;
                }
            }
        }
        let Some(&slot) = found.last() else {
            return;
        };
        c.found += 1;
        if let Some((id, _, how, old)) = current(slot) {
            c.found_peer += 1;
            self.deepest_by_merge[usize::from(how)] += 1;
            let live = old.is_some_and(|t| {
                u64::from(prefix_router::index::decis(now_ms).wrapping_sub(t)) * 100 < max_age_ms
            });
            let mattered = how != MERGE_TIME || !live;
            if let Some(x) = self.pubs.get_mut(id as usize) {
                x.used |= 2 | if mattered { 4 } else { 0 };
            }
        }
    }

    /// Gateway `g`'s second tier returned the entry at `slot`.
    fn note_shallow(&mut self, g: &Gateway, slot: u32) {
        if let Some(p) = g.prov.get(&slot).filter(|p| g.store.get(slot) == Some(p.1)) {
            if let Some(x) = self.pubs.get_mut(p.0 as usize) {
                x.used |= 8;
            }
        }
    }

    /// The profile's counters for the report, per routed request `n`.
    /// The wire bytes are sent bytes (× `peers`, as `sync_bytes_per_req`).
    fn report(&self, n: f64, peers: f64, out: &mut Vec<(String, f64)>) {
        let mut count = [[0u64; 5]; PUB_KINDS];
        let mut pos = [[0u64; 5]; 4];
        let mut rank = [[0u64; 5]; 6];
        for x in &self.pubs {
            let rows = [
                &mut count[usize::from(x.kind).min(PUB_KINDS - 1)],
                &mut pos[usize::from(x.pos).min(3)],
                &mut rank[usize::from(x.rank).min(5)],
            ];
            for row in rows {
                row[0] += 1;
                for (bit, i) in [(1u8, 1usize), (2, 2), (4, 3), (8, 4)] {
                    if x.used & bit != 0 {
                        row[i] += 1;
                    }
                }
            }
        }
        for (k, r) in rank.iter().enumerate() {
            out.push((format!("pubrank_{k}_per_req"), r[0] as f64 / n));
            out.push((format!("pubrank_{k}_probed_per_req"), r[1] as f64 / n));
            out.push((format!("pubrank_{k}_mattered_per_req"), r[3] as f64 / n));
            out.push((format!("pubrank_{k}_tier2_per_req"), r[4] as f64 / n));
        }
        let any = self.pubs.iter().filter(|x| x.used & (1 | 8) != 0).count();
        out.push(("pub_used_any_per_req".into(), any as f64 / n));
        for (k, name) in PUB_NAMES.iter().enumerate() {
            let r = count[k];
            out.push((format!("pub_{name}_per_req"), r[0] as f64 / n));
            out.push((format!("pub_{name}_probed_per_req"), r[1] as f64 / n));
            out.push((format!("pub_{name}_deepest_per_req"), r[2] as f64 / n));
            out.push((format!("pub_{name}_mattered_per_req"), r[3] as f64 / n));
            out.push((format!("pub_{name}_tier2_per_req"), r[4] as f64 / n));
        }
        for (k, name) in ["ladder", "last", "ladder_last", "path"].iter().enumerate() {
            let r = pos[k];
            out.push((format!("pubpos_{name}_per_req"), r[0] as f64 / n));
            out.push((format!("pubpos_{name}_probed_per_req"), r[1] as f64 / n));
            out.push((format!("pubpos_{name}_mattered_per_req"), r[3] as f64 / n));
            out.push((format!("pubpos_{name}_tier2_per_req"), r[4] as f64 / n));
        }
        for (k, name) in MERGE_NAMES.iter().enumerate() {
            out.push((format!("merge_{name}_per_req"), self.merges[k] as f64 / n));
            out.push((
                format!("deepest_merge_{name}_per_req"),
                self.deepest_by_merge[k] as f64 / n,
            ));
        }
        out.push((
            "wire_entry_bytes_per_req".into(),
            self.entry_bytes as f64 * peers / n,
        ));
        out.push((
            "wire_stamp_bytes_per_req".into(),
            self.stamp_bytes as f64 * peers / n,
        ));
        out.push((
            "wire_run_bytes_per_req".into(),
            self.run_bytes as f64 * peers / n,
        ));
    }
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
    budget: Budget,
    /// Prompt tokens this gateway routed and not yet seen start (the
    /// filter's `cluster::queued` table: per Envoy, like the in-flight
    /// counts); `None` without `queued_prefill`.
    queued: Option<Vec<u32>>,
    /// `engine` knob: the scrape period index of `snap`, the sample and this
    /// gateway's in-flight counts when it was taken.
    epoch: i64,
    snap: Vec<crate::replica::Metrics>,
    snap_own: Vec<u32>,
    /// `publish_reused`: slot → (time held, ms) of confirmed first
    /// placements not published yet, in holding order.
    held: std::collections::HashMap<u32, u64>,
    held_order: VecDeque<(u32, u64)>,
    /// Profile: slot → (published write id, value after the merge, how the
    /// merge changed it, time of the copy it replaced) for slots whose
    /// value came from a peer.
    prov: std::collections::HashMap<u32, (u32, SlotValue, u8, Option<u32>)>,
    /// Profile: kind and position of the writes of the record being
    /// published, by slot.
    kinds: std::collections::HashMap<u32, PubNote>,
    /// `refine`: slots this gateway thinned from its publications.
    thinned: std::collections::HashSet<u32>,
}

/// Per routed request, until its first token.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    gateway: u8,
    expected_uncached: f32,
    in_flight: u32,
    delivered: u32,
    /// The lookup at routing (the record after the response uses it).
    known: Option<Known>,
    /// The decision is recorded (always but in `exc` modes).
    record: bool,
    /// Queued prefill tokens added to the primary at routing.
    queued_tokens: u32,
    primary: u16,
}

/// Counters for the report.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    /// `push_tokens`: queue tables pushed.
    pushes: u64,
    routed: u64,
    reasons: [u64; 4],
    records: u64,
    sets: u64,
    applied: u64,
    dropped: u64,
    taught: u64,
    body_chars: u64,
    wire_bytes: u64,
    /// Slot writes of the records by news kind: block, confirmed, placement,
    /// reorder (published or not).
    news: [u64; 4],
    /// Slot writes published.
    published: u64,
    /// Records the budget refused.
    refused: u64,
    /// Lookups that found a depth (≥ 1).
    found: u64,
    /// ... whose deepest entry came from a peer.
    found_peer: u64,
}

/// `N` gateways (see the module docs).
pub struct Gateways {
    router: Router,
    key: usize,
    cfg: AffinityConfig,
    index: PrefixIndex,
    spec: Spec,
    knobs: Knobs,
    rule: NewsRule,
    gws: Vec<Gateway>,
    /// The `spread_cold` counters of every gateway with `shared_pressure`.
    pressure: VecStore,
    scraped: Vec<u32>,
    next_scrape: f64,
    /// `share_load_ms`: every gateway's (in-flight, queued) counts at the
    /// last exchange, and when the next one is due (s).
    peer_loads: Vec<(Vec<u32>, Vec<u32>)>,
    next_share: f64,
    pending: Vec<Pending>,
    /// First-token times for the gateways' run time.
    run: super::RunClock,
    rng: Rng,
    c: Counts,
    prof: Profile,
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
        if spec.n > 1 && knobs.choices > 0 {
            cfg.cold_choices = knobs.choices;
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
                budget: Budget::new(f64::from(knobs.budget_bp) / 10_000.0, knobs.min_publish),
                queued: p.queued_prefill.then(|| vec![0; n]),
                epoch: i64::MIN,
                snap: Vec::new(),
                snap_own: Vec::new(),
                held: std::collections::HashMap::new(),
                held_order: VecDeque::new(),
                prov: std::collections::HashMap::new(),
                kinds: std::collections::HashMap::new(),
                thinned: std::collections::HashSet::new(),
            })
            .collect();
        Gateways {
            router,
            key,
            cfg,
            index: PrefixIndex::new(IndexConfig {
                // The filter with `peers`: the lookup tolerates the peers'
                // coarser ladder.
                peer_bits: if spec.mode.peer {
                    knobs.publish_bits.max(knobs.coarse_below)
                } else {
                    p.index.peer_bits
                },
                // The filter with `peers`: no end marks (`peer_end_marks`).
                end_marks: p.index.end_marks && (!spec.mode.peer || knobs.peer_end_marks),
                ..p.index
            }),
            spec,
            knobs,
            rule: NewsRule::refresh(knobs.refresh_s.saturating_mul(10))
                .with_pending(cfg.max_age_ms),
            gws,
            pressure: VecStore::new(1),
            scraped: vec![0; n],
            next_scrape: 0.0,
            peer_loads: Vec::new(),
            next_share: 0.0,
            pending: Vec::new(),
            run: super::RunClock::default(),
            rng: Rng::new(seed ^ 0x6d75),
            c: Counts::default(),
            prof: Profile::default(),
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

    /// Gateway `k`'s loads under the `engine` knob: the filter's `engine`
    /// block. The gateway takes a sample at the first request of each of
    /// its scrape periods (phase `k / N` of a period, as separate Envoys'
    /// timers are not aligned; the sample is the simulator's scrape current
    /// then) with its own in-flight counts at that time, and combines it
    /// with its live counts by [`host_load`].
    fn engine_loads(&mut self, k: usize, rule: LoadRule, view: &View<'_>) -> Vec<u32> {
        let period = self.knobs.engine_ms / 1000.0;
        let phase = period * k as f64 / self.gws.len().max(1) as f64;
        let epoch = ((view.now + phase) / period).floor() as i64;
        let g = &mut self.gws[k];
        let n = g.in_flight.len();
        if epoch != g.epoch || g.snap.len() != n {
            g.epoch = epoch;
            g.snap = view.scraped.to_vec();
            g.snap.resize(n, crate::replica::Metrics::default());
            g.snap_own = g.in_flight.clone();
        }
        (0..n)
            .map(|i| {
                let own = g.in_flight.get(i).copied().unwrap_or(0);
                let m = g.snap.get(i).copied().unwrap_or_default();
                let sample = m.as_sample();
                host_load(rule, own, &sample, g.snap_own.get(i).copied())
            })
            .collect()
    }

    /// Gateway `k`'s (in-flight, queued) per replica under `share_load_ms`:
    /// its own live counts plus every other gateway's at the last exchange
    /// (all gateways exchange every period; 0 = live).
    fn shared_loads(&mut self, k: usize, now: f64) -> (Vec<u32>, Vec<u32>) {
        let period = self.knobs.share_load_ms.unwrap_or(0.0) / 1000.0;
        if period <= 0.0 || now >= self.next_share || self.peer_loads.len() != self.gws.len() {
            self.peer_loads = self
                .gws
                .iter()
                .map(|g| (g.in_flight.clone(), g.queued.clone().unwrap_or_default()))
                .collect();
            if period > 0.0 {
                self.next_share = (now / period).floor() * period + period;
            }
        }
        let g = &self.gws[k];

        let own = (g.in_flight.clone(), g.queued.clone().unwrap_or_default());
        let mut sum = (vec![0i64; own.0.len()], vec![0i64; own.1.len()]);
        let others = self.peer_loads.len().saturating_sub(1) as i64;
        for (j, (l, q)) in self.peer_loads.iter().enumerate() {
            // Own snapshot: −(N − 1)× (the extrapolation's base); others: +1×.
            let w = match (j == k, self.knobs.extrapolate) {
                (true, true) => -others,
                (true, false) => continue,
                (false, _) => 1,
            };
            for (a, b) in sum.0.iter_mut().zip(l) {
                *a += w * i64::from(*b);
            }
            for (a, b) in sum.1.iter_mut().zip(q) {
                *a += w * i64::from(*b);
            }
        }
        let x = if self.knobs.extrapolate { others } else { 0 };
        let est = |own: &[u32], sum: &[i64]| -> Vec<u32> {
            own.iter()
                .zip(sum)
                .map(|(&o, &s)| {
                    let v = i64::from(o) * (1 + x) + s;
                    v.clamp(i64::from(o), i64::from(u32::MAX)) as u32
                })
                .collect()
        };
        (est(&own.0, &sum.0), est(&own.1, &sum.1))
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
                let sets = self.index.sets();
                for (to, g) in self.gws.iter_mut().enumerate() {
                    if to != from {
                        let at = peers::target(&g.store, sets, d.slot, &d.value);
                        let before = g.store.get(at).and_then(|v| Entry::decode(&v));
                        if let Some(at) = peers::merge(&mut g.store, sets, d.slot, &d.value) {
                            let after = g.store.get(at);
                            let inc = Entry::decode(&d.value);
                            let how = match (before, inc) {
                                (Some(b), Some(i)) if b.marked_key() == i.marked_key() => {
                                    let after = after.as_ref().and_then(Entry::decode);
                                    match after {
                                        Some(a) if holder_set(&a) != holder_set(&b) => {
                                            MERGE_HOLDERS
                                        }
                                        Some(a) if a.holders != b.holders => MERGE_ORDER,
                                        _ => MERGE_TIME,
                                    }
                                }
                                _ => MERGE_NEW,
                            };
                            self.prof.merges[usize::from(how)] += 1;
                            if let Some(a) = after {
                                let old = before.filter(|_| how != MERGE_NEW).map(|b| b.time);
                                g.prov.insert(at, (d.id, a, how, old));
                            }
                        }
                        self.c.applied += 1;
                    }
                }
            }
        }
    }

    /// Publish gateway `k`'s log from `seq` on: through the wire format
    /// (encode, validate, decode), into its outbox (merged at once with no
    /// delay).
    fn publish(&mut self, k: usize, seq: u64, now_ms: u64) {
        self.enqueue(k, seq, now_ms);
        if self.spec.delay_ms == 0.0 {
            self.sync(now_ms);
        }
    }

    fn enqueue(&mut self, k: usize, seq: u64, now_ms: u64) {
        let layout = peers::layout(self.index.config().slots, &[]);
        let g = &mut self.gws[k];
        // Writes the bounded log forgot before this pull count as dropped.
        self.c.dropped += g.log.oldest_seq().saturating_sub(seq);
        let slots = self.index.config().slots;
        let wire = g.log.encode_since(seq, usize::MAX, (layout, slots), 0);
        self.c.wire_bytes += (wire.len() - peers::HEADER_BYTES) as u64;
        let replicas = g.in_flight.len();
        let Ok(batch) = peers::decode(&wire, layout, usize::MAX, slots, replicas) else {
            return;
        };
        let stamped = batch
            .entries
            .iter()
            .filter(|e| Entry::decode(&e.1).is_some_and(|x| x.stamp() > 0))
            .count() as u64;
        let entries = batch.entries.len() as u64;
        let item_bytes = (peers::MIN_ITEM_BYTES as u64) * entries;
        self.prof.entry_bytes += item_bytes;
        self.prof.stamp_bytes += 2 * stamped;
        self.prof.run_bytes +=
            ((wire.len() - peers::HEADER_BYTES) as u64).saturating_sub(item_bytes + 2 * stamped);
        for (slot, value) in batch.entries {
            let note = g.kinds.get(&slot).copied().unwrap_or(PubNote {
                kind: PUB_OTHER,
                pos: 3,
                rank: 5,
                used: 0,
            });
            let id = self.prof.pubs.len() as u32;
            self.prof.pubs.push(note);
            if g.outbox.len() >= self.knobs.max_pending {
                g.outbox.pop_front();
                self.c.dropped += 1;
            }
            g.outbox.push_back(Delta {
                at_ms: now_ms,
                slot,
                value,
                id,
            });
        }
        g.kinds.clear();
    }

    /// Route request `idx` through gateway `k`.
    fn route_on(&mut self, k: usize, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let now_ms = clock_ms(view.now);
        self.sync(now_ms);
        self.scrape(view);
        let Some(key) = req.keys.core.get(self.key) else {
            return Routed {
                replica: 0,
                spill: false,
            };
        };
        let mode = self.spec.mode;
        // Requests of a replica one count of `loads` stands for.
        let mut load_scale = 1.0;
        let loads: Vec<u32> = if mode.engine_load {
            let g = &self.gws[k];
            self.scraped
                .iter()
                .zip(&g.since_scrape)
                .map(|(a, b)| a + b)
                .collect()
        } else if mode.peer && self.knobs.share_load_ms.is_some() && self.knobs.share_part != 2 {
            self.shared_loads(k, view.now).0
        } else if let Some(rule) = self.knobs.engine {
            self.engine_loads(k, rule, view)
        } else if self.knobs.scale_load {
            let n = self.gws.len() as u32;
            self.gws[k].in_flight.iter().map(|x| x * n).collect()
        } else {
            if self.knobs.own_scale {
                load_scale = self.gws.len() as f64;
            }
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
        let n = self.router.ring().len();
        let n_peers = self.gws.len() - 1;
        let queued_all = match self.knobs.share_load_ms.filter(|_| mode.peer) {
            Some(_) if self.gws[k].queued.is_some() && self.knobs.share_part != 1 => {
                Some(self.shared_loads(k, view.now).1)
            }
            None if self.knobs.scale_load => self.gws[k].queued.as_ref().map(|q| {
                q.iter()
                    .map(|x| x.saturating_mul(n_peers as u32 + 1))
                    .collect()
            }),
            _ => None,
        };
        let g = &mut self.gws[k];
        let known = if mode.peer {
            let probe = Probe {
                inner: &g.store,
                read: std::cell::RefCell::new(Vec::new()),
            };
            let known = self.index.lookup(&probe, &key.blocks, now_ms);
            let depth = known.as_ref().map_or(0, |x| x.depth);
            let found: Vec<u32> = key.blocks[..depth.min(key.blocks.len())]
                .iter()
                .map(|&b| self.index.slot(b))
                .collect();
            self.prof.note_lookup(
                &mut self.c,
                g,
                &probe.read.into_inner(),
                &found,
                (now_ms, self.cfg.max_age_ms),
            );
            known
        } else {
            self.index.lookup(&g.store, &key.blocks, now_ms)
        };
        g.ticket += 1;
        if mode.peer {
            g.budget.earn(req.body_chars as usize, n_peers);
        }
        // spread_cold: this gateway's own counters (as in the filter: one
        // set per Envoy, never published).
        let counters = if self.knobs.shared_pressure {
            &self.pressure
        } else {
            &g.store
        };
        let pressure = share::pressure_for(counters, n, key, known.as_ref(), &self.cfg);
        // The share counters: this gateway's own (as in the filter).
        let share = Share::for_config(&g.store, n, &self.cfg);
        let request = affinity::Request {
            key: rkey,
            prompt_chars: req.body_chars as usize,
            known: known.as_ref(),
            loads: Loads::new(&loads).scaled(load_scale),
            ticket: g.ticket,
            pressure: pressure.as_ref(),
            share: share.as_ref(),
            queued_prefill: queued_all.as_deref().or(g.queued.as_deref()),
            shallow: None,
        };
        // The filter's second lookup tier, on this gateway's table.
        let (index, store) = (&self.index, &g.store);
        let shallow = std::cell::Cell::new(None);
        let c = affinity::choose_tiered(
            self.router.ring(),
            &request,
            &g.cost,
            &self.cfg,
            |d| {
                let s = index.lookup_shallow(store, &key.blocks, d, now_ms);
                shallow.set(s.as_ref().map(|x| x.depth));
                s
            },
            || share::lazy_pressure(counters, n, &self.cfg),
        );
        if let Some(d) = shallow.get().filter(|_| mode.peer) {
            if let Some(&b) = key.blocks.get(d.wrapping_sub(1)) {
                self.prof.note_shallow(g, self.index.slot(b));
            }
        }
        // The records read the decision from the lookup (`new_holder_known`).
        let known = known.map(|k| k.spilled(affinity::writes_new_holder(c.reason, n)));
        Share::note(&mut g.store, n, c.primary, &self.cfg);
        // The filter's `Queued::start`: this gateway's own count.
        let queued_tokens =
            super::queue_start(g.queued.as_mut(), c.primary, c.expected_uncached_tokens());
        let push = self.knobs.push_tokens;
        if push > 0 && queued_tokens >= push && n_peers > 0 {
            if let (Some(q), Some(snap)) = (g.queued.as_ref(), self.peer_loads.get_mut(k)) {
                snap.1.clone_from(q);
                self.c.pushes += 1;
            }
        }
        let first_choice = rkey
            .key
            .and_then(|rk| self.router.ring().candidates(rk).next());
        let exception = c.reason != Reason::Cold || Some(c.primary) != first_choice;
        let record = !mode.exceptions || exception;
        // The filter's rule (`Router::record_pending`,
        // `AffinityConfig::pending_record`): cold and spilled requests all
        // their blocks, a warm one extending its prefix those past it.
        let depth = known.as_ref().map_or(0, |k| k.depth);
        let placed = self.cfg.pending_record(c.reason, depth, key.blocks.len());
        if let Some(which) = placed.filter(|_| record && !self.knobs.record_at_route) {
            // The filter's pending record: local only, unless `pub_pending`.
            let at = (now_ms, self.cfg.max_age_ms);
            let seq = g.log.next_seq();
            // Without `pub_pending` the wrapper is a plain pass-through.
            let publish = mode.peer && self.knobs.pub_pending;
            let mut p = Publishing::with_rule(&mut g.store, self.rule, publish);
            p.withhold(
                &self.index,
                &key.blocks,
                depth,
                peer_ladder(&self.index, &self.knobs),
            );
            self.index
                .record_pending(&mut p, &key.blocks, known.as_ref(), c.primary, at, which);
            if publish {
                let new_chars = new_chars(key, known.as_ref());
                let moved = moved(known.as_ref(), c.primary);
                for (slot, v) in p.outbox(new_chars, self.knobs.min_publish, moved) {
                    g.log.push(slot, v);
                }
                self.publish(k, seq, now_ms);
            }
        }
        let g = &mut self.gws[k];
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
            known,
            record,
            queued_tokens,
            primary: c.primary as u16,
        };
        self.c.reasons[match c.reason {
            Reason::Warm => 0,
            Reason::Spill => 1,
            Reason::Cold => 2,
            Reason::NoKey => 3,
        }] += 1;
        self.c.routed += 1;
        self.c.body_chars += u64::from(req.body_chars);
        if record && self.knobs.record_at_route {
            self.record(k, key, known.as_ref(), c.primary, now_ms);
        }
        Routed {
            replica: c.primary,
            spill: c.reason == Reason::Spill,
        }
    }

    /// Gateway `k` records that `served` holds `key`'s prefix (the filter's
    /// record after a 2xx: index record + spread_cold note), and with `peer`
    /// publishes the news as the filter does.
    fn record(
        &mut self,
        k: usize,
        key: &RoutingKey,
        known: Option<&Known>,
        served: usize,
        now_ms: u64,
    ) {
        let n = self.router.ring().len();
        let peer = self.spec.mode.peer;
        let g = &mut self.gws[k];
        self.c.records += 1;
        let seq = g.log.next_seq();
        // Profile and experiments: each block's slot, its position and its
        // value before the record.
        let slots: Vec<u32> = if peer {
            key.blocks.iter().map(|&b| self.index.slot(b)).collect()
        } else {
            Vec::new()
        };
        let pos_of: std::collections::HashMap<u32, usize> =
            slots.iter().enumerate().map(|(i, &s)| (s, i)).collect();
        let olds: std::collections::HashMap<u32, Option<SlotValue>> =
            slots.iter().map(|&s| (s, g.store.get(s))).collect();
        let mut p = Publishing::with_rule(&mut g.store, self.rule, peer);
        let depth = known.map_or(0, |k| k.depth);
        p.withhold(
            &self.index,
            &key.blocks,
            depth,
            peer_ladder(&self.index, &self.knobs),
        );
        let sets = self
            .index
            .record(&mut p, &key.blocks, known, served, now_ms);
        let new = new_chars(key, known);
        let mut out = p.outbox(new, self.knobs.min_publish, moved(known, served));
        // The filter's budget: a refused record publishes its placement
        // changes only.
        let offer = Offer {
            new_chars: new,
            bytes: peers::record_bytes(&out, self.index.config().slots),
            blocks: new >= self.knobs.min_publish,
        };
        if peer && !out.is_empty() && !g.budget.admit(offer) {
            out = p.outbox(0, usize::MAX, moved(known, served));
            self.c.refused += 1;
        }
        for w in &p.writes {
            let i = match w.2 {
                News::Block => 0,
                News::Confirmed => 1,
                News::Placement => 2,
                News::Reorder | News::None => 3,
            };
            self.c.news[i] += 1;
        }
        if peer && self.knobs.top_k > 0 && (!self.knobs.thin_roots || depth == 0) {
            let bits = self.index.config().ladder_bits;
            let only_confirmed = self.knobs.thin_confirmed;
            let newish = |slot: u32| {
                p.writes.iter().any(|w| {
                    w.0 == slot
                        && match w.2 {
                            News::Confirmed => true,
                            News::Block => !only_confirmed,
                            _ => false,
                        }
                })
            };
            let ladder_at: Vec<usize> = out
                .iter()
                .filter_map(|(s, _)| pos_of.get(s).copied())
                .filter(|&i| on_ladder(i, bits))
                .collect();
            let n_blocks = key.blocks.len();
            let (k, coarse) = (self.knobs.top_k, self.knobs.coarse_below);
            let bottom = self.knobs.bottom_k;
            let refine = self.knobs.refine == 1;
            let thinned = &mut g.thinned;
            out.retain(|(slot, _)| {
                let Some(&i) = pos_of.get(slot) else {
                    return true;
                };
                if !on_ladder(i, bits) || i + 1 == n_blocks || !newish(*slot) {
                    return true;
                }
                let rank = ladder_at.iter().filter(|&&j| j > i).count();
                let low = ladder_at.iter().filter(|&&j| j < i).count();
                let keep = rank < k || low < bottom || (coarse > 0 && on_ladder(i, coarse));
                if !keep && refine {
                    thinned.insert(*slot);
                }
                keep
            });
        }
        // `refine`: the known prefix ends at a block this gateway thinned.
        let bits = self.index.config().ladder_bits;
        let fine_end = self.knobs.refine == 2
            && depth > 0
            && on_ladder(depth - 1, bits)
            && !on_ladder(depth - 1, self.knobs.coarse_below.max(1));
        if let Some(&slot) = slots.get(depth.wrapping_sub(1)) {
            if (g.thinned.remove(&slot) || fine_end) && !out.iter().any(|w| w.0 == slot) {
                if let Some(v) = p.get(slot) {
                    out.push((slot, v));
                }
            }
        }
        if peer && self.knobs.publish_reused {
            let mv = moved(known, served);
            let first: std::collections::HashSet<u32> = p
                .writes
                .iter()
                .filter(|w| w.2 == News::Confirmed && !mv)
                .map(|w| w.0)
                .collect();
            out.retain(|(slot, _)| {
                if first.contains(slot) {
                    if g.held.insert(*slot, now_ms).is_none() {
                        g.held_order.push_back((*slot, now_ms));
                    }
                    false
                } else {
                    true
                }
            });
            // Reuse: the known prefix covers held slots.
            let depth = known.map_or(0, |k| k.depth);
            let mut due: Vec<u32> = key.blocks[..depth.min(key.blocks.len())]
                .iter()
                .map(|&b| self.index.slot(b))
                .filter(|s| g.held.remove(s).is_some())
                .collect();
            // Or old enough.
            let horizon = (self.knobs.held_s * 1000.0) as u64;
            while let Some(&(slot, at)) = g.held_order.front() {
                if g.held.get(&slot) != Some(&at) {
                    g.held_order.pop_front();
                } else if horizon > 0 && at + horizon <= now_ms {
                    g.held_order.pop_front();
                    g.held.remove(&slot);
                    due.push(slot);
                } else {
                    break;
                }
            }
            for slot in due {
                if let Some(v) = p.get(slot) {
                    out.push((slot, v));
                }
            }
        }
        if peer {
            // Profile: each published write's kind and block position.
            let n_blocks = key.blocks.len();
            let bits = self.index.config().ladder_bits;
            for (slot, v) in &out {
                let written = p.writes.iter().rev().find(|w| w.0 == *slot && w.1 == *v);
                let kind = match written.map(|w| w.2) {
                    Some(News::Block) => PUB_BLOCK,
                    Some(News::Confirmed) => PUB_CONFIRMED,
                    Some(News::Placement) => {
                        let old = olds
                            .get(slot)
                            .and_then(|o| o.as_ref())
                            .and_then(Entry::decode);
                        let new = Entry::decode(v);
                        match (old, new) {
                            (Some(o), Some(n))
                                if o.marked_key() == n.marked_key()
                                    && holder_set(&o) == holder_set(&n) =>
                            {
                                PUB_REFRESH
                            }
                            _ => PUB_HOLDERS,
                        }
                    }
                    Some(_) => PUB_OTHER,
                    None => PUB_STAND_IN,
                };
                let at = pos_of.get(slot).copied();
                let pos = at.map_or(3, |i| match (on_ladder(i, bits), i + 1 == n_blocks) {
                    (true, false) => 0,
                    (false, true) => 1,
                    (true, true) => 2,
                    (false, false) => 3,
                });
                // Rank among the published ladder blocks, from the deepest.
                let rank = at.filter(|&i| on_ladder(i, bits)).map_or(5, |i| {
                    out.iter()
                        .filter_map(|(s, _)| pos_of.get(s))
                        .filter(|&&j| j > i && on_ladder(j, bits))
                        .count()
                        .min(4) as u8
                });
                g.kinds.insert(
                    *slot,
                    PubNote {
                        kind,
                        pos,
                        rank,
                        used: 0,
                    },
                );
            }
        }
        self.c.published += out.len() as u64;
        self.c.sets += sets as u64;
        for (slot, v) in out {
            g.log.push(slot, v);
        }
        let counters = if self.knobs.shared_pressure {
            &mut self.pressure
        } else {
            &mut g.store
        };
        Pressure::note(counters, n, known, served, &self.cfg);
        if peer {
            self.publish(k, seq, now_ms);
        }
    }

    /// What gateway `k`'s index knows about `blocks` at simulated `now_ms` (tests).
    #[cfg(test)]
    fn known_depth(&self, k: usize, blocks: &[u64], now_ms: u64) -> usize {
        self.index
            .lookup(&self.gws[k].store, blocks, CLOCK_BASE_MS + now_ms)
            .map_or(0, |x| x.depth)
    }
}

impl Policy for Gateways {
    fn needs_scrape(&self) -> bool {
        self.knobs.engine.is_some()
    }

    fn route(&mut self, idx: u32, req: &SimRequest, view: &View<'_>) -> Routed {
        let k = self.rng.below(self.gws.len() as u64) as usize;
        self.route_on(k, idx, req, view)
    }

    fn on_first_token(&mut self, idx: u32, req: &SimRequest, replica: usize, ttft: f64, now: f64) {
        let Some(p) = self.pending.get(idx as usize).copied() else {
            return;
        };
        let k = usize::from(p.gateway);
        let now_ms = clock_ms(now);
        self.run.first_token(idx, now);
        // The filter's `Queued::finish` at the first response byte.
        if let Some(g) = self.gws.get_mut(k) {
            super::queue_finish(g.queued.as_mut(), usize::from(p.primary), p.queued_tokens);
        }
        if p.record && !self.knobs.record_at_route && k < self.gws.len() {
            if let Some(key) = req.keys.core.get(self.key) {
                self.sync(now_ms);
                self.record(k, key, p.known.as_ref(), replica, now_ms);
            }
        }
        let Some(g) = self.gws.get_mut(k) else {
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
        // Delivered tokens → hashed characters → index blocks (uneven).
        let chars = f64::from(p.delivered) * self.cfg.chars_per_token;
        let depth = key.depth_at(chars as usize);
        if depth > 0 {
            let blocks = &key.blocks[..depth];
            let known = self.index.lookup(&g.store, blocks, now_ms);
            self.index
                .record(&mut g.store, blocks, known.as_ref(), replica, now_ms);
            self.c.taught += 1;
        }
    }

    fn on_done(&mut self, idx: u32, replica: usize, now: f64) {
        let k = self.pending.get(idx as usize).map_or(0, |p| p.gateway) as usize;
        let run = self.run.done(idx, now);
        if let Some(g) = self.gws.get_mut(k) {
            if let Some(c) = g.in_flight.get_mut(replica) {
                *c = c.saturating_sub(1);
            }
            if let Some(ms) = run {
                g.cost.observe_run(ms);
            }
        }
    }

    fn extra(&self) -> Vec<(String, f64)> {
        let n = self.c.routed.max(1) as f64;
        let sets = self.c.sets as f64 / n;
        // Each published slot write goes to N − 1 peers (batch headers,
        // 28 bytes per pull, not counted in `sync_share_of_body`: a gateway's
        // *sent* item bytes over its request bytes). Every gateway also
        // receives its N − 1 peers' writes (the same amount on average), and
        // pays per pull, whatever the rate, a request and a response head
        // (`PULL_BYTES`, both directions, as puller and as server): the share
        // `sync_share_total_at_1000` adds both at 1 000 requests/s per gateway
        // and the filter's default 100 ms period (every pull is made by one
        // gateway and served by another: 2 (N − 1) pulls per period).
        let peers = self.gws.len().saturating_sub(1) as f64;
        let bytes = self.c.wire_bytes as f64 / n * peers;
        let body = self.c.body_chars as f64 / n;
        // Queue-only pulls between the index pulls (`peers.queue_ms`, the
        // `share_load_ms` knob when shorter than a pull period) cost a
        // request and a response head each too (no batch: an upper bound).
        let queue_rounds = self
            .knobs
            .share_load_ms
            .filter(|&q| q > 0.0 && q < PULL_PERIOD_MS)
            .map_or(0.0, |q| 1000.0 / q - 1000.0 / PULL_PERIOD_MS);
        let pulls_per_req = 2.0 * peers * (1000.0 / PULL_PERIOD_MS + queue_rounds) / 1000.0;
        // `push_tokens`: each push goes to N − 1 peers; every gateway also
        // serves as many from its peers.
        let pushes = 2.0 * peers * self.c.pushes as f64 / n;
        let total = 2.0 * bytes + (pulls_per_req + pushes) * PULL_BYTES;
        let news = |i: usize| self.c.news[i] as f64 / n;
        let mut out = vec![
            ("news_block_per_req".into(), news(0)),
            ("news_confirmed_per_req".into(), news(1)),
            ("news_placement_per_req".into(), news(2)),
            ("news_reorder_per_req".into(), news(3)),
            ("published_per_req".into(), self.c.published as f64 / n),
            ("pushes_per_req".into(), self.c.pushes as f64 / n),
            ("budget_refused_per_req".into(), self.c.refused as f64 / n),
            ("sync_share_total_at_1000".into(), total / body.max(1.0)),
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
            ("found_per_req".into(), self.c.found as f64 / n),
            ("found_peer_per_req".into(), self.c.found_peer as f64 / n),
            ("pull_head_bytes_per_req".into(), pulls_per_req * PULL_BYTES),
        ];
        if self.spec.mode.peer {
            self.prof.report(n, peers, &mut out);
        }
        out
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
        prepared(workload::sagemaker, scale, 3)
    }

    /// The requests of workload `make` for `ours` on 7 replicas.
    fn prepared(
        make: fn(&workload::Knobs) -> workload::Workload,
        scale: f64,
        seed: u64,
    ) -> (KeyBook, Vec<SimRequest>) {
        let k = workload::Knobs {
            scale,
            load: 1.0,
            seed,
        };
        requests(&make(&k))
    }

    /// The requests of workload `w` for `ours` on 7 replicas.
    fn requests(w: &workload::Workload) -> (KeyBook, Vec<SimRequest>) {
        let book = KeyBook::new(&["ours".to_string()], 7, &OursParams::default()).unwrap();
        let reqs = w
            .specs
            .iter()
            .map(|s| prepare_one(s, &book, book.max_chars()))
            .collect();
        (book, reqs)
    }

    /// The default parameters without end marks: the counts below are the
    /// ladder's and the last block's writes.
    fn unmarked() -> OursParams {
        let mut p = OursParams::default();
        p.index.end_marks = false;
        p
    }

    fn gateways(book: &KeyBook, name: &str, knobs: Knobs) -> Gateways {
        Gateways::new(
            book.routers[0].1.clone(),
            0,
            &unmarked(),
            parse_name(name).unwrap(),
            knobs,
            7,
            1,
        )
    }

    #[test]
    fn the_shipped_peers_defaults_are_read() {
        // (A refused configuration would silently give the fallbacks.)
        let (min_publish, refresh, budget, share, ..) = shipped_peers();
        assert_eq!((min_publish, refresh, budget), (512, 120, 0));
        assert_eq!(share, Some(25.0));
        // The queue exchange's period: `peers.queue_ms` (25 ms).
        assert_eq!(Knobs::default().share_load_ms, Some(25.0));
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
        // The gateways drive the core as `ours` does (pending record at
        // routing, record at the first token, spread_cold counters, the
        // queued-prefill count of `cluster::queued`, on by default), with
        // the index of the `gateways` helper (no end marks).
        let p = unmarked();
        assert!(p.queued_prefill);
        let mut ours = Ours::new(book.routers[0].1.clone(), 0, p, &m).unwrap();
        let mut one = gateways(&book, "indep/1", Knobs::default());
        let a = engine::run(&mut ours, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        let b = engine::run(&mut one, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        let pick = |r: &engine::RunResult| r.records.iter().map(|x| x.replica).collect::<Vec<_>>();
        assert_eq!(pick(&a), pick(&b));
        // Also with peer exchange (nobody to talk to).
        let mut lone = gateways(&book, "peer/1/0", Knobs::default());
        let d = engine::run(&mut lone, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        assert_eq!(pick(&a), pick(&d));
        // Two gateways that share nothing do not reproduce it.
        let mut two = gateways(&book, "indep/2", Knobs::default());
        let c = engine::run(&mut two, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        assert_ne!(pick(&a), pick(&c));
        // Without the queued-prefill count the decisions differ from `ours`.
        let off = OursParams {
            queued_prefill: false,
            ..OursParams::default()
        };
        let spec = parse_name("indep/1").unwrap();
        let r = book.routers[0].1.clone();
        let mut blind = Gateways::new(r, 0, &off, spec, Knobs::default(), 7, 1);
        let e = engine::run(&mut blind, &reqs, &m, 7, &engine::Limits::default()).unwrap();
        assert_ne!(pick(&a), pick(&e));
    }

    #[test]
    fn one_independent_gateway_is_ours_with_pending_warm() {
        // Small-block conversations compressed in time: a warm turn extends
        // its known prefix, and the next turn may come before its answer.
        let o = crate::trace::TraceOptions {
            time_scale: 0.05,
            ..Default::default()
        };
        let text = crate::tracegen::generate("nsblocks", 3, 0.25).unwrap();
        let (w, _) = crate::trace::parse(&text, &o, "n").unwrap();
        let (book, reqs) = requests(&w);
        let m = ModelParams::default();
        let pick = |r: &engine::RunResult| r.records.iter().map(|x| x.replica).collect::<Vec<_>>();
        let run = |p: &OursParams| {
            let r = book.routers[0].1.clone();
            let mut ours = Ours::new(r.clone(), 0, p.clone(), &m).unwrap();
            let spec = parse_name("indep/1").unwrap();
            let mut one = Gateways::new(r, 0, p, spec, Knobs::default(), 7, 1);
            let a = engine::run(&mut ours, &reqs, &m, 7, &engine::Limits::default()).unwrap();
            let b = engine::run(&mut one, &reqs, &m, 7, &engine::Limits::default()).unwrap();
            (pick(&a), pick(&b))
        };
        // The filter's pending rule (`AffinityConfig::pending_record`, on by
        // default) in both.
        let mut cold_only = OursParams::default();
        cold_only.set("pending_warm", "0").unwrap();
        let (plain, _) = run(&cold_only);
        let (ours, one) = run(&OursParams::default());
        assert_ne!(plain, ours, "pending_warm changes decisions");
        assert_eq!(ours, one);
    }

    #[test]
    fn queued_prefill_is_counted_per_gateway_until_the_first_token() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let mut g = gateways(&book, "peer/2/0", Knobs::default());
        let total = |g: &Gateways, k: usize| g.gws[k].queued.as_ref().unwrap().iter().sum::<u32>();
        let r = g.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        let added = g.pending[0].queued_tokens;
        assert!(added > 0, "a cold prompt queues its tokens");
        assert_eq!(g.gws[0].queued.as_ref().unwrap()[r.replica], added);
        assert_eq!(total(&g, 1), 0, "gateway 1 does not see gateway 0's queue");
        g.on_first_token(0, &reqs[0], r.replica, 0.1, 1.1);
        assert_eq!(total(&g, 0), 0);
    }

    #[test]
    fn exchanged_queues_arrive_once_per_period() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let knobs = |ms: f64, extrapolate: bool| Knobs {
            share_load_ms: Some(ms),
            share_part: 2,
            extrapolate,
            ..Knobs::default()
        };
        // Live: gateway 1 sees gateway 0's queued tokens at once.
        let mut live = gateways(&book, "peer/2/0", knobs(0.0, false));
        let r = live.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        let added = live.pending[0].queued_tokens;
        assert_eq!(live.shared_loads(1, 1.0).1[r.replica], added);
        // Every 100 ms: not before the next exchange, then yes.
        let mut slow = gateways(&book, "peer/2/0", knobs(100.0, false));
        slow.shared_loads(1, 0.95);
        let r = slow.route_on(0, 0, &reqs[0], &view(0.96, &reps, &m));
        let added = slow.pending[0].queued_tokens;
        assert_eq!(slow.shared_loads(1, 0.99).1[r.replica], 0);
        assert_eq!(slow.shared_loads(1, 1.0).1[r.replica], added);
        // Extrapolated: gateway 0's own change since the exchange counts
        // once more for its one peer (N − 1 = 1).
        let mut x = gateways(&book, "peer/2/0", knobs(100.0, true));
        x.shared_loads(0, 0.95);
        let r = x.route_on(0, 0, &reqs[0], &view(0.96, &reps, &m));
        let added = x.pending[0].queued_tokens;
        assert_eq!(x.shared_loads(0, 0.97).1[r.replica], 2 * added);
    }

    #[test]
    fn a_pushed_queue_is_seen_before_the_next_exchange() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let seen = |push_tokens: u32| {
            let knobs = Knobs {
                share_load_ms: Some(100.0),
                extrapolate: false,
                push_tokens,
                ..Knobs::default()
            };
            let mut g = gateways(&book, "peer/2/0", knobs);
            g.shared_loads(1, 0.95);
            let r = g.route_on(0, 0, &reqs[0], &view(0.96, &reps, &m));
            let added = g.pending[0].queued_tokens;
            (g.shared_loads(1, 0.99).1[r.replica], added, g.c.pushes)
        };
        let (pushed, added, n) = seen(1);
        assert!(added > 0);
        assert_eq!((pushed, n), (added, 1));
        // Over the threshold: no push, seen only at the next exchange.
        assert_eq!(seen(added + 1), (0, added, 0));
    }

    #[test]
    fn queue_only_pulls_are_counted_in_the_sync_total() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let total = |ms: Option<f64>| {
            let knobs = Knobs {
                share_load_ms: ms,
                ..Knobs::default()
            };
            let mut g = gateways(&book, "peer/4/0", knobs);
            for (i, r) in reqs.iter().take(20).enumerate() {
                g.route_on(i % 4, i as u32, r, &view(1.0 + i as f64, &reps, &m));
            }
            let body = g.c.body_chars as f64 / g.c.routed as f64;
            let x = g.extra();
            let t = x
                .iter()
                .find(|e| e.0 == "sync_share_total_at_1000")
                .unwrap()
                .1;
            (t, body)
        };
        // Same decisions (no record before a first token): only the pulls
        // differ. 25 ms: 30 queue-only pulls a second besides the 10 index
        // pulls, to and from each of 3 peers, a head each.
        let (t100, body) = total(Some(100.0));
        let (t25, _) = total(Some(25.0));
        let (off, _) = total(None);
        assert_eq!(t100, off);
        let extra = 2.0 * 3.0 * 30.0 / 1000.0 * PULL_BYTES / body;
        assert!((t25 - t100 - extra).abs() < 1e-12, "{t25} {t100} {extra}");
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

    /// What a peer finds of an `n`-block prompt published with the
    /// default `ladder_last`: all of it when its last block is a ladder
    /// position, else up to the deepest ladder position below.
    fn peer_depth(n: usize) -> usize {
        let bits = prefix_router::index::IndexConfig::default().ladder_bits;
        (0..n)
            .rev()
            .find(|&p| prefix_router::index::on_ladder(p, bits))
            .map_or(0, |p| p + 1)
    }

    /// A small sagemaker run, 7 idle replicas and knobs recording at routing.
    fn at_route_setup() -> (
        KeyBook,
        Vec<SimRequest>,
        ModelParams,
        Vec<crate::replica::Replica>,
        Knobs,
    ) {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let knobs = Knobs {
            record_at_route: true,
            ..Knobs::default()
        };
        (book, reqs, m, reps, knobs)
    }

    #[test]
    fn the_profile_counts_what_peers_read() {
        let (book, reqs, m, reps, knobs) = at_route_setup();
        let mut g = gateways(&book, "peer/2/200", knobs);
        g.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        let published = g.prof.pubs.len();
        assert!(published > 1);
        assert_eq!(g.c.published as usize, published);
        // Every published byte is an entry, a stamp pair or run overhead.
        let p = &g.prof;
        assert_eq!(p.entry_bytes + p.stamp_bytes + p.run_bytes, g.c.wire_bytes);
        assert_eq!(p.entry_bytes, (peers::MIN_ITEM_BYTES * published) as u64);
        // Gateway 0 reads its own writes: no peer use.
        g.route_on(0, 1, &reqs[0], &view(1.1, &reps, &m));
        assert!(g.prof.pubs.iter().all(|x| x.used == 0));
        assert_eq!(g.c.found_peer, 0);
        // Merged at gateway 1 after the delay: its lookup of the same prompt
        // finds the deepest published ladder block (rank 0), the merge was
        // news to it, and the search read a few of the others.
        g.route_on(1, 2, &reqs[0], &view(1.3, &reps, &m));
        assert_eq!(g.c.found_peer, 1);
        let deepest: Vec<_> = g.prof.pubs.iter().filter(|x| x.used & 2 != 0).collect();
        assert_eq!(deepest.len(), 1);
        assert_eq!((deepest[0].rank, deepest[0].used & 4), (0, 4));
        let read = g.prof.pubs.iter().filter(|x| x.used & 1 != 0).count();
        assert!(read >= 1 && read < published, "{read} of {published}");
        assert_eq!(g.prof.merges[usize::from(MERGE_NEW)], published as u64);
        // A prompt of another group reads none of them.
        let other = (1..reqs.len())
            .find(|&i| reqs[i].keys.core[0].blocks[0] != reqs[0].keys.core[0].blocks[0])
            .unwrap();
        let before: Vec<u8> = g.prof.pubs.iter().map(|x| x.used).collect();
        g.route_on(1, 3, &reqs[other], &view(1.4, &reps, &m));
        let after: Vec<u8> = g.prof.pubs.iter().take(published).map(|x| x.used).collect();
        assert_eq!(before[..published], after[..]);
    }

    #[test]
    fn peer_writes_arrive_after_the_delay_and_the_outbox_is_bounded() {
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let at_route = Knobs {
            record_at_route: true,
            ..Knobs::default()
        };
        let mut g = gateways(&book, "peer/2/200", at_route);
        let blocks = |i: usize| &reqs[i].keys.core[0].blocks;
        let full = blocks(0).len();
        g.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        assert_eq!(g.known_depth(0, blocks(0), 1000), full);
        assert_eq!(g.known_depth(1, blocks(0), 1000), 0);
        // Not yet due at 1.1 s; merged at 1.2 s (before routing request 2).
        g.route_on(0, 1, &reqs[1], &view(1.1, &reps, &m));
        assert_eq!(g.known_depth(1, blocks(0), 1100), 0);
        g.route_on(0, 2, &reqs[2], &view(1.2, &reps, &m));
        assert_eq!(g.known_depth(1, blocks(0), 1200), peer_depth(full));
        // Without `ladder_last` the last block travels too.
        let mut all = gateways(
            &book,
            "peer/2/200",
            Knobs {
                ladder_last: false,
                ..at_route
            },
        );
        all.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        all.route_on(0, 2, &reqs[2], &view(1.2, &reps, &m));
        assert_eq!(all.known_depth(1, blocks(0), 1200), full);
        assert!(g.c.wire_bytes >= (g.c.published * peers::MIN_ITEM_BYTES as u64));
        // An outbox of 4 slot writes keeps the last 4 of a record and counts the rest.
        let knobs = Knobs {
            max_pending: 4,
            ..at_route
        };
        let mut small = gateways(&book, "peer/2/200", knobs);
        small.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        assert_eq!(small.gws[0].outbox.len(), 4);
        assert_eq!(small.c.dropped, small.c.published - 4);
        small.route_on(1, 1, &reqs[1], &view(5.0, &reps, &m));
        assert_eq!(small.c.applied, 4);
    }

    #[test]
    fn only_news_is_published() {
        let (book, reqs, m, reps, at_route) = at_route_setup();
        let mut g = gateways(&book, "peer/2/0", at_route);
        g.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        let first = g.c.wire_bytes;
        assert!(first > 0);
        assert_eq!(
            g.known_depth(1, &reqs[0].keys.core[0].blocks, 1000),
            peer_depth(reqs[0].keys.core[0].blocks.len())
        );
        // The same prompt again through gateway 0: warm at the front holder, nothing sent.
        g.route_on(0, 1, &reqs[0], &view(1.5, &reps, &m));
        assert_eq!(g.c.reasons[0], 1);
        assert_eq!(g.c.wire_bytes, first);
        // A threshold above the prompt: its new blocks are not published.
        let high = Knobs {
            min_publish: 1 << 30,
            ..at_route
        };
        let mut quiet = gateways(&book, "peer/2/0", high);
        quiet.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        assert_eq!(quiet.c.wire_bytes, 0);
        assert_eq!(quiet.known_depth(1, &reqs[0].keys.core[0].blocks, 1000), 0);
    }

    #[test]
    fn the_record_after_the_response_is_published_once() {
        // The filter's order: pending record at routing (local), the record
        // at the first token confirms it and is what the peers get.
        let (book, reqs) = sagemaker(0.01);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let mut g = gateways(&book, "peer/2/0", Knobs::default());
        let blocks = &reqs[0].keys.core[0].blocks;
        let r = g.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        assert_eq!(g.c.wire_bytes, 0, "pending records stay local");
        assert!(g.known_depth(0, blocks, 1000) > 0);
        assert_eq!(g.known_depth(1, blocks, 1000), 0);
        g.on_first_token(0, &reqs[0], r.replica, 0.1, 1.1);
        assert!(g.c.wire_bytes > 0);
        assert_eq!(g.known_depth(1, blocks, 1100), peer_depth(blocks.len()));
        // With pub_pending the pending record travels at routing.
        let eager = Knobs {
            pub_pending: true,
            ..Knobs::default()
        };
        let mut e = gateways(&book, "peer/2/0", eager);
        e.route_on(0, 0, &reqs[0], &view(1.0, &reps, &m));
        assert!(e.c.wire_bytes > 0);
        assert!(e.known_depth(1, blocks, 1000) > 0);
    }

    #[test]
    fn the_budget_bounds_what_is_published() {
        let (book, reqs) = sagemaker(0.05);
        let m = ModelParams::default();
        let reps: Vec<_> = (0..7).map(|_| crate::replica::Replica::new(&m)).collect();
        let run = |budget_bp: u32| {
            let knobs = Knobs {
                record_at_route: true,
                budget_bp,
                ..Knobs::default()
            };
            let mut g = gateways(&book, "peer/2/0", knobs);
            for (i, r) in reqs.iter().enumerate() {
                g.route_on(i % 2, i as u32, r, &view(1.0 + i as f64, &reps, &m));
            }
            g.c
        };
        let (free, capped) = (run(0), run(1));
        assert_eq!(free.refused, 0);
        assert!(capped.refused > 0);
        // 1 bp of the request bytes, shared by 2 × 1 peer, plus the burst
        // and a placement-only overdraw: far less than without a budget.
        let earned = 0.0001 * capped.body_chars as f64 / 2.0;
        // (× 1.5: an item takes 7 to 8 bytes on the wire, the budget charges 7).
        let bound = 1.5 * (earned + 2.0 * prefix_router::peers_budget::BURST);
        assert!(
            (capped.wire_bytes as f64) < bound,
            "{} vs {bound}",
            capped.wire_bytes
        );
        assert!(capped.wire_bytes < free.wire_bytes / 2);
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
        short.ends = vec![256, 512, 522];
        assert_eq!(anchor_key(&short, 3), Some(short.blocks[1]));
        short.units = 10;
        short.blocks.truncate(1);
        short.ends = vec![10];
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
