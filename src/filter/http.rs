//! Per-request context.
//!
//! Lifecycle: `on_http_request_headers` removes any client-supplied target
//! header, then routes at once when no body follows (or the strategy does not
//! read bodies), else pauses; `on_http_request_body` keeps buffering until end
//! of stream (or until `max_body_bytes` is exceeded: then it routes on the raw
//! first bytes and lets the rest stream) and reads the buffered body once;
//! `on_http_request_trailers` routes if the body never signalled end of stream;
//! `on_http_response_headers` moves the in-flight count if a retry or the
//! fallback used another host, and notes whether the response streams;
//! `on_http_response_body` (first chunk of a stream) teaches the `affinity`
//! cost model the observed time to first token, without buffering anything;
//! `on_log` releases the in-flight count exactly once, whatever happened.
//!
//! The shared-data side of that lifecycle (the picture a request is routed
//! on, taking, moving and releasing its count by address, the passive-health
//! verdict) is [`crate::cluster::request`], tested natively; this file adds
//! the host calls, headers and stats.
//!
//! Hostile traffic: a request that carries an `Upgrade` header or is a
//! `CONNECT` routes at once without pausing (its "body" is a tunnel that
//! never ends). `affinity` looks the index up at routing but records the
//! prefix only when the upstream answered 2xx and the request was on one of
//! the configured API `paths` (see [`crate::paths`]), for the host that
//! actually served it; the cost model learns only from responses of the
//! primary (a retry elsewhere says nothing about the primary's queue).

use super::delivered::Delivery;
use super::host::{self, HostShared, BUFFER_REQUEST_BODY};
use super::probe::{self, Ablate, Phase};
use super::root::Plugin;
use super::stats::HostFailure;
use crate::cluster::queued::Queued;
use crate::cluster::request::{picture_into, Joined, Picture, Slot};
use crate::cluster::shared::MAX_CAS_ATTEMPTS;
use crate::cluster::view::{AddrSlots, View};
use crate::config::{Strategy, DEFAULT_TARGET_HEADER};
use crate::decision::{Branch, Decision, KeySource};
use crate::hash::hash_id;
use crate::header_pairs;
use crate::index::{refresh_skip_ms, Known};
use crate::peers_log::Publishing;
use crate::router::{prompt_chars, Body, RoutingId, RoutingKey};
use crate::select::Loads;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::cell::Cell;
use std::rc::Rc;

