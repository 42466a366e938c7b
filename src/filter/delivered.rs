//! Predicted vs delivered: the adapter side of [`crate::usage`] and
//! [`crate::feedback`].
//!
//! Per request ([`Delivery`]):
//! - at routing, what the router expects: the branch and, for `affinity`, the
//!   prompt tokens expected from the primary's cache (the index match) and
//!   the prompt size estimated with `chars_per_token`
//!   ([`crate::affinity::Choice`]);
//! - at response headers, a [`UsageScanner`] if the response is JSON or an
//!   event stream;
//! - each response chunk is read (`get_http_response_body` of the current
//!   chunk only) and fed to the scanner, then `Action::Continue`: nothing is
//!   buffered, the first byte is not delayed;
//! - at the end of the response (last chunk, or `on_log` if the stream was cut):
//!   stats, the access-log field and the feedback.
//!
//! Stats (per endpoint, `<ep>` = `10_0_0_1_8000`; envoy/envoy.yaml's
//! `stats_tags` turns `<ep>` into an `endpoint` label):
//! `prefix_router.endpoint.<ep>.predicted_cached_tokens` and
//! `...delivered_cached_tokens` (histograms, one sample each per response
//! that reported usage), `...prompt_tokens` (counter, engine-reported),
//! `...surprise.expected_hit_got_miss` and `...surprise.expected_miss_got_hit`
//! (counters); totals `prefix_router.delivered.<prompt_tokens|cached_tokens|
//! predicted_tokens|responses|unreported>` (counters: the delivered hit rate
//! is `cached_tokens / prompt_tokens`, the predicted one
//! `predicted_tokens / prompt_tokens`).
//!
//! Access log: filter state `wasm.prefix_router` (proxy-wasm `set_property`),
//! `branch=<b> predicted=<tokens|-> delivered=<tokens|-> prompt=<tokens|->
//! surprise=<none|expected_hit_got_miss|expected_miss_got_hit>`; log it with
//! `%FILTER_STATE(wasm.prefix_router:PLAIN)%`.
//!
//! Responses API: the response `id` is remembered with the replica that
//! served it, by address id ([`holder_id`]; [`crate::responses`], shared data
//! `<ns>resp/`), and a request whose `previous_response_id` is known goes to
//! that replica while it is a usable member ([`Shared::pinned`]).
//!
//! Feedback: expected hits that got misses raise the served replica's
//! eviction horizon (three in a row, [`crate::feedback`]; shared data key
//! `<ns>horizon`, CAS, stamped with the membership generation whose
//! positions it uses: a membership change starts the horizons afresh; every
//! worker rereads it at most once per [`HORIZON_REFRESH_MS`]); a request served by another
//! replica than the primary (retry, fallback) is recorded for that replica
//! by the record after a 2xx (`http.rs`); when the engine served more cached tokens than predicted
//! (the index's ladder only proves a lower bound, or another gateway put the
//! prefix there), the confirmed depth is written
//! ([`crate::index::PrefixIndex::confirm`], ≤ 5 sets, only then).

use super::host::{self, MetricKind};
use super::root::Plugin;
use super::slots;
use super::stats::{define, endpoint_label};
use crate::affinity::Choice;
use crate::cluster::view::{holder_id, AddrSlots, View};
use crate::extract::previous_response_id;
use crate::feedback::Horizons;
use crate::hash::{depth_at, units_at, BLOCK_UNITS};
use crate::index::{decis, Known};
use crate::responses;
use crate::usage::{compare, predict, Prediction, Surprise, UsageScanner};
use std::cell::RefCell;

/// Buffer type of the response body (proxy-wasm ABI).
const BUFFER_RESPONSE_BODY: u32 = 1;
/// Filter-state name of the access-log field (Envoy prefixes `wasm.`).
pub const PROPERTY: &str = "prefix_router";
/// Workers reread the shared horizons at most this often.
pub const HORIZON_REFRESH_MS: u64 = 1000;
const CAS_ATTEMPTS: usize = 8;
/// Most endpoints given per-endpoint metrics (addresses seen over the
/// plugin's life, with membership churn); later ones only count in totals.
const MAX_ENDPOINT_STATS: usize = 4096;

/// Metric ids of one endpoint.
struct EndpointStats {
    predicted: Option<u32>,
    delivered: Option<u32>,
    prompt: Option<u32>,
    hit_got_miss: Option<u32>,
    miss_got_hit: Option<u32>,
}

