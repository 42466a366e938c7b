//! Plugin configuration: JSON (the Wasm `configuration` StringValue) parsed with
//! serde into [`RawConfig`], then validated into the typed [`Config`].
//!
//! Invariants of a [`Config`] (checked once, at load, never on the request path):
//! - `endpoints` is non-empty, free of duplicates, each entry an `IP:port` string
//!   in the exact form Envoy's `override_host` matches (`1.2.3.4:80`, `[::1]:80`);
//! - every numeric field lies in its documented range;
//! - header names are lowercase (Envoy stores header keys lowercase).
//!
//! Every error names the offending field and, for ranges, the allowed range, so
//! `on_configure` can log one line and return `false`.

use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;

/// Allowed range of `prefix_length` (SageMaker's `PrefixLength`).
pub const PREFIX_LENGTH_RANGE: (usize, usize) = (1024, 65536);
/// Allowed range of `concurrency_threshold` (SageMaker's `ConcurrencyThreshold`).
pub const CONCURRENCY_THRESHOLD_RANGE: (u32, u32) = (1, 1024);
/// Allowed range of `load_factor`.
pub const LOAD_FACTOR_RANGE: (f64, f64) = (1.0, 100.0);
/// Allowed range of `virtual_nodes` per endpoint on the hash ring.
pub const VIRTUAL_NODES_RANGE: (u32, u32) = (1, 4096);
/// Allowed range of `max_body_bytes`.
pub const MAX_BODY_BYTES_RANGE: (usize, usize) = (1024, 64 << 20);
/// Longest accepted routing id (affinity header or `prompt_cache_key`).
pub const MAX_ROUTING_ID_LEN: usize = 64;
/// Most ring points (`endpoints` × `virtual_nodes`) accepted: the ring is
/// built per worker VM (12 bytes a point, sorted at load), so 2^20 points
/// cost about 12 MiB and a fraction of a second per worker.
pub const MAX_RING_POINTS: usize = 1 << 20;
/// Header names the filter must never read as a routing id or write: framing,
/// hop-by-hop and routing headers of HTTP/1.1 and Envoy (rewriting one of
/// them would break the request or let the filter's output be mistaken for
/// them). Pseudo headers (`:authority`…) already fail the token check.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "keep-alive",
    "expect",
];
/// Reserved header name prefixes (`proxy-authorization`, `x-envoy-retry-on`…).
const RESERVED_HEADER_PREFIXES: &[&str] = &["proxy-", "x-envoy-"];

/// Default `prefix_length` of `prefix` and `session`: 2048 characters (about
/// 512 tokens), a typical system prompt plus the start of the conversation.
pub const DEFAULT_PREFIX_LENGTH: usize = 2048;
/// Default `prefix_length` of `affinity`: the whole range. Longest-prefix
/// matching works on 256-character blocks, so a long key does not fragment
/// groups; it lets deep shared prefixes (chat history, RAG documents) count.
pub const DEFAULT_AFFINITY_PREFIX_LENGTH: usize = 65536;
/// Default `concurrency_threshold`: vLLM's default `max_num_seqs` (256). Lower
/// values made `session` and `prefix` spill 26–90 % of requests at realistic
/// concurrency in the simulator.
pub const DEFAULT_CONCURRENCY_THRESHOLD: u32 = 256;
/// Default `load_factor` of `prefix` (CHWBL / KubeAI / SGLang `prefix_hash` use 1.25).
pub const DEFAULT_LOAD_FACTOR: f64 = 1.25;
/// Default `load_factor` of `affinity` (the simulator's best; the cost rule,
/// not this bound, decides most spills).
pub const DEFAULT_AFFINITY_LOAD_FACTOR: f64 = 2.0;
/// Default number of ring points per endpoint.
pub const DEFAULT_VIRTUAL_NODES: u32 = 256;
/// Default `max_body_bytes`: 768 KiB, below Envoy's default 1 MiB buffer limit,
/// so the filter stops buffering and routes on the raw prefix before Envoy would
/// answer 413.
pub const DEFAULT_MAX_BODY_BYTES: usize = 768 * 1024;
/// Default `target_header` (the Gateway API Inference Extension contract).
pub const DEFAULT_TARGET_HEADER: &str = "x-gateway-destination-endpoint";
/// The usual `decision_header` name (`envoy/envoy.yaml` sets it). Off by
/// default: the branch is already in the access-log field and the stats, and
/// a new request header sent upstream is the priciest host call of a request
/// (~9 µs of Envoy CPU, docs/overhead.md).
pub const DECISION_HEADER_NAME: &str = "x-prefix-router-decision";

/// How the replica is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Uniformly random replica (SageMaker `RANDOM`).
    Random,
    /// Rotating replica order.
    RoundRobin,
    /// Fewest in-flight requests (SageMaker `LEAST_OUTSTANDING_REQUESTS`).
    LeastRequest,
    /// Prefix hash on the ring with a load bound (SageMaker `PREFIX_AWARE`).
    Prefix,
    /// The routing id alone is the key (session affinity); no id → least request.
    Session,
    /// Longest known prefix (index of recently routed blocks), cost-aware spill,
    /// hot prefixes on several replicas, ring placement when cold. The default.
    Affinity,
}

impl Strategy {
    /// Name as written in the configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Strategy::Random => "random",
            Strategy::RoundRobin => "round_robin",
            Strategy::LeastRequest => "least_request",
            Strategy::Prefix => "prefix",
            Strategy::Session => "session",
            Strategy::Affinity => "affinity",
        }
    }
}