thread_local! {
    /// Per-VM rotating ticket for least-request tie-breaks.
    static TICKET: Cell<u64> = const { Cell::new(0) };
    /// The target header's value, rebuilt per request (kept capacity).
    static TARGET: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The `upstream.address` property path (segments NUL-separated).
const UPSTREAM_ADDRESS: &str = "upstream\0address";

/// A record to write after a 2xx: the block keys, what the lookup knew, and
/// (characters hashed, characters beyond the known depth) for the peers' news.
type PendingRecord = (Vec<u64>, Option<Known>, (usize, usize));

/// One request.
pub struct RouterHttp {
    plugin: Option<Rc<Plugin>>,
    context_id: u32,
    /// The primary and the in-flight count held, by address.
    slot: Slot,
    /// The membership view the request was routed on (index positions).
    view: Option<Rc<View>>,
    /// `affinity`: the request is on a configured API path (may be recorded).
    api_path: bool,
    /// `affinity`: the prefix to record once the upstream answered 2xx.
    pending_record: Option<PendingRecord>,
    /// The request has been routed (headers set).
    routed: bool,
    /// Host time of the routing decision, ms.
    routed_at_ms: u64,
    /// `affinity`: (expected uncached tokens, in-flight at routing), waiting
    /// for the first token of a streamed response to teach the cost model.
    pending_cost: Option<(f64, f64)>,
    /// This request's tokens in the queued-prefill count (`cluster::queued`).
    queued: Queued,
    /// The response is a server-sent-event stream.
    streaming: bool,
    /// Host time of a stream's first token, ms, until its end teaches the
    /// cost model the run time ([`crate::cost::CostModel::observe_run`]).
    first_token_ms: Option<u64>,
    /// A 2xx event stream's record, waiting for its first body byte (the
    /// first token: the prefill is done and cached), with the host that
    /// served it. Streaming servers (vLLM, SGLang, the emulator) send their
    /// headers before the prefill; recorded then, the entry would stop
    /// being *pending* while its prefill still runs
    /// ([`crate::affinity`], "Pending prefix").
    deferred_record: Option<Option<String>>,
    /// `upstream.address` as read at response headers (final: a response that
    /// has started is never retried), so `on_log` need not read it again.
    upstream: Option<String>,
    /// Predicted vs delivered cached tokens.
    delivery: Delivery,
    /// Counts this context among the VM's live requests (metric batching).
    _live: super::batch::Live,
}

fn next_local_ticket() -> u64 {
    TICKET.with(|t| {
        let v = t.get().wrapping_add(1);
        t.set(v);
        v
    })
}

impl RouterHttp {
    /// A context; `plugin` is `None` only if configuration failed (pass-through).
    pub fn new(plugin: Option<Rc<Plugin>>, context_id: u32) -> RouterHttp {
        RouterHttp {
            plugin,
            context_id,
            slot: Slot::default(),
            view: None,
            api_path: false,
            pending_record: None,
            routed: false,
            routed_at_ms: 0,
            pending_cost: None,
            queued: Queued::default(),
            streaming: false,
            first_token_ms: None,
            deferred_record: None,
            upstream: None,
            delivery: Delivery::default(),
            _live: super::batch::Live::new(),
        }
    }

    fn ticket(&self, p: &Plugin) -> u64 {
        match p.config().strategy {
            Strategy::Random => {
                hash_id(&(host::now_nanos() ^ u64::from(self.context_id) << 32).to_le_bytes())
            }
            Strategy::RoundRobin => self.shared_ticket(p),
            _ => next_local_ticket(),
        }
    }

    /// A cluster-wide rotating counter (CAS increment in shared data).
    fn shared_ticket(&self, p: &Plugin) -> u64 {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let (value, cas) = match host::shared_get(&p.rr_key) {
                Ok(v) => v,
                Err(_) => break,
            };
            let cur = value
                .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                .map_or(0, u64::from_le_bytes);
            if host::shared_set(&p.rr_key, &cur.wrapping_add(1).to_le_bytes(), cas).is_ok() {
                return cur;
            }
        }
        p.stats.failure(HostFailure::SharedData);
        next_local_ticket()
    }

    /// Route with what is known of the body (`body_len`: its size); sets
    /// the headers and takes an in-flight slot. Called at most once per request.
    fn route(&mut self, body: Body<'_>, body_len: usize) {
        let Some(p) = self.plugin.clone() else { return };
        self.routed = true;
        if probe::off(Ablate::Route) {
            return;
        }
        let t = probe::start();
        let view = p.follower.current(&HostShared, &p.keys);
        if p.stats_generation.replace(view.generation) != view.generation {
            p.stats.members(view.endpoints());
        }
        if view.endpoints().is_empty() {
            // No membership yet (discovery before the first poll, no bootstrap
            // endpoints): leave the target unset, Envoy's fallback policy picks.
            p.stats.no_members();
            return;
        }
        let cfg = p.config();
        let header_id = match &cfg.affinity_header {
            Some(h) => match host::request_header(h) {
                Ok(v) => v,
                Err(e) => {
                    log::warn!("#{} cannot read {h}: {e}", self.context_id);
                    p.stats.failure(HostFailure::Header);
                    None
                }
            },
            None => None,
        };
        let body = if probe::off(Ablate::Key) {
            Body::None
        } else {
            body
        };
        let (key, model) = view.router.key_and_model(body, header_id.as_deref());
        probe::end(Phase::Key, t);
        let t = probe::start();
        self.routed_at_ms = host::now_nanos() / 1_000_000;
        // The VM's spare picture (its vectors reused), given back at the end.
        let mut pic = super::local::LOCAL.with(|local| {
            let mut pic = local.spare.take();
            picture_into(
                &HostShared,
                &p.keys,
                &view,
                cfg,
                model.as_deref(),
                self.routed_at_ms,
                local,
                &mut pic,
            );
            pic
        });
        if pic.failures > 0 {
            p.stats.failure(HostFailure::SharedData);
        }
        probe::end(Phase::Picture, t);
        let t = probe::start();
        if let Some(e) = &pic.engine {
            p.stats.engine_effect(e);
        }
        let ticket = self.ticket(&p);
        let l = Loads::with_available(&pic.loads, &pic.usable);

        let pinned = match body {
            Body::Complete(b) if key.source == KeySource::Responses => {
                self.delivery.responses_api();
                p.delivered
                    .pinned(b, self.routed_at_ms, &view)
                    .filter(|&r| pic.usable.get(r).copied().unwrap_or(false))
            }
            _ => None,
        };
        let mut joined = Joined::default();
        let decision = if let Some(r) = pinned {
            // The replica that stores the previous response (vLLM: per instance).
            Decision {
                primary: r,
                secondary: None,
                branch: Branch::Hit,
            }
        } else if cfg.strategy == Strategy::Affinity {
            let chars = prompt_chars(&key, body_len, cfg.prefix_length);
            let mut d = self.select_affinity(&p, &view, &key, chars, &pic, ticket);
            // Counted in the request share by the take ([`crate::share`]).
            joined.share = cfg.affinity.share_factor > 0.0;
            // Retry where the primary's prefixes go if it is dead.
            d.secondary = view.takeover(d.primary, &pic.usable).or(d.secondary);
            d
        } else {
            view.router.select(&key, l, ticket)
        };
        probe::end(Phase::Select, t);
        let t = probe::start();
        let primary = view.addr(decision.primary).unwrap_or_default();
        // Its expected prefill joins the primary's queue until the first
        // byte: in the take's update, as is the request-share count.
        if let Some((uncached, _)) = self.pending_cost {
            joined.queued_tokens = uncached.clamp(0.0, f64::from(u32::MAX)) as u32;
        }
        // Counted in this VM's waiting changes (no host call); written with
        // the picture's read once the oldest change is `PUBLISH_MS` old (else
        // by the tick, or at the end if the VM goes idle: a request that ends
        // first is never written, `cluster::request::Releases`).
        let due = super::local::LOCAL.with(|local| {
            self.slot
                .take_later(primary, &local.releases, joined, self.routed_at_ms);
            local.releases.due(self.routed_at_ms)
        });
        self.queued.joined(primary, joined.queued_tokens);
        if due {
            super::local::flush_releases_seen(&p, pic.snapshot.take());
        }
        super::local::LOCAL.with(|local| local.spare.replace(pic));
        self.delivery
            .routed(decision.branch.as_str(), decision.primary);
        probe::end(Phase::Take, t);
        let t = probe::start();
        self.set_headers(&p, &view, decision);
        probe::end(Phase::SetHeaders, t);
        let t = probe::start();
        self.view = Some(view.clone());
        p.stats.decision(decision.branch, key.source, primary);
        if key.routing_id == RoutingId::Rejected {
            p.stats.routing_id_rejected();
        }
        log::debug!(
            "#{} key={:016x} source={} units={} blocks={} branch={} primary={} secondary={} generation={}",
            self.context_id,
            key.key.unwrap_or(0),
            key.source.as_str(),
            key.units,
            key.blocks.len(),
            decision.branch.as_str(),
            primary,
            decision
                .secondary
                .and_then(|s| view.addr(s))
                .unwrap_or("-"),
            view.generation,
        );
        if cfg.strategy == Strategy::Affinity && self.api_path {
            // Confirmed depths are written for API paths only, like the record.
            match self.pending_record.as_mut() {
                // The record holds the blocks until it is written, then
                // hands them to the delivery (no copy).
                Some(r) => {
                    r.0 = key.blocks;
                    self.delivery.keep_blocks(Vec::new(), key.ends);
                }
                None => self.delivery.keep_blocks(key.blocks, key.ends),
            }
        }
        probe::end(Phase::RouteRest, t);
    }

    /// `affinity`: index lookup + choice + record over shared data; index
    /// holders are kept as address ids ([`AddrSlots`]). The loads, queued
    /// tokens and share counts come from the picture (one get for all).
    fn select_affinity(
        &mut self,
        p: &Plugin,
        view: &View,
        key: &RoutingKey,
        prompt_chars: usize,
        pic: &Picture,
        ticket: u64,
    ) -> Decision {
        let loads = Loads::with_available(&pic.loads, &pic.usable);
        // The VM is single-threaded, so the cost model is never borrowed twice;
        // if it somehow were, use the configured prices rather than panic.
        let fallback;
        let cost = match p.cost.try_borrow() {
            Ok(c) => c,
            Err(_) => {
                fallback =
                    std::cell::RefCell::new(crate::cost::CostModel::new(view.router.cost_config()));
                match fallback.try_borrow() {
                    Ok(c) => c,
                    Err(_) => return view.router.select(key, loads, ticket),
                }
            }
        };
        let mut slots = p.index_slots();
        // With the share bound on, its counts are the picture's (none if
        // the read failed: no bound for this request), never a slot get.
        let shares = (view.router.affinity_config().share_factor > 0.0)
            .then(|| pic.shares.as_deref().unwrap_or(&[]));
        // Issue 11: plus the peers' queued tokens (`peers.share_queued`).
        let with_peers = pic
            .queued
            .as_deref()
            .and_then(|q| super::peers::with_peer_queues(p, view, q, self.routed_at_ms));
        let queued = with_peers.as_deref().or(pic.queued.as_deref());
        let load_scale = super::peers::load_scale(p, self.routed_at_ms);
        let (d, choice, known) = {
            let mut by_addr = AddrSlots::new(&mut slots, view, &pic.usable).with_shares(shares);
            let chosen = p.delivered.with_horizons(self.routed_at_ms, view, |h| {
                view.router.choose_affinity_fed(
                    key,
                    prompt_chars,
                    loads.scaled(load_scale),
                    &by_addr,
                    &cost,
                    (self.routed_at_ms, ticket),
                    h,
                    queued,
                )
            });
            // A new placement is written at once as pending (the 2xx record
            // confirms it), so a burst of the same new prefix meets on it.
            if self.api_path {
                let (_, c, k) = &chosen;
                let t = self.routed_at_ms;
                view.router
                    .record_pending(&mut by_addr, &key.blocks, k.as_ref(), c, t);
            }
            // The request-share count is bumped by the take (`Joined::share`).
            chosen
        };
        // Blocks are uneven (they end at message boundaries): the block after
        // the known depth, in tokens.
        let depth = known.as_ref().map_or(0, |k| k.depth);
        let next_units = key.units_at(depth + 1).saturating_sub(key.units_at(depth));
        let block_tokens = next_units as f64 / view.router.affinity_config().chars_per_token;
        self.delivery.predicted_from(
            &choice,
            known.as_ref(),
            key.blocks.len(),
            block_tokens,
            self.routed_at_ms,
        );
        if slots.failures.get() > 0 {
            p.stats.failure(HostFailure::SharedData);
        }
        if self.api_path && choice.reason != crate::affinity::Reason::NoKey {
            let new_chars = key.units.saturating_sub(key.units_at(depth));
            // The blocks join it in `route` (moved, not copied).
            self.pending_record = Some((Vec::new(), known, (key.units, new_chars)));
        }
        let in_flight = loads.of(d.primary);
        self.pending_cost = Some((choice.expected_uncached_tokens(), f64::from(in_flight)));
        d
    }

    /// Take this request's tokens off the queued-prefill count (once), in
    /// the VM's waiting changes ([`Queued::finish_later`]): written with the
    /// next in-flight write (≤ `Releases::PUBLISH_MS` under load; never,
    /// if the request's own take was not written yet: they net to 0).
    fn finish_queued(&mut self) {
        super::local::LOCAL.with(|local| self.queued.finish_later(&local.releases));
    }

    fn set_headers(&self, p: &Plugin, view: &View, d: Decision) {
        TARGET.with(|t| match t.try_borrow_mut() {
            Ok(mut target) => self.set_headers_with(p, view, d, &mut target),
            Err(_) => self.set_headers_with(p, view, d, &mut String::new()),
        });
    }

    /// [`RouterHttp::set_headers`] writing the target value into `target`
    /// (a per-VM buffer: no allocation in steady state).
    fn set_headers_with(&self, p: &Plugin, view: &View, d: Decision, target: &mut String) {
        let cfg = p.config();
        target.clear();
        target.push_str(view.addr(d.primary).unwrap_or_default());
        if let Some(s) = d.secondary.and_then(|s| view.addr(s)) {
            target.push(',');
            target.push_str(s);
        }
        for (name, value) in [
            (cfg.target_header.as_str(), target.as_str()),
            (cfg.decision_header.as_str(), d.branch.as_str()),
        ] {
            if name.is_empty() {
                continue; // `decision_header: ""`: not sent
            }
            if (name == cfg.target_header && probe::off(Ablate::Target))
                || (name == cfg.decision_header && probe::off(Ablate::Decision))
            {
                continue;
            }
            if let Err(e) = host::set_request_header(name, value) {
                log::warn!("#{} cannot set {name}: {e}", self.context_id);
                p.stats.failure(HostFailure::Header);
            }
        }
    }

    /// Read `len` bytes of the buffered body.
    fn body(&self, len: usize) -> Option<Vec<u8>> {
        match host::buffer(BUFFER_REQUEST_BODY, 0, len) {
            Ok(b) => b,
            Err(e) => {
                log::warn!("#{} cannot read the request body: {e}", self.context_id);
                if let Some(p) = &self.plugin {
                    p.stats.failure(HostFailure::Body);
                }
                None
            }
        }
    }

    fn route_buffered(&mut self, size: usize) {
        let t = probe::start();
        let body = self.body(size);
        probe::end(Phase::Body, t);
        match body {
            Some(b) => self.route(Body::Complete(&b), b.len()),
            None => self.route(Body::None, 0),
        }
    }

    /// `affinity`: the upstream answered; record the prefix for the host that
    /// served it (`served`, else the primary) if the answer was `accepted`
    /// (a 2xx `:status`: an engine that accepted the prompt has it cached;
    /// an event stream is recorded at its first body byte). At most once
    /// per request.
    /// Holders are written as address ids through the routing-time view.
    fn record_if_accepted(&mut self, p: &Plugin, served: Option<&str>, accepted: bool) {
        let Some((blocks, known, chars)) = self.pending_record.take() else {
            return;
        };
        self.record_blocks(p, served, accepted, &blocks, known, chars);
        self.delivery.hand_blocks(blocks);
    }

    /// [`RouterHttp::record_if_accepted`] of `blocks` (what the lookup
    /// knew: `known`; characters hashed and new: `chars`).
    fn record_blocks(
        &mut self,
        p: &Plugin,
        served: Option<&str>,
        accepted: bool,
        blocks: &[u64],
        known: Option<Known>,
        chars: (usize, usize),
    ) {
        let Some(view) = self.view.clone().filter(|_| accepted) else {
            return;
        };
        let Some(served) = served
            .or(self.slot.primary.as_deref())
            .and_then(|a| view.position(a.as_bytes()))
        else {
            return;
        };
        let now_ms = host::now_nanos() / 1_000_000;
        // A warm repeat on its front holder, recorded less than the bound
        // ago, would only refresh the entry's time: no set.
        let publish_ms = p.config().peers.as_ref();
        let publish_ms = publish_ms.map(|c| u64::from(c.refresh_publish_s) * 1000);
        let fresh_ms = refresh_skip_ms(view.router.affinity_config().max_age_ms, publish_ms);
        let index = view.router.index();
        if index.record_unneeded(blocks, known.as_ref(), served, (now_ms, fresh_ms)) {
            return;
        }
        let mut slots = p.index_slots();
        {
            // With `peers`, the news among the writes is published (address ids).
            let rule = super::peers::news_rule(p);
            let mut publishing = Publishing::with_rule(&mut slots, rule, p.peers.is_some());
            if let Some(c) = p.config().peers.as_ref() {
                let depth = known.as_ref().map_or(0, |k| k.depth);
                publishing.withhold(index, blocks, depth, super::peers::peer_ladder(c, index));
            }
            {
                let mut by_addr = AddrSlots::new(&mut publishing, &view, &[]);
                view.router
                    .record_affinity(&mut by_addr, blocks, known.as_ref(), served, now_ms);
            }
            let moved = known
                .as_ref()
                .is_some_and(|k| k.entry.holders().next() != Some(served));
            super::peers::publish(p, &publishing, chars, moved);
        }
        if slots.failures.get() > 0 {
            p.stats.failure(HostFailure::SharedData);
        }
    }

    /// The host that actually serves the request (after retries / fallback),
    /// read once and remembered.
    /// The host call and the decoding happen once per request; later
    /// callbacks (every response chunk, `on_log`) borrow `self.upstream`.
    fn load_upstream(&mut self) {
        if self.upstream.is_none() {
            self.upstream = host::property_path(UPSTREAM_ADDRESS)
                .ok()
                .flatten()
                .map(|a| {
                    String::from_utf8(a)
                        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
                });
        }
    }
}

