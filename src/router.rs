//! The routing facade: configuration + ring, from request to [`Decision`].
//!
//! [`Router::key`] turns what the host saw (body, routing-id header) into a
//! [`RoutingKey`]; [`Router::select`] turns a key and a load picture into a
//! [`Decision`]. Both are pure: the wasm adapter and the simulator call the
//! same two functions and differ only in where loads and tickets come from.

use crate::affinity::{self, AffinityConfig, Choice, Reason};
use crate::config::{Config, Strategy, MAX_ROUTING_ID_LEN};
use crate::cost::{CostConfig, CostModel};
use crate::decision::{Branch, Decision, KeySource};
use crate::extract::{extract, raw_prefix, BodyKind};
use crate::feedback::Horizons;
use crate::hash::{depth_at, mix, seed, units_at, Mixer, BLOCK_UNITS};
use crate::index::{IndexConfig, Known, PrefixIndex, SlotStore};
use crate::pressure::Pressure;
use crate::ring::HashRing;
use crate::select::{bounded, by_ticket, least_request, Bounds, Loads};
use crate::share::Share;
use std::borrow::Cow;

/// What the host knows about the request body.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// No body (GET, empty POST).
    None,
    /// The whole body.
    Complete(&'a [u8]),
    /// The body is larger than `max_body_bytes`; its first bytes.
    Oversize(&'a [u8]),
}

/// Outcome of checking a routing id (header or `prompt_cache_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingId {
    /// None was supplied.
    Absent,
    /// A valid id (≤ 64 printable ASCII characters) was used.
    Used,
    /// An id was supplied but ignored (too long, empty, or not printable ASCII).
    Rejected,
}

/// The key of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKey {
    /// Ring key; `None` when the request has nothing to hash.
    pub key: Option<u64>,
    /// Seeded chained block keys of the prefix (longest-prefix matching).
    pub blocks: Vec<u64>,
    /// Units hashed up to the end of each block ([`crate::hash::PrefixHashes`]'s
    /// `ends`): blocks end at message boundaries, so a depth is converted to
    /// characters with [`RoutingKey::units_at`], never `depth × BLOCK_UNITS`.
    pub ends: Vec<u32>,
    /// Units (characters or bytes) of prefix text hashed.
    pub units: usize,
    /// Where the key came from.
    pub source: KeySource,
    /// What happened to the routing id.
    pub routing_id: RoutingId,
}

impl RoutingKey {
    /// Units covered by the first `depth` blocks (capped by the key).
    pub fn units_at(&self, depth: usize) -> usize {
        units_at(&self.ends, depth)
    }

    /// Whole blocks within the first `units` units (e.g. an engine's cached
    /// tokens × chars per token).
    pub fn depth_at(&self, units: usize) -> usize {
        depth_at(&self.ends, units)
    }
}

/// The prompt size the `affinity` policy and the cost model reason about:
/// the extracted text for the JSON APIs (media, tools and JSON syntax are
/// not prompt text), the body length otherwise. The text is extracted only
/// up to the hashed window (`window`: `prefix_length` characters); when it
/// filled the window the prompt may go on, so the body length stands for
/// it (an upper bound: JSON syntax and escapes count too). Without this a
/// 190 000-token prompt was priced as its first 16 000 tokens
/// ([`crate::affinity::AffinityConfig::beyond_window`]). Cost: O(1).
pub fn prompt_chars(key: &RoutingKey, body_len: usize, window: usize) -> usize {
    match key.source {
        KeySource::Chat | KeySource::Completions | KeySource::Responses if key.units < window => {
            key.units
        }
        // Text that filled the window, or a raw / oversize body: the body.
        _ => key.units.max(body_len),
    }
}

/// A routing id is used only if it is 1–64 printable ASCII characters.
pub fn valid_routing_id(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_ROUTING_ID_LEN && id.iter().all(|b| (0x20..0x7f).contains(b))
}

/// Configuration plus the ring (and, for `affinity`, the index layout and
/// policy parameters) built from it.
#[derive(Debug, Clone)]
pub struct Router {
    config: Config,
    ring: HashRing,
    index: PrefixIndex,
    affinity: AffinityConfig,
}

/// The prefix index's parameters for a validated configuration.
pub fn index_config(config: &Config) -> IndexConfig {
    let a = config.affinity;
    IndexConfig {
        slots: a.index_slots,
        // Peers publishing a coarser ladder: the lookup tolerates it.
        peer_bits: config.peers.as_ref().map_or(0, |p| p.publish_bits),
        mirror_from: (config.prefix_length / BLOCK_UNITS).max(1),
        max_age_ms: u64::from(a.index_ttl_s) * 1000,
        // Several gateways: no end marks. With them the simulator's chat
        // lost 0.2–0.3 points of hit rate at N = 2 and 4 gateways, and sync
        // bytes grew 16–33 % (docs/multi-gateway.md, "Twenty-sixth session").
        end_marks: config.peers.is_none(),
        ..IndexConfig::default()
    }
}

