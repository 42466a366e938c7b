//! The proxy-wasm adapter: the only part of the crate that talks to the host.
//!
//! - [`root`]: `on_configure` parses and validates the plugin configuration
//!   (refused with a log line naming the field), builds the [`crate::Router`],
//!   initialises shared data and defines the stats;
//! - [`http`]: per request, pauses on headers only when a body follows,
//!   buffers it to end of stream (or `max_body_bytes`), asks the router, sets
//!   the `override_host` header and the decision header, counts in-flight
//!   requests and releases them exactly once in `on_log`;
//! - [`host`]: host calls that return every status instead of panicking;
//! - [`inflight`]: the shared per-endpoint in-flight counts (CAS);
//! - [`slots`]: the `affinity` prefix index's slot table in shared data;
//! - [`secret`]: the per-process secret keying the index's slot hash;
//! - [`stats`]: Envoy stats;
//! - [`delivered`]: predicted vs delivered cached tokens, read from the
//!   response as it passes, and the index feedback.

mod delivered;
mod host;
mod http;
mod inflight;
mod root;
mod secret;
mod slots;
mod stats;

proxy_wasm::main! {{
    host::init_logging();
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::RouterRoot::default())
    });
}}