/// Does the request open a tunnel (`Upgrade:` header, e.g. WebSocket, or
/// `CONNECT`)? Its stream never ends, so the filter must not wait for a body.
/// `headers`: the serialised request headers ([`header_pairs`]; empty if
/// they could not be read: "no", the request then pauses as usual).
fn is_tunnel(headers: &[u8]) -> bool {
    header_pairs::value(headers, b"upgrade").is_some_and(|v| !v.is_empty())
        || header_pairs::value(headers, b":method")
            .is_some_and(|m| m.eq_ignore_ascii_case(b"CONNECT"))
}

impl Context for RouterHttp {}

impl HttpContext for RouterHttp {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let t = probe::start();
        let a = self.request_headers(end_of_stream);
        probe::end(Phase::Headers, t);
        a
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.request_body(size, end_of_stream)
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        if !self.routed {
            // The body never signalled end of stream; it is complete now.
            let size = self
                .plugin
                .as_ref()
                .map_or(0, |p| p.config().max_body_bytes);
            self.route_buffered(size);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if probe::off(Ablate::Response) {
            return Action::Continue;
        }
        let t = probe::start();
        self.response_headers();
        probe::end(Phase::RespHeaders, t);
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if probe::off(Ablate::Response) {
            return Action::Continue;
        }
        let t = probe::start();
        self.response_body(size, end_of_stream);
        probe::end(Phase::RespBody, t);
        Action::Continue
    }