impl Router {
    /// Build the ring for a validated configuration.
    pub fn new(config: Config) -> Router {
        let ring = HashRing::build(&config.endpoints, config.virtual_nodes);
        let a = config.affinity;
        let index = PrefixIndex::new(index_config(&config));
        let affinity = AffinityConfig {
            concurrency_threshold: config.concurrency_threshold,
            load_factor: config.load_factor,
            chars_per_token: a.chars_per_token,
            min_match: a.min_match,
            routing_budget_ms: a.routing_budget_ms,
            max_age_ms: u64::from(a.index_ttl_s) * 1000,
            spread_cold: a.spread_cold,
            share_factor: a.share_factor,
            short_weight: a.short_prefix_weight,
            ..AffinityConfig::default()
        };
        Router {
            config,
            ring,
            index,
            affinity,
        }
    }

    /// The prefix index layout (`affinity`).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// The `affinity` policy parameters.
    pub fn affinity_config(&self) -> &AffinityConfig {
        &self.affinity
    }

    /// The same router with other `affinity` parameters (tests, models).
    pub fn with_affinity_config(mut self, affinity: AffinityConfig) -> Router {
        self.affinity = affinity;
        self
    }

    /// The same router with another index layout (tests, models: the
    /// simulator's `--ours` knobs build the router its policies decide
    /// with). The slot table must be sized for `index.slots`.
    pub fn with_index_config(mut self, index: IndexConfig) -> Router {
        self.index = PrefixIndex::new(index);
        self
    }

    /// Initial prices of the cost model (`affinity`).
    pub fn cost_config(&self) -> CostConfig {
        let a = self.config.affinity;
        CostConfig {
            prefill_ms_per_ktok: a.prefill_ms_per_ktok,
            wait_ms_per_request: a.wait_ms_per_request,
            learn: a.learn_costs,
            ..CostConfig::default()
        }
    }

    /// `affinity`: look the key up in the index, choose, record the choice
    /// at once ([`Router::choose_affinity`] then [`Router::record_affinity`]).
    /// The filter records only after the upstream answered 2xx; tests and
    /// examples that have no response use this.
    #[allow(clippy::too_many_arguments)]
    pub fn select_affinity<S: SlotStore>(
        &self,
        key: &RoutingKey,
        prompt_chars: usize,
        loads: Loads<'_>,
        store: &mut S,
        cost: &CostModel,
        now_ms: u64,
        ticket: u64,
    ) -> (Decision, Choice) {
        let (d, choice, known) =
            self.choose_affinity(key, prompt_chars, loads, store, cost, now_ms, ticket);
        if choice.reason != Reason::NoKey {
            self.record_affinity(store, &key.blocks, known.as_ref(), choice.primary, now_ms);
        }
        (d, choice)
    }

    /// `affinity`: look the key up in the index and choose; nothing is
    /// written. `prompt_chars` is the prompt size ([`prompt_chars`]). Returns
    /// what the lookup found, for [`Router::record_affinity`] once the
    /// upstream has answered. Shared-data cost: the lookup's gets (≈ 1–11).
    #[allow(clippy::too_many_arguments)]
    pub fn choose_affinity<S: SlotStore>(
        &self,
        key: &RoutingKey,
        prompt_chars: usize,
        loads: Loads<'_>,
        store: &S,
        cost: &CostModel,
        now_ms: u64,
        ticket: u64,
    ) -> (Decision, Choice, Option<Known>) {
        self.choose_affinity_fed(
            key,
            prompt_chars,
            loads,
            store,
            cost,
            (now_ms, ticket),
            &Horizons::default(),
            None,
        )
    }

    /// [`Router::choose_affinity`] with the engines' feedback: holders whose
    /// entry is older than their eviction horizon are not holders
    /// ([`crate::feedback`]). The returned lookup keeps an entry left
    /// without holders (its depth is right, its holders were not): passed
    /// to [`Router::record_affinity`], it is rewritten for the served
    /// replica. `at` = (now ms, ticket). `queued`: prompt tokens queued
    /// for prefill per replica ([`crate::affinity::Request::queued_prefill`]).
    /// `loads` says what one count stands for ([`Loads::per_count`]).
    #[allow(clippy::too_many_arguments)]
    pub fn choose_affinity_fed<S: SlotStore>(
        &self,
        key: &RoutingKey,
        prompt_chars: usize,
        loads: Loads<'_>,
        store: &S,
        cost: &CostModel,
        at: (u64, u64),
        horizons: &Horizons,
        queued: Option<&[u32]>,
    ) -> (Decision, Choice, Option<Known>) {
        let (now_ms, ticket) = at;
        let found = self
            .index
            .lookup(store, &key.blocks, now_ms)
            .map(|k| horizons.filter(k));
        let found = self.past_horizon(store, &key.blocks, found, horizons, now_ms);
        let known = found.filter(|k| k.entry.holders().next().is_some());
        let share = self.routed_share(store);
        let pressure = self.placement_pressure(store, key, known.as_ref());
        let request = affinity::Request {
            key,
            prompt_chars,
            known: known.as_ref(),
            loads,
            ticket,
            pressure: pressure.as_ref(),
            share: share.as_ref(),
            queued_prefill: queued,
            shallow: None,
        };
        // The second tier ([`crate::index::PrefixIndex::lookup_shallow`]):
        // ≤ 3 more gets, only when the spill rule asks for it.
        // The pressure of a warm request that the share bound may move:
        // one get, only then.
        let n = self.ring.len();
        let choice = affinity::choose_tiered(
            &self.ring,
            &request,
            cost,
            &self.affinity,
            |deep| {
                self.index
                    .lookup_shallow(store, &key.blocks, deep, now_ms)
                    .map(|k| horizons.filter(k))
            },
            || crate::share::lazy_pressure(store, n, &self.affinity),
        );
        // The record reads the decision from the lookup it is given
        // (`IndexConfig::new_holder_known`).
        let spread = affinity::writes_new_holder(choice.reason, n);
        let found = found.map(|k| k.spilled(spread));
        (self.affinity_decision(key, &choice), choice, found)
    }