/// The configuration as written by the user (serde form, unknown fields refused).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// See [`Config::strategy`].
    pub strategy: Option<Strategy>,
    /// See [`Config::endpoints`].
    pub endpoints: Option<Vec<String>>,
    /// See [`Config::prefix_length`].
    pub prefix_length: Option<i64>,
    /// See [`Config::affinity_header`].
    pub affinity_header: Option<String>,
    /// See [`Config::concurrency_threshold`].
    pub concurrency_threshold: Option<i64>,
    /// See [`Config::load_factor`].
    pub load_factor: Option<f64>,
    /// See [`Config::target_header`].
    pub target_header: Option<String>,
    /// See [`Config::decision_header`].
    pub decision_header: Option<String>,
    /// See [`Config::max_body_bytes`].
    pub max_body_bytes: Option<i64>,
    /// See [`Config::virtual_nodes`].
    pub virtual_nodes: Option<i64>,
    /// See [`AffinityParams::min_match`].
    pub min_match: Option<f64>,
    /// See [`AffinityParams::routing_budget_ms`].
    pub routing_budget_ms: Option<f64>,
    /// See [`AffinityParams::index_slots`].
    pub index_slots: Option<i64>,
    /// See [`AffinityParams::index_ttl_s`].
    pub index_ttl_s: Option<i64>,
    /// See [`AffinityParams::prefill_ms_per_ktok`].
    pub prefill_ms_per_ktok: Option<f64>,
    /// See [`AffinityParams::wait_ms_per_request`].
    pub wait_ms_per_request: Option<f64>,
    /// See [`AffinityParams::learn_costs`].
    pub learn_costs: Option<bool>,
    /// See [`AffinityParams::chars_per_token`].
    pub chars_per_token: Option<f64>,
    /// See [`AffinityParams::spread_cold`].
    pub spread_cold: Option<bool>,
    /// See [`AffinityParams::share_factor`].
    pub share_factor: Option<f64>,
    /// See [`AffinityParams::short_prefix_weight`].
    pub short_prefix_weight: Option<f64>,
    /// See [`Config::read_usage`].
    pub read_usage: Option<bool>,
    /// See [`Config::eviction_horizons`].
    pub eviction_horizons: Option<bool>,
    /// See [`Config::paths`].
    pub paths: Option<Vec<String>>,
    /// See [`Discovery::cluster`].
    pub cluster: Option<String>,
    /// See [`Discovery::admin_cluster`].
    pub admin_cluster: Option<String>,
    /// See [`Discovery::refresh_ms`].
    pub refresh_ms: Option<i64>,
    /// See [`EngineParams`].
    pub engine: Option<RawEngine>,
    /// See [`crate::peers_config`].
    pub peers: Option<crate::peers_config::RawPeers>,
}

/// The `engine` object as written by the user.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEngine {
    /// See [`EngineParams::metrics_path`].
    pub metrics_path: Option<String>,
    /// See [`EngineParams::refresh_ms`].
    pub refresh_ms: Option<i64>,
    /// See [`EngineParams::max_queue`].
    pub max_queue: Option<f64>,
    /// See [`EngineParams::max_kv_usage`].
    pub max_kv_usage: Option<f64>,
}

/// Parameters of the `affinity` strategy (ignored by the others).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityParams {
    /// Smallest fraction of the prompt a known prefix must cover to be warm.
    pub min_match: f64,
    /// Largest extra wait (ms) accepted to keep a warm replica beyond the
    /// re-prefill a spill would cost the request
    /// ([`crate::affinity::AffinityConfig::routing_budget_ms`]).
    pub routing_budget_ms: f64,
    /// Slots of the shared prefix index ([`crate::index::ENTRY_BYTES`]-byte values in shared data).
    pub index_slots: u32,
    /// Index entries older than this are treated as evicted (seconds).
    pub index_ttl_s: u32,
    /// Initial prefill cost, ms per 1000 uncached prompt tokens.
    pub prefill_ms_per_ktok: f64,
    /// Initial extra wait per in-flight request, ms; with the queued-prefill
    /// picture also the ceiling of the learned one
    /// ([`crate::affinity`], "Wait price").
    pub wait_ms_per_request: f64,
    /// Learn both prices from observed time to first token (streams).
    pub learn_costs: bool,
    /// Characters per token of the served model.
    pub chars_per_token: f64,
    /// Break cold placement's load ties towards the replica given the fewest
    /// new prefixes recently ([`crate::pressure`]); false: ring order (every
    /// Envoy places a new prefix alike at equal loads).
    pub spread_cold: bool,
    /// Request-share bound ([`crate::share`]): 0 (off) or 1–10.
    pub share_factor: f64,
    /// Short known prefix ([`crate::affinity::AffinityConfig::short_weight`]):
    /// the holder of a fresh known prefix under `min_match` is kept while
    /// its extra expected delay is at most this × the prefill of the known
    /// tokens (from 2 in flight per replica on average); 0 = off (cold
    /// placement alone). 0–100.
    pub short_prefix_weight: f64,
}

