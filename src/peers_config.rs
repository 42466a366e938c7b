//! The `peers` object of the plugin configuration: peer exchange of index
//! writes between gateway Envoys (issue 11; see `docs/multi-gateway.md`).
//!
//! ```json
//! "peers": {"cluster": "prefix_router_peers", "secret": "…at least 16 chars…",
//!           "admin_cluster": "envoy_admin", "path": "/prefix-router/peers",
//!           "pull_ms": 100, "timeout_ms": 250, "hosts_refresh_ms": 1000,
//!           "max_batch": 2048, "log_capacity": 16384,
//!           "min_publish_chars": 512, "refresh_publish_s": 120,
//!           "sync_budget_bp": 0, "share_queued": true, "queue_ms": 25,
//!           "ladder_last": true, "publish_bits": 0}
//! ```
//!
//! `cluster` and `secret` are required; `admin_cluster` defaults to the
//! top-level one (discovery), else it is required (the peer list is read from
//! Envoy's admin `/clusters`). Validation names the field (`peers.pull_ms` …),
//! like every other field of [`crate::config`].
//!
//! Keys: with `peers` the `affinity` index's slot hash is keyed by
//! [`PeersParams::index_secret`], derived from `secret`, instead of the
//! per-process random secret, so every gateway with the same `secret` places
//! a prefix in the same slot and entries mean the same thing everywhere
//! (holders are address ids, the same in every Envoy). The secret itself
//! never travels: a pull carries it in a header only as a credential (compared
//! in constant time), and the batch `layout` carries a fingerprint of the
//! derived key, so gateways configured with different secrets refuse each
//! other's batches.

use crate::config::{cluster_name, err, int_in_range, ConfigError};
use crate::hash::hash_id;
use serde::Deserialize;

/// The `peers` object as written by the user.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPeers {
    /// See [`PeersParams::cluster`].
    pub cluster: Option<String>,
    /// See [`PeersParams::admin_cluster`].
    pub admin_cluster: Option<String>,
    /// See [`PeersParams::path`].
    pub path: Option<String>,
    /// Shared secret of the gateways (≥ 16 characters).
    pub secret: Option<String>,
    /// See [`PeersParams::pull_ms`].
    pub pull_ms: Option<i64>,
    /// See [`PeersParams::timeout_ms`].
    pub timeout_ms: Option<i64>,
    /// See [`PeersParams::hosts_refresh_ms`].
    pub hosts_refresh_ms: Option<i64>,
    /// See [`PeersParams::max_batch`].
    pub max_batch: Option<i64>,
    /// See [`PeersParams::log_capacity`].
    pub log_capacity: Option<i64>,
    /// See [`PeersParams::min_publish_chars`].
    pub min_publish_chars: Option<i64>,
    /// See [`PeersParams::refresh_publish_s`].
    pub refresh_publish_s: Option<i64>,
    /// See [`PeersParams::sync_budget_bp`].
    pub sync_budget_bp: Option<i64>,
    /// See [`PeersParams::share_queued`].
    pub share_queued: Option<bool>,
    /// See [`PeersParams::queue_ms`].
    pub queue_ms: Option<i64>,
    /// See [`PeersParams::ladder_last`].
    pub ladder_last: Option<bool>,
    /// See [`PeersParams::publish_bits`].
    pub publish_bits: Option<i64>,
}

/// Default of [`PeersParams::ladder_last`].
pub const DEFAULT_LADDER_LAST: bool = true;
/// Default of [`PeersParams::publish_bits`] (0: the local ladder).
pub const DEFAULT_PUBLISH_BITS: u32 = 0;

/// Default path of the sync endpoint.
pub const DEFAULT_PATH: &str = "/prefix-router/peers";
/// Header carrying the shared secret on a pull.
pub const SECRET_HEADER: &str = "x-prefix-router-peer";