    /// A lookup whose deepest entry lost every holder to the eviction
    /// horizons ([`crate::feedback`]): the engine evicted that prefix, but
    /// LRU evicts the deep, rarely used blocks of a prompt before the
    /// shallow, shared ones (a system prompt, a document under other
    /// questions), whose own entries are newer. A shallower entry with a
    /// holder past the horizons ([`crate::index::PrefixIndex::lookup_shallow`],
    /// ≤ 3 gets, only then) is what the request can still find; without one
    /// the emptied entry stays (its record rewrites it for the chosen
    /// replica). Treating the whole prefix as unknown cost the public Mooncake
    /// trace at 7 replicas up to 1.4 points of hit rate (`docs/benchmarks.md`,
    /// "Twelfth session"). Cost: nothing unless the horizons emptied the entry.
    pub fn past_horizon<S: SlotStore>(
        &self,
        store: &S,
        blocks: &[u64],
        found: Option<Known>,
        horizons: &Horizons,
        now_ms: u64,
    ) -> Option<Known> {
        match found {
            Some(k) if k.entry.holders().next().is_none() => self
                .index
                .lookup_shallow(store, blocks, &k, now_ms)
                .map(|s| horizons.filter(s))
                .filter(|s| s.entry.holders().next().is_some())
                .or(Some(k)),
            other => other,
        }
    }

    /// `affinity`: record that `served` holds the prefix `blocks` (`known`:
    /// what the lookup at routing found). The filter calls it when the
    /// upstream answered 2xx, so only requests an engine accepted (and
    /// therefore cached) enter the index. Shared-data cost: ≤ 44 sets (≤ 10 of
    /// them the end marks' search paths, [`crate::index`]) and, with
    /// `merge_record`, one get (the deepest known block read again).
    pub fn record_affinity<S: SlotStore>(
        &self,
        store: &mut S,
        blocks: &[u64],
        known: Option<&Known>,
        served: usize,
        now_ms: u64,
    ) {
        self.index.record(store, blocks, known, served, now_ms);
        self.note_placement(store, known, served);
    }

    /// At routing: a pending record ([`PrefixIndex::record_pending`]) of a
    /// request `choice`, of the blocks [`AffinityConfig::pending_record`]
    /// names (a cold or spilled request all of them, a warm one that
    /// extends its known prefix with `pending_warm` those past it; nothing
    /// for a keyless one or with `record_pending` off), so that the same
    /// new prefix arriving before the response meets it on
    /// `choice.primary`. Returns the sets (≤ `max_writes + 2`: no end mark).
    pub fn record_pending<S: SlotStore>(
        &self,
        store: &mut S,
        blocks: &[u64],
        known: Option<&Known>,
        choice: &Choice,
        now_ms: u64,
    ) -> usize {
        let depth = known.map_or(0, |k| k.depth);
        let Some(which) = self
            .affinity
            .pending_record(choice.reason, depth, blocks.len())
        else {
            return 0;
        };
        let at = (now_ms, self.affinity.max_age_ms);
        self.index
            .record_pending(store, blocks, known, choice.primary, at, which)
    }

    /// [`crate::share::pressure_for`] with this router's configuration.
    pub fn placement_pressure<S: SlotStore>(
        &self,
        store: &S,
        key: &RoutingKey,
        known: Option<&Known>,
    ) -> Option<Pressure> {
        crate::share::pressure_for(store, self.ring.len(), key, known, &self.affinity)
    }

    /// The request-share counters ([`Share::read`], one get for ≤ 10
    /// replicas); `None` with `share_factor` 0.
    pub fn routed_share<S: SlotStore>(&self, store: &S) -> Option<Share> {
        Share::for_config(store, self.ring.len(), &self.affinity)
    }

