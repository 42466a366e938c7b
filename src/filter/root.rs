//! Root context: configuration, shared state, stats, and (with `cluster`)
//! the admin poll on ticks.

use super::host::{self, HostShared, BUFFER_PLUGIN_CONFIGURATION};
use super::http::RouterHttp;
use super::poll::Poller;
use super::stats::Stats;
use crate::cluster::request::Releases;
use crate::cluster::sync::Follower;
use crate::cluster::tables::{Down, InFlight, Keys};
use crate::config::{Config, Strategy};
use crate::cost::CostModel;
use crate::hash::hash_id;
use crate::router::Router;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::RefCell;
use std::rc::Rc;

/// Everything a request needs, shared by the HTTP contexts of one VM.
pub struct Plugin {
    /// The configuration and the current membership view.
    pub follower: Follower,
    /// Shared-data keys (namespace without a configuration fingerprint).
    pub keys: Keys,
    /// Shared round-robin counter key.
    pub rr_key: String,
    /// `affinity` prices, learned per worker from observed TTFTs.
    pub cost: RefCell<CostModel>,
    /// Metric ids.
    pub stats: Stats,
    /// Generation whose endpoints have their metrics defined.
    pub stats_generation: std::cell::Cell<u64>,
    /// Predicted vs delivered: metrics and eviction horizons.
    pub delivered: super::delivered::Shared,
    /// Peer exchange state (`peers` set).
    pub peers: Option<super::peers::Shared>,
}

impl Plugin {
    /// The configuration.
    pub fn config(&self) -> &Config {
        self.follower.config()
    }

    /// The prefix index's slots in shared data (one host callback's store).
    pub fn index_slots(&self) -> super::slots::SharedSlots<'_> {
        super::slots::index(&self.keys.prefix, self.config().affinity.index_slots)
    }

    /// Does the strategy read the body?
    pub fn needs_body(&self) -> bool {
        matches!(
            self.config().strategy,
            Strategy::Prefix | Strategy::Session | Strategy::Affinity
        )
    }
}

/// The root context; holds the plugin once configured.
#[derive(Default)]
pub struct RouterRoot {
    plugin: Option<Rc<Plugin>>,
    poller: Poller,
    puller: super::peers::Puller,
    context_id: u32,
    /// Ticks seen, and every how many ticks the stats are flushed.
    ticks: u32,
    flush_every: u32,
}

impl RouterRoot {
    /// Root context `context_id`.
    pub fn new(context_id: u32) -> RouterRoot {
        RouterRoot {
            context_id,
            ..RouterRoot::default()
        }
    }
}

impl Context for RouterRoot {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(p) = self.plugin.clone() {
            if self.puller.response(&p, token_id, body_size) {
                return;
            }
            if let Some(d) = &p.config().discovery {
                self.poller.response(&p, d, token_id, body_size);
            }
        }
        super::batch::flush();
    }
}

impl RootContext for RouterRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        host::sync_log_level();
        let bytes = match host::buffer(BUFFER_PLUGIN_CONFIGURATION, 0, usize::MAX) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(e) => {
                log::error!("cannot read the plugin configuration: {e}");
                return false;
            }
        };
        let config = match Config::from_json(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        let plugin_name = match host::property(&["plugin_name"]) {
            Ok(Some(n)) => String::from_utf8_lossy(&n).into_owned(),
            _ => String::new(),
        };
        // Namespaced by plugin (Istio leaves vm_id empty, so several plugins
        // may share one shared-data namespace), NOT by configuration: a push
        // keeps in-flight counts, down marks, membership and the index.
        let keys = Keys::new(&plugin_name);
        for (key, init) in [
            (
                &keys.inflight,
                InFlight::init::<HostShared> as fn(&HostShared, &str) -> _,
            ),
            (&keys.down, Down::init::<HostShared>),
        ] {
            if let Err(e) = init(&HostShared, key) {
                log::error!("cannot initialise shared data ({key}): {e:?}");
                return false;
            }
        }
        let stats = Stats::define();
        stats.members(&config.endpoints);
        log::info!(
            "configured: strategy={} endpoints={} cluster={} prefix_length={} concurrency_threshold={} load_factor={} plugin={plugin_name:?}",
            config.strategy.as_str(),
            config.endpoints.len(),
            config.discovery.as_ref().map_or("-", |d| d.cluster.as_str()),
            config.prefix_length,
            config.concurrency_threshold,
            config.load_factor
        );
        // With `peers`, every gateway keys the index with the secret derived
        // from the shared one (same slots everywhere); else a per-process one.
        let secret = match (&config.peers, super::secret::get_or_create(self.context_id)) {
            (Some(pc), _) => pc.index_secret,
            (None, Ok(s)) => s,
            (None, Err(e)) => {
                log::error!("cannot read or store the index secret: {e}");
                return false;
            }
        };
        let peers = match &config.peers {
            Some(pc) => {
                match super::peers::Shared::new(
                    &keys.prefix,
                    pc,
                    config.affinity.index_slots,
                    self.context_id,
                ) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        log::error!("{e}");
                        return false;
                    }
                }
            }
            None => None,
        };
        let cost = RefCell::new(CostModel::new(Router::new(config.clone()).cost_config()));
        // Ticks write the VM's waiting in-flight changes (every
        // `Releases::PUBLISH_MS`), publish batched stats (every FLUSH_MS)
        // and, with `cluster` or `peers`, poll and pull (each keeps its own
        // period).
        let poll_tick = config.discovery.as_ref().map(|d| {
            config
                .engine
                .as_ref()
                .map_or(d.refresh_ms, |e| e.refresh_ms.min(d.refresh_ms))
        });
        let pull_tick = config.peers.as_ref().map(|pc| pc.tick_ms());
        let flush_ms = u32::try_from(super::batch::FLUSH_MS).unwrap_or(u32::MAX);
        let publish_ms = u32::try_from(Releases::PUBLISH_MS).unwrap_or(u32::MAX);
        let tick = [poll_tick, pull_tick, Some(publish_ms)]
            .into_iter()
            .flatten()
            .fold(flush_ms, u32::min);
        self.flush_every = (flush_ms / tick.max(1)).max(1);
        if let Err(e) = host::set_tick_period_ms(tick) {
            log::error!("cannot set the tick period: {e}");
            return false;
        }
        let follower = Follower::new(config).with_index_secret(secret);
        follower.adopt(&HostShared, &keys);
        self.poller = Poller::new(hash_id(
            &[
                host::now_nanos().to_le_bytes(),
                u64::from(self.context_id).to_le_bytes(),
                (&self.poller as *const Poller as usize as u64).to_le_bytes(),
            ]
            .concat(),
        ));
        self.puller = super::peers::Puller::new(self.poller.owner);
        self.plugin = Some(Rc::new(Plugin {
            follower,
            rr_key: format!("{}rr", keys.prefix),
            delivered: super::delivered::Shared::new(&keys.prefix),
            keys,
            cost,
            stats,
            peers,
            stats_generation: std::cell::Cell::new(0),
        }));
        true
    }

    fn on_tick(&mut self) {
        if let Some(p) = self.plugin.clone() {
            if let Some(d) = &p.config().discovery {
                self.poller.tick(&p, d);
            }
            self.puller.tick(&p);
            super::local::flush_releases(&p);
        }
        // Stats every FLUSH_MS (the tick may be faster).
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks % self.flush_every.max(1) == 0 {
            super::batch::flush();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(RouterHttp::new(self.plugin.clone(), context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