/// This worker's copy of the shared horizons.
struct HorizonCache {
    horizons: Horizons,
    /// When it was read (ms).
    read_at: Option<u64>,
    /// Membership generation whose positions it uses.
    generation: u64,
}

/// Horizons stamped with their membership generation (8 bytes LE first).
fn encode_stamped(generation: u64, h: &Horizons) -> Vec<u8> {
    let mut v = generation.to_le_bytes().to_vec();
    v.extend_from_slice(&h.encode());
    v
}

/// Horizons of `generation` for `n` members; another generation's read as none.
fn decode_stamped(b: &[u8], generation: u64, n: usize) -> Horizons {
    match b.split_first_chunk::<8>() {
        Some((g, rest)) if u64::from_le_bytes(*g) == generation => Horizons::decode(rest, n),
        _ => Horizons::new(n),
    }
}

thread_local! {
    /// The access-log field's buffer (the VM is single-threaded).
    static FIELD: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Append `v` in decimal, or `-` if unknown (no allocation).
fn push_count(out: &mut String, v: Option<u64>) {
    let Some(mut v) = v else {
        out.push('-');
        return;
    };
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (v % 10) as u8;
        }
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    for &d in digits.get(i..).unwrap_or(&[]) {
        out.push(char::from(d));
    }
}

/// Plugin-wide state of this module (one per VM).
pub struct Shared {
    /// Per-endpoint metrics by address, defined on first use.
    endpoints: RefCell<Vec<(String, EndpointStats)>>,
    prompt_tokens: Option<u32>,
    cached_tokens: Option<u32>,
    predicted_tokens: Option<u32>,
    responses: Option<u32>,
    unreported: Option<u32>,
    horizon_key: String,
    /// Shared-data namespace of the response id → replica table.
    responses_ns: String,
    /// This worker's copy of the horizons.
    horizons: RefCell<HorizonCache>,
}

fn add(id: Option<u32>, v: u64) {
    if let Some(id) = id {
        super::batch::add(id, i64::try_from(v).unwrap_or(i64::MAX));
    }
}

fn sample(id: Option<u32>, v: u64) {
    if let Some(id) = id {
        host::record_metric(id, v);
    }
}

impl Shared {
    /// The totals; `ns` is the plugin's shared-data namespace. Per-endpoint
    /// metrics are defined when an endpoint first serves a response.
    pub fn new(ns: &str) -> Shared {
        let c = MetricKind::Counter;
        Shared {
            endpoints: RefCell::new(Vec::new()),
            prompt_tokens: define(c, "prefix_router.delivered.prompt_tokens"),
            cached_tokens: define(c, "prefix_router.delivered.cached_tokens"),
            predicted_tokens: define(c, "prefix_router.delivered.predicted_tokens"),
            responses: define(c, "prefix_router.delivered.responses"),
            unreported: define(c, "prefix_router.delivered.unreported"),
            horizon_key: format!("{ns}horizon"),
            responses_ns: format!("{ns}resp/"),
            horizons: RefCell::new(HorizonCache {
                horizons: Horizons::default(),
                read_at: None,
                generation: u64::MAX,
            }),
        }
    }

    /// Run `f` with the metrics of endpoint `addr` (defined on first use,
    /// at most [`MAX_ENDPOINT_STATS`] endpoints).
    fn with_endpoint(&self, addr: &str, f: impl FnOnce(&EndpointStats)) {
        let Ok(mut eps) = self.endpoints.try_borrow_mut() else {
            return;
        };
        if let Some((_, e)) = eps.iter().find(|(a, _)| a == addr) {
            f(e);
            return;
        }
        if eps.len() >= MAX_ENDPOINT_STATS {
            return;
        }
        let (c, h) = (MetricKind::Counter, MetricKind::Histogram);
        let ep = |what: &str, kind| {
            define(
                kind,
                &format!("prefix_router.endpoint.{}.{what}", endpoint_label(addr)),
            )
        };
        let e = EndpointStats {
            predicted: ep("predicted_cached_tokens", h),
            delivered: ep("delivered_cached_tokens", h),
            prompt: ep("prompt_tokens", c),
            hit_got_miss: ep("surprise.expected_hit_got_miss", c),
            miss_got_hit: ep("surprise.expected_miss_got_hit", c),
        };
        f(&e);
        eps.push((addr.to_string(), e));
    }