    fn on_log(&mut self) {
        let t = probe::start();
        self.log_end();
        if !probe::off(Ablate::IdleFlush) {
            super::batch::flush_at_request_end();
        }
        probe::end(Phase::Log, t);
        probe::request_done();
        if log::log_enabled!(log::Level::Debug) {
            // After the request's last host call (the debug line is not counted).
            log::debug!(
                "#{} host calls: {}",
                self.context_id,
                super::tally::take_line()
            );
        }
    }
}

impl RouterHttp {
    fn request_headers(&mut self, end_of_stream: bool) -> Action {
        // Never trust a client-supplied target: it is removed before anything
        // else, so even a request that ends up unrouted cannot pick its host.
        // One host call for every header read here (the client's target, the
        // peers' sync path, `upgrade`, `:method`, `:path`), made only when one
        // is needed; the remove is made only if the client sent the target
        // (or the headers could not be read).
        let target = self
            .plugin
            .as_ref()
            .map_or(DEFAULT_TARGET_HEADER, |p| p.config().target_header.as_str());
        let needs_body = !end_of_stream && self.plugin.as_ref().is_some_and(|p| p.needs_body());
        let wants_headers = needs_body || self.plugin.as_ref().is_some_and(|p| p.peers.is_some());
        let headers = if wants_headers {
            host::request_headers().ok().flatten()
        } else {
            None
        };
        if headers.as_deref().map_or(true, |h| {
            header_pairs::value(h, target.as_bytes()).is_some()
        }) {
            if let Err(e) = host::remove_request_header(target) {
                log::warn!("#{} cannot remove {target}: {e}", self.context_id);
            }
        }
        let headers = headers.unwrap_or_default();
        // The peers' sync path is answered here, never routed.
        if let Some(p) = self.plugin.as_ref().filter(|p| p.peers.is_some()) {
            if super::peers::intercept(p, &headers) {
                return Action::Pause;
            }
        }
        if !needs_body || is_tunnel(&headers) {
            self.route(Body::None, 0);
            return Action::Continue;
        }
        if let Some(p) = self
            .plugin
            .as_ref()
            .filter(|p| p.config().strategy == Strategy::Affinity)
        {
            self.api_path = header_pairs::value(&headers, b":path")
                .is_some_and(|path| crate::paths::is_api_path(&p.config().paths, path));
        }
        Action::Pause
    }