impl Default for AffinityParams {
    fn default() -> Self {
        AffinityParams {
            min_match: 0.2,
            routing_budget_ms: 2000.0,
            index_slots: 262_144,
            index_ttl_s: 600,
            prefill_ms_per_ktok: 50.0,
            wait_ms_per_request: 10.0,
            learn_costs: true,
            chars_per_token: 4.0,
            spread_cold: true,
            share_factor: crate::affinity::DEFAULT_SHARE_FACTOR,
            short_prefix_weight: crate::affinity::DEFAULT_SHORT_WEIGHT,
        }
    }
}

/// Allowed range of `refresh_ms` and `engine.refresh_ms`.
pub const REFRESH_MS_RANGE: (u32, u32) = (20, 60_000);
/// Default `refresh_ms` (admin poll period).
pub const DEFAULT_REFRESH_MS: u32 = 1000;
/// Default `engine.refresh_ms` (metrics scrape period).
pub const DEFAULT_ENGINE_REFRESH_MS: u32 = 500;

/// Live membership and health from Envoy's admin `/clusters?format=json`
/// (see `docs/cluster.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// The Envoy cluster holding the replicas (the route's cluster).
    pub cluster: String,
    /// A cluster whose only host is Envoy's admin listener on loopback.
    pub admin_cluster: String,
    /// Poll period, milliseconds.
    pub refresh_ms: u32,
}

/// Engine metrics scraping (`engine` object).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineParams {
    /// Path of each replica's Prometheus endpoint. Default `/metrics`.
    pub metrics_path: String,
    /// Scrape period, milliseconds. Samples older than 3 periods are ignored.
    pub refresh_ms: u32,
    /// Waiting requests at which a replica is saturated.
    pub max_queue: f64,
    /// KV-cache usage (0–1) at which a replica is saturated.
    pub max_kv_usage: f64,
}

/// Validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Selection strategy. Default `affinity`.
    pub strategy: Strategy,
    /// Replica addresses, `IP:port`, in canonical (sorted) order. The order the
    /// user wrote them in never changes the mapping.
    pub endpoints: Vec<String>,
    /// Characters of extracted message text (JSON APIs) or bytes of the body
    /// (other bodies) that form the prefix key.
    pub prefix_length: usize,
    /// Lowercase name of the request header carrying a routing id, if any.
    pub affinity_header: Option<String>,
    /// In-flight count at which the preferred replica is skipped.
    pub concurrency_threshold: u32,
    /// Bounded-load cap relative to the mean in-flight count.
    pub load_factor: f64,
    /// Lowercase name of the header `override_host` reads.
    pub target_header: String,
    /// Lowercase name of the header telling the upstream which branch decided;
    /// empty (configured as `""`) = not sent (one header write, and the
    /// header's trip upstream, saved per request: docs/overhead.md).
    pub decision_header: String,
    /// Largest body the filter buffers and parses; larger bodies are routed on
    /// their first `prefix_length` raw bytes as soon as this many bytes arrived.
    pub max_body_bytes: usize,
    /// Ring points per endpoint.
    pub virtual_nodes: u32,
    /// `affinity` parameters.
    pub affinity: AffinityParams,
    /// Live membership (`cluster` set), else the static `endpoints`.
    pub discovery: Option<Discovery>,
    /// Engine metrics scraping (needs `cluster`).
    pub engine: Option<EngineParams>,
    /// Read the engine's usage (`cached_tokens`, response `id`) from the
    /// responses as they pass: predicted vs delivered stats, index feedback,
    /// Responses API pinning. Default true; false reads no response byte.
    pub read_usage: bool,
    /// Let expected hits that got misses raise the replica's eviction
    /// horizon ([`crate::feedback`]: three in a row forget the replica's
    /// index entries older than the newest miss). Default false: under
    /// cache pressure engines evict old prefixes one by one, and the
    /// horizon then forgot the shared prefixes they still held (public
    /// Mooncake trace, 7 replicas: −0.8 to −1.4 points of hit rate,
    /// `docs/delivered.md`); after a restart or a cache reset each prefix
    /// is prefilled once again either way. True makes the predictions right
    /// again a few requests after a reset. Needs `read_usage`.
    pub eviction_horizons: bool,
    /// Request paths whose 2xx responses are recorded in the `affinity` index
    /// (exact match, query string ignored; see [`crate::paths`]).
    pub paths: Vec<String>,
    /// Peer exchange of index writes between gateways (`peers` object).
    pub peers: Option<crate::peers_config::PeersParams>,
}

/// A configuration error naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The JSON field at fault (`"(json)"` for a syntax error).
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration: field `{}`: {}",
            self.field, self.message
        )
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn err(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        message: message.into(),
    }
}

pub(crate) fn int_in_range<T: TryFrom<i64> + Copy>(
    field: &str,
    value: Option<i64>,
    range: (T, T),
    default: T,
) -> Result<T, ConfigError>
where
    i64: From<T>,
{
    let Some(v) = value else { return Ok(default) };
    let (lo, hi) = (i64::from(range.0), i64::from(range.1));
    if v < lo || v > hi {
        return Err(err(
            field,
            format!("must be between {lo} and {hi}, got {v}"),
        ));
    }
    T::try_from(v).map_err(|_| err(field, format!("must be between {lo} and {hi}, got {v}")))
}

/// A float field within `range` (inclusive), or its default.
fn float_in_range(
    field: &str,
    value: Option<f64>,
    range: (f64, f64),
    default: f64,
) -> Result<f64, ConfigError> {
    let v = value.unwrap_or(default);
    if v.is_finite() && (range.0..=range.1).contains(&v) {
        Ok(v)
    } else {
        Err(err(
            field,
            format!("must be between {} and {}, got {v}", range.0, range.1),
        ))
    }
}

