//! Floor filters of the overhead benchmark (see Cargo.toml): the plugin
//! configuration (a `StringValue`) selects the mode. Bench-only: this crate is
//! never shipped and the product has no such mode.
//!
//! - `noop`: every callback returns Continue;
//! - `read`: pause on headers, buffer the body, read it into the VM once;
//! - `hostcalls`: `read` plus the host calls prefix-router (`affinity`) makes
//!   for one 16 KiB request at c=8 (`./build.sh bench hostcalls`), in the
//!   same callbacks, with no routing work: on request headers the client
//!   target header remove and one header-map read; on the body the in-flight
//!   and down-mark shared-data gets, a clock read, get + set of one index
//!   slot, set of the counts, a gauge, 2 header replaces (target, decision),
//!   one counter increment; on response headers the `upstream.address`
//!   property and one header-map read; on the first response chunk a read of
//!   it; on log a clock read, get + set of the counts and the access-log
//!   property. So `hostcalls - read` is the price of those host calls alone.
//! - `override=ADDR`: `hostcalls`, but the target is written under the real
//!   `x-gateway-destination-endpoint` header with ADDR, so Envoy's
//!   `override_host` lookup sends the request to ADDR as the filter would;
//!   `override - hostcalls` is what Envoy spends on honouring the target.
//! - Pricing modifiers after `hostcalls` (space-separated, any number):
//!   `skip=KIND` leaves out every call of KIND, `extra=KIND*N` makes N more
//!   calls of KIND on the request body (before the body is released), so
//!   (H with `extra=KIND*N` − H) / N prices one call of KIND. KIND is a name of
//!   `src/filter/tally.rs`: `header_get`, `header_set`, `header_remove`,
//!   `buffer_get`, `property_get`, `property_set`, `shared_get`,
//!   `shared_set`, `metric_increment`, `metric_record`, `clock`; plus
//!   `shared_get_big` (a get of a 4 KiB value) and `header_set_fresh` (N
//!   replaces of N distinct new headers).

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(FloorRoot::default()) });
}}

#[derive(Clone, Copy, Default, PartialEq)]
enum Mode {
    #[default]
    Noop,
    Read,
    HostCalls,
}

/// Kinds of host call the floor can skip or repeat.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    HeaderGet,
    HeaderSet,
    HeaderSetFresh,
    HeaderRemove,
    BufferGet,
    PropertyGet,
    PropertySet,
    SharedGet,
    SharedGetBig,
    SharedSet,
    MetricIncrement,
    MetricRecord,
    Clock,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "header_get" => Kind::HeaderGet,
            "header_set" => Kind::HeaderSet,
            "header_set_fresh" => Kind::HeaderSetFresh,
            "header_remove" => Kind::HeaderRemove,
            "buffer_get" => Kind::BufferGet,
            "property_get" => Kind::PropertyGet,
            "property_set" => Kind::PropertySet,
            "shared_get" => Kind::SharedGet,
            "shared_get_big" => Kind::SharedGetBig,
            "shared_set" => Kind::SharedSet,
            "metric_increment" => Kind::MetricIncrement,
            "metric_record" => Kind::MetricRecord,
            "clock" => Kind::Clock,
            _ => return None,
        })
    }
}

/// The `hostcalls` mode's settings.
#[derive(Clone, Default)]
struct Calls {
    /// `Some(ADDR)` in `override=ADDR` mode.
    target: Option<String>,
    skip: Vec<Kind>,
    extra: Option<(Kind, u32)>,
    metrics: [u32; 4],
}

impl Calls {
    fn on(&self, k: Kind) -> bool {
        !self.skip.contains(&k)
    }
}

#[derive(Default)]
struct FloorRoot {
    mode: Mode,
    calls: Calls,
}

const COUNTS: &str = "bench_floor/inflight";
const DOWN: &str = "bench_floor/down";
const BIG: &str = "bench_floor/big";
const SLOT: &str = "bench_floor/i/1f2e";