/// Validated `peers` parameters.
#[derive(Clone, PartialEq, Eq)]
pub struct PeersParams {
    /// Envoy cluster of the gateways (STRICT_DNS over a headless service in
    /// Kubernetes) with the `override_host` load-balancing policy.
    pub cluster: String,
    /// Cluster of Envoy's admin listener (the peer list comes from `/clusters`).
    pub admin_cluster: String,
    /// Path of the sync endpoint each gateway answers itself.
    pub path: String,
    /// The shared secret (credential of a pull; never logged).
    pub secret: String,
    /// Pull period, ms (each peer once per period, one VM per Envoy).
    pub pull_ms: u32,
    /// Time-out of one pull, ms.
    pub timeout_ms: u32,
    /// Period of the admin poll that lists the peers, ms.
    pub hosts_refresh_ms: u32,
    /// Largest entries per batch (served and accepted).
    pub max_batch: u32,
    /// Writes kept in the shared-data log (the memory bound: 28 B each).
    pub log_capacity: u32,
    /// New index blocks of a record are published only if the record added
    /// at least this many characters beyond the prefix known at routing: a
    /// short new tail is cheap to prefill again, and short unique prompts
    /// or questions would dominate the sync traffic. Placement changes are
    /// always published.
    pub min_publish_chars: u32,
    /// A slot write that changes neither the tag nor the holders (a warm
    /// repeat) is published only if the peers' copy is older than this (s).
    pub refresh_publish_s: u32,
    /// Sync budget, basis points (1/10 000) of the request bytes: the item
    /// bytes a gateway's writes cost (sent to its `N − 1` peers, and as much
    /// received from them) stay within this share at any `N`, the longest
    /// new prefixes published first ([`crate::peers_budget`]); 0: no budget.
    pub sync_budget_bp: u32,
    /// Exchange the queued-prefill tokens per replica on every pull
    /// ([`crate::peers_queue`]): the Queue rule then sees the other
    /// gateways' queues too (default true).
    pub share_queued: bool,
    /// With `share_queued`: period of a queue-only pull of every peer, ms
    /// (`?queued`: an empty answer whose header carries the table), between
    /// the index pulls; 0: the tables travel with the index pulls only
    /// (every `pull_ms`). Default 25: the simulator's p90 at N = 2 / 4
    /// needs a fresher picture than a pull period (`docs/multi-gateway.md`,
    /// seventh session). Cost: one request and response head per peer and
    /// period, each way.
    pub queue_ms: u32,
    /// Publish a request's last block only when it is a ladder position
    /// ([`crate::peers_log::PeerLadder`]): elsewhere a peer finds it only
    /// for an exact repeat of the whole prompt. The local table is
    /// unchanged. Default true: −3 to −18 % of the sync total at N = 4 and
    /// no loss of hit rate in the simulator (`docs/multi-gateway.md`,
    /// ninth session).
    pub ladder_last: bool,
    /// Significant bits of the ladder positions published to the peers
    /// (0: every local ladder position; below the index's `ladder_bits`, 3:
    /// a coarser ladder, [`crate::peers_log::PeerLadder`]; the receiving
    /// lookup then searches the coarse positions,
    /// [`crate::index::IndexConfig::peer_bits`]). Every gateway of a
    /// deployment should use the same value. Default 0: 2 bits saves
    /// another 20–43 % of the sync total at N = 4 but the peers' shallower depths make
    /// them spill more, −0.8 point of hit rate on a held-out trace at N = 4
    /// (ninth session).
    pub publish_bits: u32,
    /// Seed of the index slot hash, derived from `secret`.
    pub index_secret: u64,
}

impl std::fmt::Debug for PeersParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeersParams")
            .field("cluster", &self.cluster)
            .field("admin_cluster", &self.admin_cluster)
            .field("path", &self.path)
            .field("secret", &"<redacted>")
            .field("pull_ms", &self.pull_ms)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_batch", &self.max_batch)
            .field("log_capacity", &self.log_capacity)
            .field("ladder_last", &self.ladder_last)
            .field("publish_bits", &self.publish_bits)
            .finish_non_exhaustive()
    }
}

impl PeersParams {
    /// Period of the queue exchange, ms: `queue_ms` when it is set and
    /// shorter than `pull_ms`, else `pull_ms` (the tables ride on the
    /// index pulls); `None` without `share_queued`.
    pub fn queue_period_ms(&self) -> Option<u32> {
        self.share_queued.then_some(match self.queue_ms {
            0 => self.pull_ms,
            q => q.min(self.pull_ms),
        })
    }

    /// Tick period the pulls need, ms: the shorter of `pull_ms` and the
    /// queue exchange's period.
    pub fn tick_ms(&self) -> u32 {
        self.queue_period_ms()
            .map_or(self.pull_ms, |q| q.min(self.pull_ms))
    }

    /// The batch layout id: slots and a fingerprint of the derived index key
    /// (see the module docs).
    pub fn layout(&self, slots: u32) -> u32 {
        let fp = format!("{:016x}", hash_id(&self.index_secret.to_le_bytes()));
        crate::peers::layout(slots, &[fp])
    }
}

/// Derive the index slot-hash seed from the shared secret.
pub fn derive_index_secret(secret: &str) -> u64 {
    hash_id(format!("prefix-router/index-secret/v1\n{secret}").as_bytes())
}