    /// At routing: count a request for `primary` in the request-share
    /// counters ([`Share::bump`]: one get, one set); nothing with
    /// `share_factor` 0.
    pub fn note_routed<S: SlotStore>(&self, store: &mut S, primary: usize) {
        Share::note(store, self.ring.len(), primary, &self.affinity);
    }

    /// [`Pressure::note`] with this router's configuration.
    pub fn note_placement<S: SlotStore>(
        &self,
        store: &mut S,
        known: Option<&Known>,
        served: usize,
    ) {
        Pressure::note(store, self.ring.len(), known, served, &self.affinity);
    }

    /// Key the index's slot hash with a per-process secret
    /// ([`crate::index`], "Keyed placement").
    pub fn with_index_secret(self, secret: u64) -> Router {
        let index = IndexConfig {
            secret,
            ..self.index.config()
        };
        self.with_index_config(index)
    }

    fn affinity_decision(&self, key: &RoutingKey, c: &Choice) -> Decision {
        let branch = match c.reason {
            Reason::Warm => Branch::Hit,
            Reason::Spill => Branch::Spill,
            Reason::Cold => Branch::Cold,
            Reason::NoKey if key.source == KeySource::Malformed => Branch::BadInput,
            Reason::NoKey => Branch::NoKey,
        };
        Decision {
            primary: c.primary,
            secondary: c.secondary,
            branch,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The ring.
    pub fn ring(&self) -> &HashRing {
        &self.ring
    }

    /// Does this strategy need the body? (`random`, `round_robin` and
    /// `least_request` route at once on headers.)
    pub fn needs_body(&self) -> bool {
        matches!(
            self.config.strategy,
            Strategy::Prefix | Strategy::Session | Strategy::Affinity
        )
    }

    /// Compute the key. `header_id` is the affinity header's value, if the
    /// header is configured and present; it wins over `prompt_cache_key`.
    pub fn key(&self, body: Body<'_>, header_id: Option<&[u8]>) -> RoutingKey {
        self.key_and_model(body, header_id).0
    }

    /// [`Router::key`] and the body's `model` (a LoRA adapter name, maybe),
    /// from the same single pass over the body; borrowed from the body unless
    /// it had escapes (no allocation per request).
    pub fn key_and_model<'b>(
        &self,
        body: Body<'b>,
        header_id: Option<&[u8]>,
    ) -> (RoutingKey, Option<Cow<'b, str>>) {
        let limit = self.config.prefix_length;
        let (source, prefix, model, salt, body_id) = match body {
            Body::None => (KeySource::None, Default::default(), None, None, None),
            Body::Oversize(b) => (
                KeySource::Oversize,
                raw_prefix(b, limit, BLOCK_UNITS),
                None,
                None,
                None,
            ),
            Body::Complete(b) => match extract(b, limit, BLOCK_UNITS) {
                Ok(e) => {
                    let source = match e.kind {
                        BodyKind::Chat => KeySource::Chat,
                        BodyKind::Completions => KeySource::Completions,
                        BodyKind::Responses => KeySource::Responses,
                        BodyKind::Raw => KeySource::Raw,
                    };
                    (source, e.prefix, e.model, e.cache_salt, e.prompt_cache_key)
                }
                Err(_) => (KeySource::Malformed, Default::default(), None, None, None),
            },
        };

        let supplied = header_id.or(body_id.as_deref().map(str::as_bytes));
        let (id, routing_id) = match supplied {
            None => (None, RoutingId::Absent),
            Some(id) if valid_routing_id(id) => (Some(id), RoutingId::Used),
            Some(_) => (None, RoutingId::Rejected),
        };
        let s = seed(&[
            model.as_deref().unwrap_or("").as_bytes(),
            salt.as_deref().unwrap_or("").as_bytes(),
            id.unwrap_or(b""),
        ]);

        if self.config.strategy == Strategy::Session {
            let key = id.map(|i| mix(crate::hash::hash_id(i), s));
            let source = if key.is_some() {
                KeySource::RoutingId
            } else {
                source
            };
            let k = RoutingKey {
                key,
                blocks: Vec::new(),
                ends: Vec::new(),
                units: 0,
                source,
                routing_id,
            };
            return (k, model);
        }
        let mixer = Mixer::new(s);
        let key = prefix.last().map(|h| mixer.mix(h));
        // Seeded in place: the hasher's vector becomes the key's (no copy).
        let mut blocks = prefix.blocks;
        for b in &mut blocks {
            *b = mixer.mix(*b);
        }
        let k = RoutingKey {
            key,
            blocks,
            ends: prefix.ends,
            units: prefix.units,
            source,
            routing_id,
        };
        (k, model)
    }

    /// Choose the replica. `ticket` is a random number (`random`) or a rotating
    /// counter (`round_robin`, least-request tie-breaks). For `affinity` this
    /// is the cold placement only (no index); the filter and the simulator call
    /// [`Router::select_affinity`].
    pub fn select(&self, key: &RoutingKey, loads: Loads<'_>, ticket: u64) -> Decision {
        let n = self.ring.len();
        let bounds = Bounds {
            concurrency_threshold: self.config.concurrency_threshold,
            load_factor: self.config.load_factor,
        };
        match self.config.strategy {
            Strategy::Random => by_ticket(n, loads, ticket, Branch::Random),
            Strategy::RoundRobin => by_ticket(n, loads, ticket, Branch::RoundRobin),
            Strategy::LeastRequest => least_request(n, loads, ticket, Branch::LeastRequest),
            Strategy::Affinity => {
                let cost = CostModel::new(self.cost_config());
                let request = affinity::Request {
                    key,
                    prompt_chars: key.units,
                    known: None,
                    loads,
                    ticket,
                    pressure: None,
                    share: None,
                    queued_prefill: None,
                    shallow: None,
                };
                self.affinity_decision(
                    key,
                    &affinity::choose(&self.ring, &request, &cost, &self.affinity),
                )
            }
            Strategy::Prefix | Strategy::Session => match key.key {
                Some(k) => bounded(&self.ring, k, loads, bounds),
                None if key.source == KeySource::Malformed => {
                    least_request(n, loads, ticket, Branch::BadInput)
                }
                None => least_request(n, loads, ticket, Branch::NoKey),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn router(extra: &str) -> Router {
        let json = format!(
            r#"{{"endpoints":["127.0.0.1:9001","127.0.0.1:9002","127.0.0.1:9003"],"affinity_header":"x-session-id"{extra}}}"#
        );
        Router::new(Config::from_json(json.as_bytes()).unwrap())
    }

    fn chat(system: &str, user: &str, model: &str) -> String {
        format!(
            r#"{{"model":"{model}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}]}}"#
        )
    }

    #[test]
    fn model_and_routing_id_separate_groups() {
        let r = router("");
        let body = chat("sys", "hello", "a");
        let k1 = r.key(Body::Complete(body.as_bytes()), None);
        let k2 = r.key(Body::Complete(chat("sys", "hello", "b").as_bytes()), None);
        let k3 = r.key(Body::Complete(body.as_bytes()), Some(b"tenant-1"));
        let k4 = r.key(Body::Complete(body.as_bytes()), Some(b"tenant-2"));
        assert_ne!(k1.key, k2.key);
        assert_ne!(k3.key, k4.key);
        assert_ne!(k1.key, k3.key);
        assert_eq!(k3.routing_id, RoutingId::Used);
    }

    #[test]
    fn end_marks_are_on_for_one_gateway_and_off_with_peers() {
        assert!(router("").index().config().end_marks);
        let peers = r#","cluster":"llm","admin_cluster":"adm","peers":{"cluster":"p","secret":"0123456789abcdef"}"#;
        assert!(!router(peers).index().config().end_marks);
    }

    #[test]
    fn prompt_cache_key_equals_header() {
        let r = router("");
        let with_field = r#"{"prompt_cache_key":"t1","messages":[{"role":"user","content":"x"}]}"#;
        let plain = r#"{"messages":[{"role":"user","content":"x"}]}"#;
        let a = r.key(Body::Complete(with_field.as_bytes()), None);
        let b = r.key(Body::Complete(plain.as_bytes()), Some(b"t1"));
        assert_eq!(a.key, b.key);
    }

    #[test]
    fn bad_routing_ids_are_ignored_and_reported() {
        let r = router("");
        let body = chat("s", "u", "m");
        let base = r.key(Body::Complete(body.as_bytes()), None);
        for bad in [&b"x".repeat(65)[..], b"", b"caf\xc3\xa9", b"tab\there"] {
            let k = r.key(Body::Complete(body.as_bytes()), Some(bad));
            assert_eq!(k.routing_id, RoutingId::Rejected);
            assert_eq!(k.key, base.key);
        }
        assert!(valid_routing_id(&b"x".repeat(64)));
    }

    #[test]
    fn session_strategy_keys_on_the_id_only() {
        let r = router(r#","strategy":"session""#);
        let a = r.key(
            Body::Complete(chat("s", "one", "m").as_bytes()),
            Some(b"sess-9"),
        );
        let b = r.key(
            Body::Complete(chat("other", "two", "m").as_bytes()),
            Some(b"sess-9"),
        );
        assert_eq!(a.key, b.key);
        assert_eq!(a.source, KeySource::RoutingId);
        let none = r.key(Body::Complete(chat("s", "one", "m").as_bytes()), None);
        assert_eq!(none.key, None);
        let d = r.select(&none, Loads::new(&[0, 0, 0]), 0);
        assert_eq!(d.branch, Branch::NoKey);
    }

    #[test]
    fn fallbacks_are_labelled() {
        let r = router(r#","strategy":"prefix""#);
        let bad = r.key(Body::Complete(b"{\"messages\": [oops"), None);
        assert_eq!(bad.source, KeySource::Malformed);
        assert_eq!(
            r.select(&bad, Loads::new(&[2, 0, 1]), 0),
            Decision {
                primary: 1,
                secondary: Some(2),
                branch: Branch::BadInput
            }
        );
        let none = r.key(Body::None, None);
        assert_eq!(
            r.select(&none, Loads::new(&[0, 0, 0]), 0).branch,
            Branch::NoKey
        );
        let big = r.key(Body::Oversize(&[b'a'; 5000]), None);
        assert_eq!(big.source, KeySource::Oversize);
        assert_eq!(big.units, 2048);
        assert_eq!(
            r.select(&big, Loads::new(&[0, 0, 0]), 0).branch,
            Branch::Hit
        );
    }

    #[test]
    fn prompt_size_is_the_text_not_the_body() {
        let r = router("");
        let image = "A".repeat(100_000);
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{image}"}}}},{{"type":"text","text":"describe"}}]}}],"tools":[{{"type":"function","function":{{"name":"f","description":"{image}"}}}}]}}"#
        );
        let k = r.key(Body::Complete(body.as_bytes()), None);
        let window = r.config().prefix_length;
        assert_eq!(prompt_chars(&k, body.len(), window), "describe".len());
        // Raw and oversize bodies: their length.
        let raw = "plain text ".repeat(10);
        let k = r.key(Body::Complete(raw.as_bytes()), None);
        assert_eq!(prompt_chars(&k, raw.len(), window), raw.len());
        // Text that fills the window: the body stands for the rest.
        let long = "word ".repeat(window / 2);
        let body = format!(r#"{{"messages":[{{"role":"user","content":"{long}"}}]}}"#);
        let k = r.key(Body::Complete(body.as_bytes()), None);
        assert_eq!(k.units, window);
        assert_eq!(prompt_chars(&k, body.len(), window), body.len());
        assert!(prompt_chars(&k, body.len(), window) > window + window / 2);
        // Its last block is mirrored in the index (`IndexConfig::mirror_from`):
        // every key that fills the window has at least that many blocks.
        let from = r.index().config().mirror_from;
        assert!(
            from > 0 && k.blocks.len() >= from,
            "{from} {}",
            k.blocks.len()
        );
        let short = r.key(Body::Complete(raw.as_bytes()), None);
        assert!(short.blocks.len() < from);
    }

    #[test]
    fn strategies_without_key() {
        for (s, b) in [
            ("random", Branch::Random),
            ("round_robin", Branch::RoundRobin),
            ("least_request", Branch::LeastRequest),
        ] {
            let r = router(&format!(r#","strategy":"{s}""#));
            assert!(!r.needs_body());
            let d = r.select(&r.key(Body::None, None), Loads::new(&[0, 0, 0]), 7);
            assert_eq!(d.branch, b);
        }
    }

    /// A router over 8 local endpoints.
    fn eight_replicas() -> Router {
        replicas(8)
    }

    /// A router over `n` (< 100) local endpoints.
    fn replicas(n: usize) -> Router {
        let eps: Vec<String> = (1..=n).map(|i| format!("\"127.0.0.1:90{i:02}\"")).collect();
        let json = format!(r#"{{"endpoints":[{}]}}"#, eps.join(","));
        Router::new(Config::from_json(json.as_bytes()).unwrap())
    }

    /// Question `q` under a 9 600-character system prompt.
    fn hot_prompt_body(q: usize) -> String {
        let system = "You are a meticulous assistant. ".repeat(300);
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {q}"}}]}}"#
        )
    }

    #[test]
    fn a_spill_off_a_hot_prefix_goes_back_to_a_holder_it_dropped() {
        use crate::index::{VecStore, MAX_HOLDERS};
        // The holders, the one they drop, and twice as many others: at 40
        // requests each the holders are over the load bound.
        let n = 3 * MAX_HOLDERS + 1;
        let r = replicas(n);
        let cost = CostModel::new(r.cost_config());
        let body = hot_prompt_body;
        let key = |q: usize| r.key(Body::Complete(body(q).as_bytes()), None);
        let decide = |r: &Router, store: &VecStore, q: usize, loads: &[u32]| {
            let k = key(q);
            r.choose_affinity(&k, body(q).len(), Loads::new(loads), store, &cost, 5000, 1)
        };
        for tier in [true, false] {
            // The queue band off: the holders below must be over every
            // bound (this test is about the second tier).
            let r = r.clone().with_affinity_config(AffinityConfig {
                tier,
                queue_band: 0.0,
                ..*r.affinity_config()
            });
            let mut store = VecStore::new(r.config().affinity.index_slots);
            // The system prompt's first request goes to `x`; MAX_HOLDERS
            // other replicas then take it over, and `x` drops off its entry.
            let (_, c, known) = decide(&r, &store, 0, &vec![0; n]);
            let x = c.primary;
            r.record_affinity(&mut store, &key(0).blocks, known.as_ref(), x, 1000);
            let others: Vec<usize> = (0..n).filter(|&i| i != x).take(MAX_HOLDERS).collect();
            for (q, &h) in others.iter().enumerate() {
                let (_, _, known) = decide(&r, &store, q + 1, &vec![0; n]);
                r.record_affinity(&mut store, &key(q + 1).blocks, known.as_ref(), h, 2000);
            }
            // The holders are over the load bound, `x` is idle.
            let mut loads = vec![0u32; n];
            for &h in &others {
                loads[h] = 40;
            }
            let (_, c, known) = decide(&r, &store, 9, &loads);
            let mut holders: Vec<usize> = known.unwrap().entry.holders().collect();
            holders.sort_unstable();
            assert_eq!(holders, others);
            assert_eq!(c.reason, crate::affinity::Reason::Spill);
            if tier {
                // It still caches most of the prompt: it is the new holder.
                assert_eq!(c.primary, x);
                assert!(c.expected_cached_tokens > 1000.0, "{c:?}");
            } else {
                assert_eq!(c.expected_cached_tokens, 0.0);
            }
        }
    }

    #[test]
    fn a_spill_s_new_holder_is_found_under_its_depth_in_a_fleet_larger_than_the_holder_list() {
        use crate::affinity::Reason;
        use crate::index::{VecStore, MAX_HOLDERS};
        // A system prompt (9 600 characters) with a document under it; then
        // the same system prompt with another document.
        let body = |doc: &str, q: usize| {
            let system = "You are a meticulous assistant. ".repeat(300);
            let text = format!("{} question {q}", doc.repeat(600));
            format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{text}"}}]}}"#
            )
        };
        for n in [MAX_HOLDERS, MAX_HOLDERS + 1, 4 * MAX_HOLDERS] {
            let r = replicas(n);
            let cost = CostModel::new(r.cost_config());
            let mut store = VecStore::new(r.config().affinity.index_slots);
            let decide = |store: &VecStore, b: &str, loads: &[u32]| {
                let k = r.key(Body::Complete(b.as_bytes()), None);
                let (_, c, known) =
                    r.choose_affinity(&k, b.len(), Loads::new(loads), store, &cost, 5000, 1);
                (k, c, known)
            };
            // The first request on the document goes to `x`.
            let first = body("Alpha clause. ", 0);
            let (k, c, known) = decide(&store, &first, &vec![0; n]);
            let x = c.primary;
            r.record_affinity(&mut store, &k.blocks, known.as_ref(), x, 1000);
            // The next one finds `x` over the load bound: a spill to `y`.
            let mut loads = vec![0u32; n];
            loads[x] = 40;
            let next = body("Alpha clause. ", 1);
            let (k, c, known) = decide(&store, &next, &loads);
            let y = c.primary;
            assert!(y != x && c.reason == Reason::Spill, "{n}: {c:?}");
            assert_eq!(
                known.map(|k| k.spill),
                Some(n > MAX_HOLDERS),
                "{n}: the lookup carries the mark"
            );
            r.record_pending(&mut store, &k.blocks, known.as_ref(), &c, 1500);
            r.record_affinity(&mut store, &k.blocks, known.as_ref(), y, 2000);
            // Another document under the same system prompt: the holders of
            // the shared part list `y` first in a fleet larger than the
            // holder list, `x` alone otherwise.
            let other = body("Beta schedule. ", 2);
            let (_, _, shallow) = decide(&store, &other, &vec![0; n]);
            let holders: Vec<usize> = shallow
                .map(|k| k.entry.holders().collect())
                .unwrap_or_default();
            let want = if n > MAX_HOLDERS { vec![y, x] } else { vec![x] };
            assert_eq!(holders, want, "{n} replicas");
        }
    }

    #[test]
    fn a_repeat_waits_for_its_prefix_s_long_prefill_on_a_busy_holder() {
        use crate::affinity::Reason;
        use crate::index::VecStore;
        let r = eight_replicas();
        let cost = CostModel::new(r.cost_config());
        // One 300 000-character document (75 000 tokens, past the hashed
        // window), asked twice; the clock far from 0, as the filter's.
        let doc = "Clause 12 of the agreement applies. ".repeat(8_400);
        let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{doc}"}}]}}"#);
        let key = r.key(Body::Complete(body.as_bytes()), None);
        let t0 = 1_700_000_000_000u64;
        let mut store = VecStore::new(r.config().affinity.index_slots);
        let (_, first, known) =
            r.choose_affinity(&key, body.len(), Loads::new(&[0; 8]), &store, &cost, t0, 1);
        let x = first.primary;
        r.record_pending(&mut store, &key.blocks, known.as_ref(), &first, t0);
        // The repeat: `x` has its prefill queued and 12 more requests, over
        // the load bound; the others 1 request each and nothing queued.
        let mut loads = [1u32; 8];
        loads[x] = 13;
        let mut queued = [0u32; 8];
        queued[x] = 75_000;
        let decide = |after_ms: u64| {
            let (_, c, _) = r.choose_affinity_fed(
                &key,
                body.len(),
                Loads::new(&loads),
                &store,
                &cost,
                (t0 + after_ms, 2),
                &Horizons::default(),
                Some(&queued),
            );
            (c.primary, c.reason)
        };
        // 1 s into it (less than the 2 s budget): moved, as a burst is.
        let (p, reason) = decide(1_000);
        assert!(p != x && reason == Reason::Spill);
        // 3 s into it: kept, a spill would prefill the document again.
        assert_eq!(decide(3_000), (x, Reason::Warm));
    }

    #[test]
    fn a_spill_holder_survives_a_stale_record() {
        use crate::index::VecStore;
        let r = eight_replicas();
        let cost = CostModel::new(r.cost_config());
        let body = hot_prompt_body;
        let key = |q: usize| r.key(Body::Complete(body(q).as_bytes()), None);
        let decide = |store: &VecStore, q: usize, loads: &[u32]| {
            let k = key(q);
            r.choose_affinity(&k, body(q).len(), Loads::new(loads), store, &cost, 5000, 1)
        };
        let mut store = VecStore::new(r.config().affinity.index_slots);
        let (_, c, known) = decide(&store, 0, &[0; 8]);
        let x = c.primary;
        r.record_affinity(&mut store, &key(0).blocks, known.as_ref(), x, 1000);
        // Request 1 is looked up while `x` is the only holder, and answered
        // late; meanwhile `x` is over the bound and request 2 spills to `y`.
        let (_, c1, stale) = decide(&store, 1, &[0; 8]);
        assert_eq!(c1.primary, x);
        let mut loads = [2u32; 8];
        loads[x] = 40;
        let (_, c2, known2) = decide(&store, 2, &loads);
        let y = c2.primary;
        assert!(y != x && c2.reason == crate::affinity::Reason::Spill);
        // The lookup carries the decision to the records (`new_holder_known`).
        assert_eq!(
            (stale.map(|k| k.spill), known2.map(|k| k.spill)),
            (Some(false), Some(true))
        );
        r.record_pending(&mut store, &key(2).blocks, known2.as_ref(), &c2, 1500);
        r.record_affinity(&mut store, &key(2).blocks, known2.as_ref(), y, 2000);
        // Request 1's record, from its stale view (`x` alone), reads the
        // entry again (`merge_record`): `y` stays a holder, behind `x`.
        r.record_affinity(&mut store, &key(1).blocks, stale.as_ref(), x, 2100);
        let (_, _, k3) = decide(&store, 3, &[0; 8]);
        assert_eq!(
            k3.map(|k| k.entry.holders),
            Some(crate::index::pad([Some(x as u16), Some(y as u16), None]))
        );
        // `x` over the bound again, `y` one request above the others: the
        // request goes to `y`, a holder of the main entry (warm, not a
        // spill), expecting the prompt cached.
        loads[y] = 3;
        let (_, c, _) = decide(&store, 3, &loads);
        assert_eq!((c.primary, c.reason), (y, crate::affinity::Reason::Warm));
        assert!(c.expected_cached_tokens > 1000.0, "{c:?}");
    }

    #[test]
    fn affinity_follows_a_growing_conversation() {
        use crate::index::VecStore;
        let r = router("");
        assert_eq!(r.config().strategy, Strategy::Affinity);
        let mut store = VecStore::new(r.config().affinity.index_slots);
        let cost = CostModel::new(r.cost_config());
        // A conversation whose history grows each turn: every turn's full key
        // differs, but the index knows the earlier turns' blocks.
        let system = "You are a meticulous assistant. ".repeat(40);
        let mut messages = vec![format!(r#"{{"role":"system","content":"{system}"}}"#)];
        let mut first = None;
        for turn in 0..6 {
            messages.push(format!(
                r#"{{"role":"user","content":"question {turn}: {}"}}"#,
                "why? ".repeat(60)
            ));
            let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
            let key = r.key(Body::Complete(body.as_bytes()), None);
            // Other traffic keeps the loads uneven but within bounds.
            let loads = [1, 0, 2];
            let (d, _) = r.select_affinity(
                &key,
                body.len(),
                Loads::new(&loads),
                &mut store,
                &cost,
                1000 * turn,
                turn,
            );
            match first {
                None => {
                    assert_eq!(d.branch, Branch::Cold);
                    first = Some(d.primary);
                }
                Some(p) => {
                    assert_eq!(d.branch, Branch::Hit, "turn {turn}");
                    assert_eq!(d.primary, p, "turn {turn} left the warm replica");
                }
            }
            messages.push(format!(
                r#"{{"role":"assistant","content":"answer {turn} {}"}}"#,
                "because. ".repeat(50)
            ));
        }
        // Malformed bodies and bodies without text are labelled, not recorded.
        let bad = r.key(Body::Complete(b"{oops"), None);
        let (d, _) = r.select_affinity(&bad, 5, Loads::new(&[0, 0, 0]), &mut store, &cost, 9000, 1);
        assert_eq!(d.branch, Branch::BadInput);
        let none = r.key(Body::None, None);
        assert_eq!(
            r.select(&none, Loads::new(&[0, 0, 0]), 0).branch,
            Branch::NoKey
        );
    }
}
