//! Root context: configuration, shared state, stats.

use super::host::{self, BUFFER_PLUGIN_CONFIGURATION};
use super::http::RouterHttp;
use super::inflight::InFlight;
use super::stats::Stats;
use crate::config::Config;
use crate::cost::CostModel;
use crate::hash::hash_id;
use crate::router::Router;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::RefCell;
use std::rc::Rc;

/// Everything a request needs, shared by the HTTP contexts of one VM.
pub struct Plugin {
    /// The routing core.
    pub router: Router,
    /// Shared in-flight counts.
    pub in_flight: InFlight,
    /// Shared round-robin counter key.
    pub rr_key: String,
    /// Shared-data namespace of this plugin and configuration (`…/`).
    pub prefix: String,
    /// `affinity` prices, learned per worker from observed TTFTs.
    pub cost: RefCell<CostModel>,
    /// Metric ids.
    pub stats: Stats,
    /// Predicted vs delivered: metrics and eviction horizons.
    pub delivered: super::delivered::Shared,
}

/// The root context; holds the plugin once configured.
#[derive(Default)]
pub struct RouterRoot {
    plugin: Option<Rc<Plugin>>,
}

impl Context for RouterRoot {}

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
        // Namespaced by plugin and configuration: Istio leaves vm_id empty, so
        // several plugins may share one shared-data namespace.
        let prefix = format!("prefix_router/{plugin_name}/{:016x}/", hash_id(&bytes));
        let in_flight = InFlight::new(&prefix, config.endpoints.len());
        if let Err(e) = in_flight.init() {
            log::error!("cannot initialise shared data ({prefix}inflight): {e}");
            return false;
        }
        let stats = Stats::define(&config.endpoints);
        log::info!(
            "configured: strategy={} endpoints={} prefix_length={} concurrency_threshold={} load_factor={} plugin={plugin_name:?}",
            config.strategy.as_str(),
            config.endpoints.len(),
            config.prefix_length,
            config.concurrency_threshold,
            config.load_factor
        );
        let secret = match super::secret::get_or_create(hash_id(&bytes) as u32) {
            Ok(s) => s,
            Err(e) => {
                log::error!("cannot read or store the index secret: {e}");
                return false;
            }
        };
        let router = Router::new(config).with_index_secret(secret);
        let cost = RefCell::new(CostModel::new(router.cost_config()));
        let delivered = super::delivered::Shared::new(&router.config().endpoints, &prefix);
        self.plugin = Some(Rc::new(Plugin {
            router,
            in_flight,
            rr_key: format!("{prefix}rr"),
            delivered,
            prefix,
            cost,
            stats,
        }));
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(RouterHttp::new(self.plugin.clone(), context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