    fn request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.routed {
            return Action::Continue;
        }
        let Some(p) = self.plugin.clone() else {
            return Action::Continue;
        };
        let cfg = p.config();
        if size > cfg.max_body_bytes {
            // Too large to parse: route on the raw first bytes now and stream the rest.
            match self.body(cfg.prefix_length.min(size)) {
                Some(b) => self.route(Body::Oversize(&b), size),
                None => self.route(Body::None, 0),
            }
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.route_buffered(size);
        Action::Continue
    }

    fn response_headers(&mut self) {
        let Some(p) = self.plugin.clone() else {
            return;
        };
        self.load_upstream();
        // Taken out for the calls below (which borrow `self`), put back at the end.
        let upstream = self.upstream.take();
        if upstream.is_some() && upstream != self.slot.primary {
            // Another host's time to first token says nothing about the primary.
            self.pending_cost = None;
        }
        // One host call for the headers read here (`:status`, `content-type`),
        // only if one of them is needed.
        let wants_type = self.pending_cost.is_some() || self.delivery.wants_headers(&p);
        let wants_status =
            self.pending_record.is_some() || (upstream.is_none() && self.slot.primary.is_some());
        let headers = if wants_type || wants_status {
            host::response_headers().ok().flatten()
        } else {
            None
        };
        let header = |name: &[u8]| {
            headers
                .as_deref()
                .and_then(|m| header_pairs::value(m, name))
        };
        let status = header(b":status");
        let accepted = status.is_some_and(|s| s.first() == Some(&b'2'));
        let ct = header(b"content-type");
        let stream = ct.is_some_and(is_event_stream);
        if stream && accepted && self.pending_record.is_some() {
            self.deferred_record = Some(upstream.clone());
        } else {
            self.record_if_accepted(&p, upstream.as_deref(), accepted);
        }
        // Passive health: the primary did not serve (a retry or the fallback
        // used another host, or no host was reached): mark it down for every
        // worker until a poll shows it recovered.
        super::health::check_primary(&p, &self.slot, upstream.as_deref(), status);
        // A retry or the fallback used another host: count the request there.
        if let Some(actual) = upstream.as_deref() {
            super::local::LOCAL.with(|local| self.slot.moved_later(actual, &local.releases));
        }
        self.upstream = upstream;
        // One read of the content type serves the usage scanner, the cost
        // model and the deferred record.
        self.delivery.on_headers(&p, ct);
        if self.pending_cost.is_some() {
            self.streaming = stream;
        }
    }