    /// Run `f` with the eviction horizons of `view`'s members (reread from
    /// shared data at most once per [`HORIZON_REFRESH_MS`]; a new membership
    /// generation starts them afresh).
    pub fn with_horizons<T>(&self, now_ms: u64, view: &View, f: impl FnOnce(&Horizons) -> T) -> T {
        let n = view.endpoints().len();
        let Ok(mut cell) = self.horizons.try_borrow_mut() else {
            return f(&Horizons::default());
        };
        if cell.generation != view.generation {
            *cell = HorizonCache {
                horizons: Horizons::new(n),
                read_at: None,
                generation: view.generation,
            };
        }
        let due = cell
            .read_at
            .map_or(true, |t| now_ms.saturating_sub(t) >= HORIZON_REFRESH_MS);
        if due {
            match host::shared_get(&self.horizon_key) {
                Ok((Some(b), _)) => cell.horizons = decode_stamped(&b, view.generation, n),
                Ok((None, _)) => {}
                Err(e) => log::debug!("cannot read {}: {e}", self.horizon_key),
            }
            cell.read_at = Some(now_ms);
        }
        f(&cell.horizons)
    }

    /// Responses API: the position in `view` of the replica that produced
    /// the body's `previous_response_id`, if known ([`crate::responses`]).
    pub fn pinned(&self, body: &[u8], now_ms: u64, view: &View) -> Option<usize> {
        let id = previous_response_id(body)?;
        let r = responses::find(&slots::plain(&self.responses_ns), &id, now_ms)?;
        view.position_of_id(u16::try_from(r).ok()?)
    }

    /// A miss on replica `r` of `view` ([`Horizons::raise`]), in shared data (CAS) and here.
    fn raise(&self, view: &View, r: usize, time: u32, routed_at: u32) {
        self.update(view, |h| {
            h.raise(r, time, routed_at);
        });
    }

    /// A delivered predicted hit on replica `r` ([`Horizons::hit`]): only
    /// when this worker saw misses pending there (no shared-data call otherwise).
    fn hit(&self, view: &View, r: usize) {
        let armed = self
            .horizons
            .try_borrow()
            .is_ok_and(|cell| cell.generation == view.generation && cell.horizons.armed(r));
        if armed {
            self.update(view, |h| {
                h.hit(r);
            });
        }
    }

    /// Apply `f` to the shared horizons (CAS) and to this worker's copy.
    fn update(&self, view: &View, f: impl Fn(&mut Horizons)) {
        let (n, g) = (view.endpoints().len(), view.generation);
        for _ in 0..CAS_ATTEMPTS {
            let Ok((bytes, cas)) = host::shared_get(&self.horizon_key) else {
                break;
            };
            let mut h = bytes.map_or_else(|| Horizons::new(n), |b| decode_stamped(&b, g, n));
            f(&mut h);
            match host::shared_set(&self.horizon_key, &encode_stamped(g, &h), cas) {
                Ok(()) => {
                    self.store_local(g, h);
                    return;
                }
                Err(host::CAS_MISMATCH) => continue,
                Err(e) => {
                    log::warn!("cannot write {}: {e}", self.horizon_key);
                    break;
                }
            }
        }
        // Shared data failed: at least this worker learns.
        if let Ok(mut cell) = self.horizons.try_borrow_mut() {
            if cell.generation == g {
                f(&mut cell.horizons);
            }
        }
    }

    fn store_local(&self, generation: u64, h: Horizons) {
        if let Ok(mut cell) = self.horizons.try_borrow_mut() {
            cell.horizons = h;
            cell.generation = generation;
        }
    }
}

/// What one request expected and what its response delivered.
#[derive(Default)]
pub struct Delivery {
    branch: &'static str,
    primary: Option<usize>,
    prediction: Option<Prediction>,
    /// What the index knew (holders kept by a confirmed depth).
    known: Option<Known>,
    /// Index entry time behind a warm prediction, and the routing time (deciseconds).
    entry_time: Option<u32>,
    routed_at: u32,
    /// `affinity`: the request's block keys (to record the replica that served it).
    blocks: Vec<u64>,
    /// Their end offsets in characters ([`crate::RoutingKey::ends`]).
    ends: Vec<u32>,
    scanner: Option<UsageScanner>,
    /// A Responses API request: remember which replica produced the response.
    responses_api: bool,
    done: bool,
}

impl Delivery {
    /// Routed to `primary` by `branch`.
    pub fn routed(&mut self, branch: &'static str, primary: usize) {
        self.branch = branch;
        self.primary = Some(primary);
    }