/// Validate the `peers` object; `admin_default` is the top-level `admin_cluster`.
///
/// # Errors
/// A [`ConfigError`] naming the field (`peers.<name>`).
pub fn validate(
    raw: Option<RawPeers>,
    admin_default: Option<&str>,
) -> Result<Option<PeersParams>, ConfigError> {
    let Some(r) = raw else { return Ok(None) };
    let cluster = match r.cluster.as_deref() {
        Some(c) => cluster_name("peers.cluster", c)?,
        None => {
            return Err(err(
                "peers.cluster",
                "is required: the Envoy cluster of the gateways (override_host policy)",
            ))
        }
    };
    let admin_cluster = match r.admin_cluster.as_deref().or(admin_default) {
        Some(a) => cluster_name("peers.admin_cluster", a)?,
        None => {
            return Err(err(
                "peers.admin_cluster",
                "is required without a top-level `admin_cluster`: a cluster whose host is Envoy's admin listener",
            ))
        }
    };
    if admin_cluster == cluster {
        return Err(err(
            "peers.admin_cluster",
            "must differ from `peers.cluster`",
        ));
    }
    let path = r.path.unwrap_or_else(|| DEFAULT_PATH.to_string());
    if !path.starts_with('/')
        || path.len() > 256
        || path
            .bytes()
            .any(|b| !(0x21..0x7f).contains(&b) || b == b'?')
    {
        return Err(err(
            "peers.path",
            format!("must be an absolute URL path without a query, got {path:?}"),
        ));
    }
    let secret = match r.secret {
        Some(s)
            if s.len() >= 16
                && s.len() <= 4096
                && !s.bytes().any(|b| !(0x21..0x7f).contains(&b)) =>
        {
            s
        }
        Some(_) => {
            return Err(err(
                "peers.secret",
                "must be 16 to 4096 printable ASCII characters without spaces",
            ))
        }
        None => {
            return Err(err(
                "peers.secret",
                "is required: the shared secret of the gateways (sent as a header on pulls)",
            ))
        }
    };
    let pull_ms = int_in_range("peers.pull_ms", r.pull_ms, (20u32, 60_000), 100)?;
    let timeout_ms = int_in_range("peers.timeout_ms", r.timeout_ms, (10u32, 60_000), 250)?;
    let hosts_refresh_ms = int_in_range(
        "peers.hosts_refresh_ms",
        r.hosts_refresh_ms,
        (100u32, 600_000),
        1000,
    )?;
    let max_batch = int_in_range("peers.max_batch", r.max_batch, (1u32, 65_536), 2048)?;
    let log_capacity = int_in_range(
        "peers.log_capacity",
        r.log_capacity,
        (16u32, 1 << 20),
        16_384,
    )?;
    let min_publish_chars = int_in_range(
        "peers.min_publish_chars",
        r.min_publish_chars,
        (0u32, 1 << 24),
        512,
    )?;
    let refresh_publish_s = int_in_range(
        "peers.refresh_publish_s",
        r.refresh_publish_s,
        (0u32, 86_400),
        120,
    )?;
    let sync_budget_bp = int_in_range("peers.sync_budget_bp", r.sync_budget_bp, (0u32, 10_000), 0)?;
    let queue_ms = int_in_range("peers.queue_ms", r.queue_ms, (0u32, 60_000), 25)?;
    if (1..10).contains(&queue_ms) {
        return Err(err("peers.queue_ms", "must be 0 (off) or at least 10"));
    }
    let publish_bits = int_in_range(
        "peers.publish_bits",
        r.publish_bits,
        (0u32, 16),
        DEFAULT_PUBLISH_BITS,
    )?;
    Ok(Some(PeersParams {
        index_secret: derive_index_secret(&secret),
        cluster,
        admin_cluster,
        path,
        secret,
        pull_ms,
        timeout_ms,
        hosts_refresh_ms,
        max_batch,
        log_capacity,
        min_publish_chars,
        refresh_publish_s,
        sync_budget_bp,
        share_queued: r.share_queued.unwrap_or(true),
        queue_ms,
        ladder_last: r.ladder_last.unwrap_or(DEFAULT_LADDER_LAST),
        publish_bits,
    }))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const EPS: &str = r#""endpoints":["127.0.0.1:1"]"#;

    fn parse(peers: &str) -> Result<Config, crate::config::ConfigError> {
        Config::from_json(format!(r#"{{{EPS},"peers":{peers}}}"#).as_bytes())
    }

    #[test]
    fn defaults_and_derived_key() {
        let c =
            parse(r#"{"cluster":"p","admin_cluster":"a","secret":"0123456789abcdef"}"#).unwrap();
        let p = c.peers.unwrap();
        assert_eq!(p.path, super::DEFAULT_PATH);
        assert_eq!(
            (p.pull_ms, p.max_batch, p.log_capacity),
            (100, 2048, 16_384)
        );
        assert_eq!(
            p.index_secret,
            super::derive_index_secret("0123456789abcdef")
        );
        assert_ne!(
            p.index_secret,
            super::derive_index_secret("0123456789abcdeX")
        );
        assert!(!format!("{p:?}").contains("0123456789abcdef"));
        assert!(p.share_queued);
        assert_eq!(
            (p.ladder_last, p.publish_bits),
            (super::DEFAULT_LADDER_LAST, super::DEFAULT_PUBLISH_BITS)
        );
        let q = parse(
            r#"{"cluster":"p","admin_cluster":"a","secret":"0123456789abcdef","ladder_last":false,"publish_bits":3}"#,
        )
        .unwrap()
        .peers
        .unwrap();
        assert_eq!((q.ladder_last, q.publish_bits), (false, 3));
        // The receiving lookup is told the peers' ladder.
        let r = crate::Router::new(
            parse(r#"{"cluster":"p","admin_cluster":"a","secret":"0123456789abcdef","publish_bits":1}"#)
                .unwrap(),
        );
        assert_eq!(r.index().config().peer_bits, 1);
        assert_eq!(
            (p.queue_ms, p.queue_period_ms(), p.tick_ms()),
            (25, Some(25), 25)
        );
        for (extra, period, tick) in [
            (r#""queue_ms":0"#, Some(100), 100),
            (r#""queue_ms":500"#, Some(100), 100),
            (r#""queue_ms":40,"share_queued":false"#, None, 100),
            (r#""queue_ms":10,"pull_ms":20"#, Some(10), 10),
        ] {
            let q = parse(&format!(
                r#"{{"cluster":"p","admin_cluster":"a","secret":"0123456789abcdef",{extra}}}"#
            ))
            .unwrap()
            .peers
            .unwrap();
            assert_eq!(
                (q.queue_period_ms(), q.tick_ms()),
                (period, tick),
                "{extra}"
            );
        }
        let off = r#"{"cluster":"p","admin_cluster":"a","secret":"0123456789abcdef","share_queued":false}"#;
        assert!(!parse(off).unwrap().peers.unwrap().share_queued);
        // Same secret → same layout; another secret → another layout.
        let q = parse(r#"{"cluster":"p","admin_cluster":"a","secret":"0123456789abcdeX"}"#)
            .unwrap()
            .peers
            .unwrap();
        assert_eq!(p.layout(64), p.clone().layout(64));
        assert_ne!(p.layout(64), q.layout(64));
        // admin_cluster from the top level (discovery).
        let d = Config::from_json(
            br#"{"cluster":"llm","admin_cluster":"adm","peers":{"cluster":"p","secret":"0123456789abcdef"}}"#,
        )
        .unwrap();
        assert_eq!(d.peers.unwrap().admin_cluster, "adm");
    }

    #[test]
    fn errors_name_the_field() {
        let s = r#""secret":"0123456789abcdef""#;
        for (peers, field) in [
            (format!(r#"{{"admin_cluster":"a",{s}}}"#), "peers.cluster"),
            (
                r#"{"cluster":"p","admin_cluster":"a"}"#.to_string(),
                "peers.secret",
            ),
            (
                r#"{"cluster":"p","admin_cluster":"a","secret":"short"}"#.to_string(),
                "peers.secret",
            ),
            (format!(r#"{{"cluster":"p",{s}}}"#), "peers.admin_cluster"),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"p",{s}}}"#),
                "peers.admin_cluster",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","path":"x",{s}}}"#),
                "peers.path",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","path":"/a?b",{s}}}"#),
                "peers.path",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","pull_ms":1,{s}}}"#),
                "peers.pull_ms",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","max_batch":0,{s}}}"#),
                "peers.max_batch",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","log_capacity":1,{s}}}"#),
                "peers.log_capacity",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","timeout_ms":0,{s}}}"#),
                "peers.timeout_ms",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","sync_budget_bp":10001,{s}}}"#),
                "peers.sync_budget_bp",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","queue_ms":5,{s}}}"#),
                "peers.queue_ms",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","queue_ms":-1,{s}}}"#),
                "peers.queue_ms",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","publish_bits":17,{s}}}"#),
                "peers.publish_bits",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","publish_bits":-1,{s}}}"#),
                "peers.publish_bits",
            ),
            (
                format!(r#"{{"cluster":"p","admin_cluster":"a","bogus":1,{s}}}"#),
                "peers",
            ),
        ] {
            let e = parse(&peers).unwrap_err();
            assert_eq!(e.field, field, "{peers}: {e}");
        }
    }
}