/// Is `name` a valid HTTP header name (RFC 9110 token), returned lowercase?
fn header_name(field: &str, name: &str) -> Result<String, ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !ok {
        return Err(err(
            field,
            format!("must be an HTTP header name (1-128 token characters), got {name:?}"),
        ));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str())
        || RESERVED_HEADER_PREFIXES
            .iter()
            .any(|p| lower.starts_with(p))
    {
        return Err(err(
            field,
            format!("{name:?} is a framing, hop-by-hop or proxy header; use an application header such as x-session-id"),
        ));
    }
    Ok(lower)
}

/// Canonical `IP:port` form of one endpoint, or why it is not one.
fn endpoint(index: usize, raw: &str) -> Result<String, ConfigError> {
    let field = format!("endpoints[{index}]");
    let addr: SocketAddr = raw.trim().parse().map_err(|_| {
        ConfigError {
            field: field.clone(),
            message: format!(
                "must be an \"IP:port\" string exactly as Envoy holds the host (for example \"10.0.0.5:8000\" or \"[fd00::5]:8000\"; hostnames are not resolved), got {raw:?}"
            ),
        }
    })?;
    if addr.port() == 0 {
        return Err(ConfigError {
            field,
            message: format!("port must be 1-65535, got {raw:?}"),
        });
    }
    // SocketAddr's Display is exactly Envoy's `Address::asString()` form.
    Ok(addr.to_string())
}

/// serde_json reports type errors by line and column only; find the field by
/// re-checking each top-level member on its own (config load only, never per request).
fn field_at_fault(bytes: &[u8]) -> Option<String> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(bytes).ok()?;
    map.into_iter().find_map(|(key, value)| {
        let mut single = serde_json::Map::new();
        single.insert(key.clone(), value);
        serde_json::from_value::<RawConfig>(serde_json::Value::Object(single))
            .err()
            .map(|_| key)
    })
}