    /// `affinity`: the prediction for the primary and what the index knew.
    /// `blocks` = the request's block count, `block_tokens` = tokens of the
    /// block after the known depth (blocks are uneven).
    pub fn predicted_from(
        &mut self,
        choice: &Choice,
        known: Option<&Known>,
        blocks: usize,
        block_tokens: f64,
        now_ms: u64,
    ) {
        self.routed_at = decis(now_ms);
        let depth = known.map_or(0, |k| k.depth);
        self.prediction = Some(Prediction {
            cached_tokens: predict(
                choice.expected_cached_tokens,
                depth,
                blocks,
                block_tokens,
                choice.prompt_tokens,
            ),
            prompt_tokens: choice.prompt_tokens,
        });
        self.entry_time = known.map(|k| k.entry.time);
        self.known = known.copied();
    }

    /// The record (written at response headers) hands back the block keys
    /// it held (kept only if [`Delivery::keep_blocks`] was given none).
    pub fn hand_blocks(&mut self, blocks: Vec<u64>) {
        if self.blocks.is_empty() && !self.ends.is_empty() {
            self.blocks = blocks;
        }
    }

    /// A Responses API request (its response id is remembered).
    pub fn responses_api(&mut self) {
        self.responses_api = true;
    }

    /// `affinity`: keep the block keys and their end offsets (moved, not
    /// copied).
    pub fn keep_blocks(&mut self, blocks: Vec<u64>, ends: Vec<u32>) {
        self.blocks = blocks;
        self.ends = ends;
    }