    fn response_body(&mut self, size: usize, end_of_stream: bool) {
        if let Some(p) = self.plugin.clone() {
            // The first response byte (a stream's first token; a streaming
            // server may send its headers before any token): the prefill
            // is done.
            if size > 0 || end_of_stream {
                self.finish_queued();
            }
            // The stream's first token: its record, deferred at the headers.
            if size > 0 {
                if let Some(served) = self.deferred_record.take() {
                    self.record_if_accepted(&p, served.as_deref(), true);
                }
            }
            self.load_upstream();
            self.delivery.on_chunk(
                &p,
                self.view.as_deref(),
                size,
                end_of_stream,
                self.upstream.as_deref(),
            );
        }
        // First chunk of a stream = first token: teach the cost model. Nothing
        // is buffered (buffering SSE would destroy the client's TTFT).
        if self.streaming && size > 0 {
            if let (Some(p), Some((uncached, in_flight))) = (&self.plugin, self.pending_cost.take())
            {
                let now_ms = host::now_nanos() / 1_000_000;
                let ttft_ms = now_ms.saturating_sub(self.routed_at_ms) as f64;
                self.first_token_ms = Some(now_ms);
                if let Ok(mut cost) = p.cost.try_borrow_mut() {
                    cost.observe(uncached, in_flight, ttft_ms);
                    let (prefill, wait) = cost.prices();
                    p.stats.prices(prefill, wait);
                }
            }
        }
    }
}