impl Config {
    /// Parse and validate the plugin configuration bytes. An empty configuration is
    /// refused: at least `endpoints` is required.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first field at fault.
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        let raw: RawConfig = serde_json::from_slice(bytes).map_err(|e| {
            let field = field_at_fault(bytes).unwrap_or_else(|| "(json)".to_string());
            ConfigError {
                field,
                message: e.to_string(),
            }
        })?;
        Config::validate(raw)
    }

    /// Validate a [`RawConfig`] into a [`Config`].
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first field at fault.
    pub fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        let discovery = discovery(&raw)?;
        let endpoints_raw = match (raw.endpoints.as_ref(), &discovery) {
            (Some(e), _) => e.clone(),
            (None, Some(_)) => Vec::new(),
            (None, None) => {
                return Err(err(
                    "endpoints",
                    "is required (the replicas as \"IP:port\" strings) unless `cluster` names the Envoy cluster to follow",
                ))
            }
        };
        if endpoints_raw.is_empty() && discovery.is_none() {
            return Err(err(
                "endpoints",
                "must list at least one \"IP:port\" replica",
            ));
        }
        if endpoints_raw.len() > 4096 {
            return Err(err(
                "endpoints",
                format!("at most 4096 replicas, got {}", endpoints_raw.len()),
            ));
        }
        let mut endpoints = Vec::with_capacity(endpoints_raw.len());
        for (i, e) in endpoints_raw.iter().enumerate() {
            endpoints.push(endpoint(i, e)?);
        }
        endpoints.sort();
        if let Some(w) = endpoints.windows(2).find(|w| w[0] == w[1]) {
            return Err(err("endpoints", format!("duplicate replica {}", w[0])));
        }

        let strategy = raw.strategy.unwrap_or(Strategy::Affinity);
        let affinity = strategy == Strategy::Affinity;
        let prefix_length = int_in_range(
            "prefix_length",
            raw.prefix_length,
            PREFIX_LENGTH_RANGE_I,
            if affinity {
                DEFAULT_AFFINITY_PREFIX_LENGTH as u32
            } else {
                DEFAULT_PREFIX_LENGTH_I
            },
        )?;
        let concurrency_threshold = int_in_range(
            "concurrency_threshold",
            raw.concurrency_threshold,
            CONCURRENCY_THRESHOLD_RANGE,
            DEFAULT_CONCURRENCY_THRESHOLD,
        )?;
        let max_body_bytes = int_in_range(
            "max_body_bytes",
            raw.max_body_bytes,
            MAX_BODY_BYTES_RANGE_I,
            DEFAULT_MAX_BODY_BYTES_I,
        )?;
        let virtual_nodes = int_in_range(
            "virtual_nodes",
            raw.virtual_nodes,
            VIRTUAL_NODES_RANGE,
            DEFAULT_VIRTUAL_NODES,
        )?;

        let paths = match raw.paths {
            None => crate::paths::DEFAULT_PATHS.map(String::from).to_vec(),
            Some(p) if p.is_empty() || p.len() > crate::paths::MAX_PATHS => {
                return Err(err(
                    "paths",
                    format!(
                        "must list 1-{} paths, got {}",
                        crate::paths::MAX_PATHS,
                        p.len()
                    ),
                ))
            }
            Some(p) => {
                for (i, x) in p.iter().enumerate() {
                    crate::paths::check_path(x).map_err(|m| err(&format!("paths[{i}]"), m))?;
                }
                p
            }
        };
        if endpoints.len() * virtual_nodes as usize > MAX_RING_POINTS {
            return Err(err(
                "virtual_nodes",
                format!(
                    "endpoints × virtual_nodes must be at most {MAX_RING_POINTS} ring points, got {} × {virtual_nodes}",
                    endpoints.len()
                ),
            ));
        }

        let default_lf = if affinity {
            DEFAULT_AFFINITY_LOAD_FACTOR
        } else {
            DEFAULT_LOAD_FACTOR
        };
        let load_factor = float_in_range(
            "load_factor",
            raw.load_factor,
            LOAD_FACTOR_RANGE,
            default_lf,
        )?;
        let d = AffinityParams::default();
        let affinity_params = AffinityParams {
            min_match: float_in_range("min_match", raw.min_match, (0.0, 1.0), d.min_match)?,
            routing_budget_ms: float_in_range(
                "routing_budget_ms",
                raw.routing_budget_ms,
                (0.0, 600_000.0),
                d.routing_budget_ms,
            )?,
            index_slots: int_in_range(
                "index_slots",
                raw.index_slots,
                (1024u32, 1 << 20),
                d.index_slots,
            )?,
            index_ttl_s: int_in_range(
                "index_ttl_s",
                raw.index_ttl_s,
                (1u32, 86_400),
                d.index_ttl_s,
            )?,
            prefill_ms_per_ktok: float_in_range(
                "prefill_ms_per_ktok",
                raw.prefill_ms_per_ktok,
                (0.5, 100_000.0),
                d.prefill_ms_per_ktok,
            )?,
            wait_ms_per_request: float_in_range(
                "wait_ms_per_request",
                raw.wait_ms_per_request,
                (0.0, 10_000.0),
                d.wait_ms_per_request,
            )?,
            learn_costs: raw.learn_costs.unwrap_or(d.learn_costs),
            spread_cold: raw.spread_cold.unwrap_or(d.spread_cold),
            share_factor: match float_in_range(
                "share_factor",
                raw.share_factor,
                (0.0, 10.0),
                d.share_factor,
            )? {
                f if f > 0.0 && f < 1.0 => {
                    return Err(err(
                        "share_factor",
                        format!("must be 0 (off) or between 1 and 10, got {f}"),
                    ))
                }
                f => f,
            },
            chars_per_token: float_in_range(
                "chars_per_token",
                raw.chars_per_token,
                (1.0, 16.0),
                d.chars_per_token,
            )?,
            short_prefix_weight: float_in_range(
                "short_prefix_weight",
                raw.short_prefix_weight,
                (0.0, 100.0),
                d.short_prefix_weight,
            )?,
        };

        let affinity_header = raw
            .affinity_header
            .map(|h| header_name("affinity_header", &h))
            .transpose()?;
        let target_header = header_name(
            "target_header",
            raw.target_header
                .as_deref()
                .unwrap_or(DEFAULT_TARGET_HEADER),
        )?;
        let decision_header = match raw.decision_header.as_deref() {
            None | Some("") => String::new(),
            Some(name) => header_name("decision_header", name)?,
        };
        if decision_header == target_header {
            return Err(err("decision_header", "must differ from target_header"));
        }
        if affinity_header.as_deref() == Some(target_header.as_str()) {
            return Err(err(
                "affinity_header",
                "must differ from target_header (a client must never pick the host)",
            ));
        }

        Ok(Config {
            strategy,
            endpoints,
            prefix_length: prefix_length as usize,
            affinity_header,
            concurrency_threshold,
            load_factor,
            target_header,
            decision_header,
            max_body_bytes: max_body_bytes as usize,
            virtual_nodes,
            affinity: affinity_params,
            engine: engine(raw.engine, discovery.is_some())?,
            peers: crate::peers_config::validate(
                raw.peers,
                discovery.as_ref().map(|d| d.admin_cluster.as_str()),
            )?,
            discovery,
            read_usage: raw.read_usage.unwrap_or(true),
            eviction_horizons: raw.eviction_horizons.unwrap_or(false),
            paths,
        })
    }
}

/// An Envoy cluster name (1–256 characters, no control character).
pub(crate) fn cluster_name(field: &str, v: &str) -> Result<String, ConfigError> {
    if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
        Err(err(
            field,
            format!("must be an Envoy cluster name, got {v:?}"),
        ))
    } else {
        Ok(v.to_string())
    }
}

/// `cluster`, `admin_cluster`, `refresh_ms`: all or nothing.
fn discovery(raw: &RawConfig) -> Result<Option<Discovery>, ConfigError> {
    let name = cluster_name;
    let Some(cluster) = raw.cluster.as_deref() else {
        for (field, set) in [
            ("admin_cluster", raw.admin_cluster.is_some()),
            ("refresh_ms", raw.refresh_ms.is_some()),
        ] {
            if set {
                return Err(err(field, "needs `cluster` (the Envoy cluster to follow)"));
            }
        }
        return Ok(None);
    };
    let cluster = name("cluster", cluster)?;
    let admin_cluster = match raw.admin_cluster.as_deref() {
        Some(a) => name("admin_cluster", a)?,
        None => {
            return Err(err(
                "admin_cluster",
                "is required with `cluster`: a cluster whose host is Envoy's admin listener on loopback",
            ))
        }
    };
    if admin_cluster == cluster {
        return Err(err("admin_cluster", "must differ from `cluster`"));
    }
    let refresh_ms = int_in_range(
        "refresh_ms",
        raw.refresh_ms,
        REFRESH_MS_RANGE,
        DEFAULT_REFRESH_MS,
    )?;
    Ok(Some(Discovery {
        cluster,
        admin_cluster,
        refresh_ms,
    }))
}