    /// Response headers: scan the body if it is JSON or an event stream
    /// (and `read_usage` is on).
    pub fn on_headers(&mut self, p: &Plugin, content_type: Option<&[u8]>) {
        if !self.wants_headers(p) {
            return;
        }
        self.scanner = match content_type {
            Some(v) => {
                let has = |n: &[u8]| v.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n));
                if has(b"text/event-stream") {
                    Some(UsageScanner::sse())
                } else if has(b"json") {
                    Some(UsageScanner::new())
                } else {
                    None
                }
            }
            None => None,
        };
    }

    /// Does [`Delivery::on_headers`] need the response's content type?
    pub fn wants_headers(&self, p: &Plugin) -> bool {
        self.primary.is_some() && p.config().read_usage
    }

    /// One response chunk of `size` bytes; `end` on the last one. `view`:
    /// the membership the request was routed on; `served`: the upstream address.
    pub fn on_chunk(
        &mut self,
        p: &Plugin,
        view: Option<&View>,
        size: usize,
        end: bool,
        served: Option<&str>,
    ) {
        if let Some(s) = self.scanner.as_mut() {
            if size > 0 {
                match host::buffer(BUFFER_RESPONSE_BODY, 0, size) {
                    Ok(Some(chunk)) => s.feed(&chunk),
                    Ok(None) => {}
                    Err(e) => log::debug!("cannot read a response chunk: {e}"),
                }
            }
        }
        if end {
            self.finish(p, view, served);
        }
    }

    /// The response ended (or the stream was cut: called again from
    /// `on_log`; only the first call counts). `view`: the membership the
    /// request was routed on; `served`: the upstream address.
    pub fn finish(&mut self, p: &Plugin, view: Option<&View>, served: Option<&str>) {
        let Some(view) = view else { return };
        if self.done || self.primary.is_none() {
            return;
        }
        self.done = true;
        let Some(scanner) = self.scanner.take() else {
            return;
        };
        let d = &p.delivered;
        let usage = scanner.into_usage();
        let served = served
            .and_then(|a| view.position(a.as_bytes()))
            .or(self.primary);
        let served_addr = served.and_then(|s| view.addr(s));
        let elsewhere = served != self.primary;
        // A prediction is about the primary; another host was expected to have nothing.
        let prediction = self.prediction.map(|mut pr| {
            if elsewhere {
                pr.cached_tokens = 0.0;
            }
            pr
        });
        let predicted = prediction.map(|pr| pr.cached_tokens.round().max(0.0) as u64);
        let Some(cached) = usage.cached() else {
            add(d.unreported, 1);
            self.log_field(predicted, None, None, None);
            return;
        };
        if let (true, Some(id), Some(a)) = (self.responses_api, usage.id.as_deref(), served_addr) {
            let now = host::now_nanos() / 1_000_000;
            let r = usize::from(holder_id(a));
            responses::remember(&mut slots::plain(&d.responses_ns), id, r, now);
        }
        let prompt = usage.prompt();
        add(d.responses, 1);
        add(d.cached_tokens, cached);
        add(d.prompt_tokens, prompt.unwrap_or(0));
        add(d.predicted_tokens, predicted.unwrap_or(0));
        let cfg = view.router.affinity_config();
        let hit_tokens = BLOCK_UNITS as f64 / cfg.chars_per_token.max(0.1);
        let surprise = prediction.map_or(Surprise::None, |pr| {
            compare(&pr, cached, prompt, hit_tokens, cfg.min_match)
        });
        if let Some(a) = served_addr {
            d.with_endpoint(a, |e| {
                sample(e.delivered, cached);
                sample(e.predicted, predicted.unwrap_or(0));
                add(e.prompt, prompt.unwrap_or(0));
                match surprise {
                    Surprise::ExpectedHitGotMiss => add(e.hit_got_miss, 1),
                    Surprise::ExpectedMissGotHit => add(e.miss_got_hit, 1),
                    Surprise::None => {}
                }
            });
        }
        match (surprise, served) {
            (Surprise::ExpectedHitGotMiss, Some(r)) => {
                if let (Some(t), true) = (self.entry_time, p.config().eviction_horizons) {
                    d.raise(view, r, t, self.routed_at);
                }
            }
            (Surprise::None, Some(r)) if predicted.unwrap_or(0) as f64 >= hit_tokens => {
                d.hit(view, r)
            }
            _ => {}
        }
        if let (Some(r), false) = (served, self.blocks.is_empty()) {
            let now = host::now_nanos() / 1_000_000;
            let mut slots = p.index_slots();
            // The engine had more of the prefix than the index could show:
            // confirm that depth so the next request sharing it is predicted exactly.
            // Holders are written as address ids through the routing-time view.
            // Blocks are uneven (message boundaries): the whole blocks within
            // the cached characters.
            let cpt = cfg.chars_per_token.max(0.1);
            let confirmed = depth_at(&self.ends, (cached as f64 * cpt) as usize);
            let confirmed_tokens = units_at(&self.ends, confirmed) as f64 / cpt;
            if confirmed_tokens > predicted.unwrap_or(0) as f64 + 0.5 {
                let mut by_addr = AddrSlots::new(&mut slots, view, &[]);
                // The whole request confirmed (the engine's count includes
                // chat-template tokens, so it can reach into the last
                // message): confirm the depth before its last block too,
                // which the next request with another last message shares.
                let n = self.blocks.len();
                let short = (confirmed == n && n > 1).then(|| n - 1);
                for depth in std::iter::once(confirmed).chain(short) {
                    view.router.index().confirm(
                        &mut by_addr,
                        &self.blocks,
                        depth,
                        self.known.as_ref(),
                        r,
                        now,
                    );
                }
            }
            if slots.failures.get() > 0 {
                p.stats.failure(super::stats::HostFailure::SharedData);
            }
        }
        self.log_field(predicted, Some(cached), prompt, Some(surprise.as_str()));
        log::debug!(
            "delivered: branch={} predicted={predicted:?} cached={cached} prompt={prompt:?} surprise={} id={:?}",
            self.branch,
            surprise.as_str(),
            usage.id
        );
    }

    /// Set the access-log field (`branch=… predicted=… delivered=… prompt=…
    /// surprise=…`, `-` for unknown), written into a reused per-VM buffer
    /// with no `format!` (about a thousand wasm instructions less per
    /// response than the formatting machinery).
    fn log_field(
        &self,
        predicted: Option<u64>,
        delivered: Option<u64>,
        prompt: Option<u64>,
        surprise: Option<&str>,
    ) {
        if super::probe::off(super::probe::Ablate::Property) {
            return;
        }
        FIELD.with(|f| {
            let Ok(mut value) = f.try_borrow_mut() else {
                return;
            };
            value.clear();
            value.push_str("branch=");
            value.push_str(self.branch);
            for (name, v) in [
                (" predicted=", predicted),
                (" delivered=", delivered),
                (" prompt=", prompt),
            ] {
                value.push_str(name);
                push_count(&mut value, v);
            }
            value.push_str(" surprise=");
            value.push_str(surprise.unwrap_or("-"));
            if let Err(e) = host::set_property(PROPERTY, &value) {
                log::debug!("cannot set {PROPERTY}: {e}");
            }
        });
    }
}