/// Is a `content-type` value `text/event-stream` (any case, any parameters)?
fn is_event_stream(v: &[u8]) -> bool {
    v.windows(17)
        .any(|w| w.eq_ignore_ascii_case(b"text/event-stream"))
}

impl RouterHttp {
    /// `on_log`: the response-end bookkeeping and the in-flight release.
    fn log_end(&mut self) {
        let Some(p) = self.plugin.clone() else { return };
        // A stream that ended before its first token is not recorded (the
        // engine did not finish the prefill).
        self.deferred_record = None;
        // No body byte came (an error, a reset): written with the release.
        self.finish_queued();
        // A stream's first token to its end: the time it held a sequence
        // slot on the engine (its decode), for the slot wait.
        if let Some(t0) = self.first_token_ms.take() {
            let run_ms = (host::now_nanos() / 1_000_000).saturating_sub(t0) as f64;
            if let Ok(mut cost) = p.cost.try_borrow_mut() {
                cost.observe_run(run_ms);
                p.stats.run_time(cost.run_ms());
            }
        }
        self.load_upstream();
        self.delivery
            .finish(&p, self.view.as_deref(), self.upstream.as_deref());
        // The release waits in the VM's changes while other requests of the
        // VM are live (written within `PUBLISH_MS`); a request that leaves
        // the VM idle writes the net of every waiting change at once
        // (`local.rs`), which is nothing when its own take was never
        // written: at rest other workers see exact counts (left waiting,
        // e2e `safety::huge_body_is_routed_on_its_raw_prefix` saw a cold
        // placement move off its ring owner).
        if !super::local::LOCAL.with(|local| self.slot.release_later(&local.releases)) {
            return;
        }
        if !super::batch::others_live() && !probe::off(Ablate::IdleFlush) {
            super::local::flush_releases(&p);
        }
        // The primary was decided at routing; count requests another host served.
        if let (Some(addr), Some(primary)) =
            (self.upstream.as_deref(), self.slot.primary.as_deref())
        {
            if addr != primary {
                p.stats.upstream_mismatch();
            }
        }
    }
}