/// The `engine` object (needs `cluster`: scrapes go through it).
fn engine(raw: Option<RawEngine>, discovery: bool) -> Result<Option<EngineParams>, ConfigError> {
    let Some(e) = raw else { return Ok(None) };
    if !discovery {
        return Err(err(
            "engine",
            "needs `cluster` (scrapes go through that cluster)",
        ));
    }
    let metrics_path = e.metrics_path.unwrap_or_else(|| "/metrics".to_string());
    if !metrics_path.starts_with('/')
        || metrics_path.len() > 256
        || metrics_path.bytes().any(|b| !(0x21..0x7f).contains(&b))
    {
        return Err(err(
            "engine.metrics_path",
            format!("must be an absolute URL path, got {metrics_path:?}"),
        ));
    }
    Ok(Some(EngineParams {
        metrics_path,
        refresh_ms: int_in_range(
            "engine.refresh_ms",
            e.refresh_ms,
            REFRESH_MS_RANGE,
            DEFAULT_ENGINE_REFRESH_MS,
        )?,
        max_queue: float_in_range("engine.max_queue", e.max_queue, (0.0, 1e6), 16.0)?,
        max_kv_usage: float_in_range("engine.max_kv_usage", e.max_kv_usage, (0.0, 1.0), 0.9)?,
    }))
}

// `int_in_range` works on types that widen losslessly into i64; usize does not,
// so the usize fields go through u32 (all their ranges fit).
const PREFIX_LENGTH_RANGE_I: (u32, u32) =
    (PREFIX_LENGTH_RANGE.0 as u32, PREFIX_LENGTH_RANGE.1 as u32);
const DEFAULT_PREFIX_LENGTH_I: u32 = DEFAULT_PREFIX_LENGTH as u32;
const MAX_BODY_BYTES_RANGE_I: (u32, u32) =
    (MAX_BODY_BYTES_RANGE.0 as u32, MAX_BODY_BYTES_RANGE.1 as u32);
