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
//! - [`poll`]: the admin poll under a lease (`cluster` set);
//! - [`peers`]: peer exchange of index writes between gateways (`peers` set);
//! - [`health`]: passive health (a primary that did not serve is marked down);
//! - [`slots`]: the `affinity` prefix index's slot table in shared data;
//! - [`secret`]: the per-process secret keying the index's slot hash;
//! - [`stats`]: Envoy stats;
//! - [`batch`]: counter and gauge updates batched in the VM, published in bursts;
//! - [`tally`]: host calls per request by kind (debug log, a measuring instrument);
//! - `alloc` (feature `alloccount`): allocations counted for the cost adapter;
//! - [`probe`]: build-time ablations (`PR_ABLATE`) and the `selfprof` phase timer;
//! - [`delivered`]: predicted vs delivered cached tokens, read from the
//!   response as it passes, and the index feedback.

#[cfg(feature = "alloccount")]
mod alloc;
mod batch;
mod delivered;
mod health;
mod host;
mod http;
mod local;
mod peers;
mod poll;
mod probe;
mod root;
mod secret;
mod slots;
mod stats;
mod tally;

proxy_wasm::main! {{
    host::init_logging();
    proxy_wasm::set_root_context(|context_id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::RouterRoot::new(context_id))
    });
}}