impl Context for FloorRoot {}

impl RootContext for FloorRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let conf = self.get_plugin_configuration().unwrap_or_default();
        let conf = String::from_utf8_lossy(&conf).into_owned();
        let mut words = conf.split_whitespace();
        let head = words.next().unwrap_or("");
        self.calls.target = head.strip_prefix("override=").map(str::to_owned);
        self.mode = match head {
            "read" => Mode::Read,
            "hostcalls" => Mode::HostCalls,
            _ if self.calls.target.is_some() => Mode::HostCalls,
            _ => Mode::Noop,
        };
        for w in words {
            if let Some(k) = w.strip_prefix("skip=").and_then(Kind::parse) {
                self.calls.skip.push(k);
            } else if let Some((k, n)) = w.strip_prefix("extra=").and_then(|e| e.split_once('*')) {
                if let (Some(k), Ok(n)) = (Kind::parse(k), n.parse()) {
                    self.calls.extra = Some((k, n));
                }
            }
        }
        if self.mode == Mode::HostCalls {
            for (i, (kind, name)) in [
                (MetricType::Counter, "bench_floor.branch"),
                (MetricType::Counter, "bench_floor.source"),
                (MetricType::Counter, "bench_floor.routed"),
                (MetricType::Gauge, "bench_floor.in_flight"),
            ]
            .into_iter()
            .enumerate()
            {
                self.calls.metrics[i] = hostcalls::define_metric(kind, name).unwrap_or(0);
            }
            let _ = hostcalls::set_shared_data(COUNTS, Some(&[0u8; 28]), None);
            let _ = hostcalls::set_shared_data(DOWN, Some(&[0u8; 8]), None);
            let _ = hostcalls::set_shared_data(BIG, Some(&[7u8; 4096]), None);
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(FloorHttp {
            mode: self.mode,
            calls: self.calls.clone(),
            chunk_read: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct FloorHttp {
    mode: Mode,
    calls: Calls,
    chunk_read: bool,
}

impl FloorHttp {
    /// One host call of kind `k`, with arguments like the router's.
    fn one(&self, k: Kind, i: u32) {
        let m = &self.calls.metrics;
        match k {
            Kind::HeaderGet => {
                std::hint::black_box(self.get_http_request_headers_bytes());
            }
            Kind::HeaderSet => self.set_http_request_header("x-bench-floor-extra", Some("hit")),
            Kind::HeaderSetFresh => {
                self.set_http_request_header(&format!("x-bench-floor-extra-{i}"), Some("hit"))
            }
            Kind::HeaderRemove => self.set_http_request_header("x-bench-floor-absent", None),
            Kind::BufferGet => {
                std::hint::black_box(self.get_http_request_body(0, 64));
            }
            Kind::PropertyGet => {
                std::hint::black_box(self.get_property(vec!["upstream", "address"]));
            }
            Kind::PropertySet => self.set_property(
                vec!["bench_floor"],
                Some(b"{\"predicted\":0,\"delivered\":null}"),
            ),
            Kind::SharedGet => {
                std::hint::black_box(hostcalls::get_shared_data(COUNTS).ok());
            }
            Kind::SharedGetBig => {
                std::hint::black_box(hostcalls::get_shared_data(BIG).ok());
            }
            Kind::SharedSet => {
                let _ = hostcalls::set_shared_data(SLOT, Some(&[1; 16]), None);
            }
            Kind::MetricIncrement => {
                let _ = hostcalls::increment_metric(m[0], 1);
            }
            Kind::MetricRecord => {
                let _ = hostcalls::record_metric(m[3], u64::from(i));
            }
            Kind::Clock => {
                std::hint::black_box(self.get_current_time());
            }
        }
    }

    /// The request headers as one host call (`proxy_get_header_map_pairs`).
    fn get_http_request_headers_bytes(&self) -> Option<Vec<(String, Vec<u8>)>> {
        hostcalls::get_map_bytes(MapType::HttpRequestHeaders).ok()
    }
}

impl Context for FloorHttp {}

impl HttpContext for FloorHttp {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::HostCalls {
            if self.calls.on(Kind::HeaderRemove) {
                self.set_http_request_header("x-gateway-destination-endpoint", None);
            }
            if self.calls.on(Kind::HeaderGet) {
                std::hint::black_box(self.get_http_request_headers_bytes());
            }
        }
        if self.mode != Mode::Noop && !end_of_stream {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::Noop {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        // Copy the whole body into the VM, as the router does, and keep the
        // optimiser from dropping the read.
        let body = self.get_http_request_body(0, size);
        std::hint::black_box(body.map_or(0, |b| b.len()));
        if self.mode == Mode::HostCalls {
            let c = &self.calls;
            let mut counts = None;
            if c.on(Kind::SharedGet) {
                counts = hostcalls::get_shared_data(COUNTS).ok().and_then(|v| v.0);
                std::hint::black_box(hostcalls::get_shared_data(DOWN).ok());
            }
            if c.on(Kind::Clock) {
                std::hint::black_box(self.get_current_time());
            }
            let mut slot = None;
            if c.on(Kind::SharedGet) {
                slot = hostcalls::get_shared_data(SLOT).ok().and_then(|v| v.0);
            }
            if c.on(Kind::SharedSet) {
                let _ = hostcalls::set_shared_data(SLOT, Some(&slot.unwrap_or(vec![1; 16])), None);
                let _ = hostcalls::set_shared_data(COUNTS, Some(&counts.unwrap_or_default()), None);
            }
            if c.on(Kind::MetricRecord) {
                let _ = hostcalls::record_metric(c.metrics[3], 1);
            }
            if c.on(Kind::HeaderSet) {
                // Same size as a real target; another name, so Envoy routes as usual
                // (what the override_host policy does with the header is not counted).
                match c.target.as_deref() {
                    Some(addr) => {
                        self.set_http_request_header("x-gateway-destination-endpoint", Some(addr))
                    }
                    None => self.set_http_request_header(
                        "x-bench-floor-destination",
                        Some("127.0.0.1:19404,127.0.0.1:19405"),
                    ),
                }
                self.set_http_request_header("x-prefix-router-decision", Some("hit"));
            }
            if c.on(Kind::MetricIncrement) {
                let _ = hostcalls::increment_metric(c.metrics[0], 1);
            }
            if let Some((k, n)) = c.extra {
                for i in 0..n {
                    self.one(k, i);
                }
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if self.mode == Mode::HostCalls {
            if self.calls.on(Kind::PropertyGet) {
                std::hint::black_box(self.get_property(vec!["upstream", "address"]));
            }
            if self.calls.on(Kind::HeaderGet) {
                std::hint::black_box(hostcalls::get_map_bytes(MapType::HttpResponseHeaders).ok());
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, _end_of_stream: bool) -> Action {
        if self.mode == Mode::HostCalls && self.calls.on(Kind::BufferGet) && !self.chunk_read {
            self.chunk_read = true;
            std::hint::black_box(
                hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size).ok(),
            );
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.mode == Mode::HostCalls {
            let c = &self.calls;
            if c.on(Kind::Clock) {
                std::hint::black_box(self.get_current_time());
            }
            let mut v = None;
            if c.on(Kind::SharedGet) {
                v = hostcalls::get_shared_data(COUNTS).ok().and_then(|v| v.0);
            }
            if c.on(Kind::SharedSet) {
                let _ = hostcalls::set_shared_data(COUNTS, Some(&v.unwrap_or_default()), None);
            }
            if c.on(Kind::PropertySet) {
                self.one(Kind::PropertySet, 0);
            }
        }
    }
}