const DEFAULT_MAX_BODY_BYTES_I: u32 = DEFAULT_MAX_BODY_BYTES as u32;

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn parse(json: &str) -> Result<Config, ConfigError> {
        Config::from_json(json.as_bytes())
    }

    const EPS: &str = r#""endpoints":["127.0.0.1:8001","127.0.0.1:8000"]"#;

    #[test]
    fn spread_cold_is_on_by_default() {
        assert!(parse(&format!("{{{EPS}}}")).unwrap().affinity.spread_cold);
        assert!(
            !parse(&format!("{{{EPS},\"spread_cold\":false}}"))
                .unwrap()
                .affinity
                .spread_cold
        );
        assert!(parse(&format!("{{{EPS},\"spread_cold\":1}}")).is_err());
    }

    #[test]
    fn short_prefix_weight_is_zero_to_a_hundred_and_zero_turns_it_off() {
        let f = |v: &str| parse(&format!("{{{EPS},\"short_prefix_weight\":{v}}}"));
        let d = parse(&format!("{{{EPS}}}")).unwrap().affinity;
        assert_eq!(d.short_prefix_weight, 4.0);
        assert_eq!(f("0").unwrap().affinity.short_prefix_weight, 0.0);
        assert_eq!(f("1.5").unwrap().affinity.short_prefix_weight, 1.5);
        for bad in ["-1", "100.5", "true", "\"2\""] {
            assert_eq!(f(bad).unwrap_err().field, "short_prefix_weight");
        }
    }

    #[test]
    fn share_factor_is_zero_or_one_to_ten() {
        let f = |v: &str| parse(&format!("{{{EPS},\"share_factor\":{v}}}"));
        let d = parse(&format!("{{{EPS}}}")).unwrap().affinity.share_factor;
        assert_eq!(d, crate::affinity::DEFAULT_SHARE_FACTOR);
        assert_eq!(f("0").unwrap().affinity.share_factor, 0.0);
        assert_eq!(f("1.2").unwrap().affinity.share_factor, 1.2);
        for bad in ["0.5", "10.5", "-1"] {
            assert_eq!(f(bad).unwrap_err().field, "share_factor");
        }
        assert!(f("true").is_err());
        assert!(f("0.5")
            .unwrap_err()
            .message
            .contains("0 (off) or between 1 and 10"));
    }

    #[test]
    fn eviction_horizons_are_off_by_default() {
        assert!(!parse(&format!("{{{EPS}}}")).unwrap().eviction_horizons);
        assert!(
            parse(&format!("{{{EPS},\"eviction_horizons\":true}}"))
                .unwrap()
                .eviction_horizons
        );
        let e = parse(&format!("{{{EPS},\"eviction_horizons\":\"yes\"}}")).unwrap_err();
        assert!(e.to_string().contains("eviction_horizons"), "{e}");
    }

    #[test]
    fn read_usage_is_on_by_default() {
        assert!(parse(&format!("{{{EPS}}}")).unwrap().read_usage);
        assert!(
            !parse(&format!("{{{EPS},\"read_usage\":false}}"))
                .unwrap()
                .read_usage
        );
        assert!(parse(&format!("{{{EPS},\"read_usage\":1}}")).is_err());
    }

    #[test]
    fn defaults_and_canonical_order() {
        let c = parse(&format!("{{{EPS}}}")).unwrap();
        assert_eq!(c.strategy, Strategy::Affinity);
        assert_eq!(c.endpoints, vec!["127.0.0.1:8000", "127.0.0.1:8001"]);
        assert_eq!(c.prefix_length, DEFAULT_AFFINITY_PREFIX_LENGTH);
        assert_eq!(c.concurrency_threshold, DEFAULT_CONCURRENCY_THRESHOLD);
        assert_eq!(c.load_factor, DEFAULT_AFFINITY_LOAD_FACTOR);
        assert_eq!(c.affinity, AffinityParams::default());
        let p = parse(&format!("{{{EPS},\"strategy\":\"prefix\"}}")).unwrap();
        assert_eq!(p.prefix_length, DEFAULT_PREFIX_LENGTH);
        assert_eq!(p.load_factor, DEFAULT_LOAD_FACTOR);
        assert_eq!(c.target_header, DEFAULT_TARGET_HEADER);
        assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        assert!(c.affinity_header.is_none());
    }

    #[test]
    fn unknown_field_is_named() {
        let e = parse(&format!("{{{EPS},\"prefix_lenght\":2000}}")).unwrap_err();
        assert_eq!(e.field, "prefix_lenght");
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn ranges_are_named_with_bounds() {
        for (json, field, range) in [
            (
                "\"prefix_length\":1023",
                "prefix_length",
                "between 1024 and 65536",
            ),
            (
                "\"prefix_length\":65537",
                "prefix_length",
                "between 1024 and 65536",
            ),
            (
                "\"concurrency_threshold\":0",
                "concurrency_threshold",
                "between 1 and 1024",
            ),
            (
                "\"concurrency_threshold\":1025",
                "concurrency_threshold",
                "between 1 and 1024",
            ),
            ("\"load_factor\":0.9", "load_factor", "between 1 and 100"),
            (
                "\"max_body_bytes\":10",
                "max_body_bytes",
                "between 1024 and",
            ),
            ("\"virtual_nodes\":0", "virtual_nodes", "between 1 and 4096"),
            ("\"min_match\":1.5", "min_match", "between 0 and 1"),
            (
                "\"routing_budget_ms\":-1",
                "routing_budget_ms",
                "between 0 and 600000",
            ),
            (
                "\"index_slots\":10",
                "index_slots",
                "between 1024 and 1048576",
            ),
            ("\"index_ttl_s\":0", "index_ttl_s", "between 1 and 86400"),
            (
                "\"prefill_ms_per_ktok\":0",
                "prefill_ms_per_ktok",
                "between 0.5 and 100000",
            ),
            (
                "\"wait_ms_per_request\":1e9",
                "wait_ms_per_request",
                "between 0 and 10000",
            ),
            (
                "\"chars_per_token\":0.5",
                "chars_per_token",
                "between 1 and 16",
            ),
        ] {
            let e = parse(&format!("{{{EPS},{json}}}")).unwrap_err();
            assert_eq!(e.field, field, "{json}");
            assert!(e.message.contains(range), "{json}: {e}");
        }
    }

    #[test]
    fn bad_values_are_named() {
        let e = parse(r#"{"endpoints":["localhost:80"]}"#).unwrap_err();
        assert_eq!(e.field, "endpoints[0]");
        let e = parse(r#"{"endpoints":["127.0.0.1:80","127.0.0.1:80"]}"#).unwrap_err();
        assert_eq!(e.field, "endpoints");
        assert!(e.message.contains("duplicate"));
        let e = parse(r#"{"endpoints":[]}"#).unwrap_err();
        assert_eq!(e.field, "endpoints");
        let e = parse(r#"{}"#).unwrap_err();
        assert_eq!(e.field, "endpoints");
        let e = parse(&format!("{{{EPS},\"strategy\":\"fastest\"}}")).unwrap_err();
        assert_eq!(e.field, "strategy");
        assert!(e.message.contains("round_robin"), "{e}");
        let e = parse(&format!("{{{EPS},\"prefix_length\":\"long\"}}")).unwrap_err();
        assert_eq!(e.field, "prefix_length");
        let e = parse(&format!("{{{EPS},\"affinity_header\":\"bad header\"}}")).unwrap_err();
        assert_eq!(e.field, "affinity_header");
        let e = parse(&format!(
            "{{{EPS},\"affinity_header\":\"X-Gateway-Destination-Endpoint\"}}"
        ))
        .unwrap_err();
        assert_eq!(e.field, "affinity_header");
        let e = parse("not json").unwrap_err();
        assert_eq!(e.field, "(json)");
        let e = parse(&format!(r#"{{{EPS},"paths":[]}}"#)).unwrap_err();
        assert_eq!(e.field, "paths");
        let e = parse(&format!(r#"{{{EPS},"paths":["/ok","no-slash"]}}"#)).unwrap_err();
        assert_eq!(e.field, "paths[1]");
        let c = parse(&format!(r#"{{{EPS},"paths":["/generate"]}}"#)).unwrap();
        assert_eq!(c.paths, vec!["/generate"]);
    }

    #[test]
    fn ring_size_is_bounded() {
        let eps: Vec<String> = (0..4096)
            .map(|i| format!("10.0.{}.{}:80", i / 256, i % 256))
            .collect();
        let eps = serde_json::to_string(&eps).unwrap();
        let e = parse(&format!(r#"{{"endpoints":{eps},"virtual_nodes":4096}}"#)).unwrap_err();
        assert_eq!(e.field, "virtual_nodes");
        assert!(e.message.contains("1048576"), "{e}");
        // 4096 × 256 is exactly the bound.
        assert!(parse(&format!(r#"{{"endpoints":{eps},"virtual_nodes":256}}"#)).is_ok());
    }

    #[test]
    fn dangerous_header_names_are_refused() {
        for field in ["target_header", "decision_header", "affinity_header"] {
            for name in [
                "host",
                "Content-Length",
                "connection",
                "transfer-encoding",
                "te",
                "upgrade",
                "keep-alive",
                "proxy-authorization",
                "x-envoy-retry-on",
                ":authority",
                "bad header",
                "x-a\\u00e9",
            ] {
                let e = parse(&format!(r#"{{{EPS},"{field}":"{name}"}}"#)).unwrap_err();
                assert_eq!(e.field, field, "{field}={name}");
            }
            assert!(parse(&format!(r#"{{{EPS},"{field}":"x-my-header"}}"#)).is_ok());
        }
        // Empty: only the decision header may be turned off; it is off by default.
        let c = parse(&format!(r#"{{{EPS},"decision_header":""}}"#)).unwrap();
        assert_eq!(c.decision_header, "");
        assert_eq!(parse(&format!("{{{EPS}}}")).unwrap().decision_header, "");
        let named = format!(r#"{{{EPS},"decision_header":"{DECISION_HEADER_NAME}"}}"#);
        assert_eq!(parse(&named).unwrap().decision_header, DECISION_HEADER_NAME);
        let e = parse(&format!(r#"{{{EPS},"target_header":""}}"#)).unwrap_err();
        assert_eq!(e.field, "target_header");
    }

    #[test]
    fn session_without_affinity_header_uses_prompt_cache_key() {
        // Accepted on purpose: OpenAI clients send the routing id in the body.
        let c = parse(&format!(r#"{{{EPS},"strategy":"session"}}"#)).unwrap();
        assert_eq!(c.affinity_header, None);
        let r = crate::router::Router::new(c);
        let body = br#"{"prompt":"x","prompt_cache_key":"conversation-1"}"#;
        let k = r.key(crate::router::Body::Complete(body), None);
        assert_eq!(k.source, crate::decision::KeySource::RoutingId);
        let other = br#"{"prompt":"y","prompt_cache_key":"conversation-1"}"#;
        assert_eq!(k.key, r.key(crate::router::Body::Complete(other), None).key);
    }

    #[test]
    fn discovery_fields() {
        let c = parse(r#"{"cluster":"llm","admin_cluster":"envoy_admin"}"#).unwrap();
        assert!(c.endpoints.is_empty());
        let d = c.discovery.unwrap();
        assert_eq!(
            (d.cluster.as_str(), d.refresh_ms),
            ("llm", DEFAULT_REFRESH_MS)
        );
        let c = parse(&format!(
            r#"{{{EPS},"cluster":"llm","admin_cluster":"a","refresh_ms":200,"engine":{{"max_queue":4}}}}"#
        ))
        .unwrap();
        assert_eq!(c.endpoints.len(), 2);
        let e = c.engine.unwrap();
        assert_eq!(
            (e.metrics_path.as_str(), e.max_queue, e.max_kv_usage),
            ("/metrics", 4.0, 0.9)
        );
        for (json, field) in [
            (r#"{}"#, "endpoints"),
            (r#"{"admin_cluster":"a"}"#, "admin_cluster"),
            (r#"{"cluster":"llm"}"#, "admin_cluster"),
            (
                r#"{"cluster":"llm","admin_cluster":"llm"}"#,
                "admin_cluster",
            ),
            (r#"{"cluster":"","admin_cluster":"a"}"#, "cluster"),
            (
                r#"{"cluster":"l","admin_cluster":"a","refresh_ms":5}"#,
                "refresh_ms",
            ),
            (r#"{"endpoints":["127.0.0.1:1"],"engine":{}}"#, "engine"),
            (
                r#"{"cluster":"l","admin_cluster":"a","engine":{"metrics_path":"x"}}"#,
                "engine.metrics_path",
            ),
            (
                r#"{"cluster":"l","admin_cluster":"a","engine":{"max_kv_usage":2}}"#,
                "engine.max_kv_usage",
            ),
            (
                r#"{"cluster":"l","admin_cluster":"a","engine":{"bogus":1}}"#,
                "engine",
            ),
        ] {
            assert_eq!(parse(json).unwrap_err().field, field, "{json}");
        }
    }

    #[test]
    fn ipv6_and_header_case() {
        let c = parse(
            r#"{"endpoints":["[::1]:9000"],"affinity_header":"X-Session-ID","strategy":"session"}"#,
        )
        .unwrap();
        assert_eq!(c.endpoints, vec!["[::1]:9000"]);
        assert_eq!(c.affinity_header.as_deref(), Some("x-session-id"));
        assert_eq!(c.strategy, Strategy::Session);
    }
}
