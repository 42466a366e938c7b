//! Floor filters of the overhead benchmark (see Cargo.toml): the plugin
//! configuration (a `StringValue`) selects the mode. Bench-only: this crate is
//! never shipped and the product has no such mode.
//!
//! - `noop`: every callback returns Continue;
//! - `read`: pause on headers, buffer the body, read it into the VM once;
//! - `hostcalls`: `read` plus the host calls prefix-router (`affinity`) makes
//!   for one request, in the same callbacks, with no routing work: header
//!   remove and 2 replaces, shared-data get of the in-flight counts, a clock
//!   read, get + set of one index slot, set of the counts, a gauge, 3 counter
//!   increments; on response headers the `upstream.address` property and the
//!   `content-type` header; on log a get + set of the counts and a gauge. So
//!   `hostcalls - read` is the price of those host calls alone.
//! - `override=ADDR`: `hostcalls`, but the target is written under the real
//!   `x-gateway-destination-endpoint` header with ADDR, so Envoy's
//!   `override_host` lookup sends the request to ADDR as the filter would;
//!   `override - hostcalls` is what Envoy spends on honouring the target.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType};

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

#[derive(Default)]
struct FloorRoot {
    mode: Mode,
    metrics: [u32; 4],
    /// `Some(ADDR)` in `override=ADDR` mode.
    target: Option<String>,
}

const COUNTS: &str = "bench_floor/inflight";
const SLOT: &str = "bench_floor/i/1f2e";

impl Context for FloorRoot {}

impl RootContext for FloorRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let conf = self.get_plugin_configuration().unwrap_or_default();
        self.target = conf
            .strip_prefix(b"override=")
            .map(|a| String::from_utf8_lossy(a).into_owned());
        self.mode = match conf.as_slice() {
            b"read" => Mode::Read,
            b"hostcalls" => Mode::HostCalls,
            _ if self.target.is_some() => Mode::HostCalls,
            _ => Mode::Noop,
        };
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
                self.metrics[i] = hostcalls::define_metric(kind, name).unwrap_or(0);
            }
            let _ = hostcalls::set_shared_data(COUNTS, Some(&[0u8; 28]), None);
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(FloorHttp {
            mode: self.mode,
            metrics: self.metrics,
            target: self.target.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct FloorHttp {
    mode: Mode,
    metrics: [u32; 4],
    target: Option<String>,
}

impl FloorHttp {
    /// The shared-data counts: one get and one (unconditional) set.
    fn bump_counts(&self) {
        let (v, _) = hostcalls::get_shared_data(COUNTS).unwrap_or((None, None));
        let v = v.unwrap_or_default();
        let _ = hostcalls::set_shared_data(COUNTS, Some(&v), None);
        let _ = hostcalls::record_metric(self.metrics[3], v.len() as u64);
    }
}

impl Context for FloorHttp {}

impl HttpContext for FloorHttp {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.mode == Mode::HostCalls {
            self.set_http_request_header("x-gateway-destination-endpoint", None);
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
            let (counts, _) = hostcalls::get_shared_data(COUNTS).unwrap_or((None, None));
            std::hint::black_box(self.get_current_time());
            let (slot, _) = hostcalls::get_shared_data(SLOT).unwrap_or((None, None));
            let _ = hostcalls::set_shared_data(SLOT, Some(&slot.unwrap_or(vec![1; 16])), None);
            let _ = hostcalls::set_shared_data(COUNTS, Some(&counts.unwrap_or_default()), None);
            let _ = hostcalls::record_metric(self.metrics[3], 1);
            // Same size as a real target; another name, so Envoy routes as usual
            // (what the override_host policy does with the header is not counted).
            match self.target.as_deref() {
                Some(addr) => {
                    self.set_http_request_header("x-gateway-destination-endpoint", Some(addr))
                }
                None => self.set_http_request_header(
                    "x-bench-floor-destination",
                    Some("127.0.0.1:19404,127.0.0.1:19405"),
                ),
            }
            self.set_http_request_header("x-prefix-router-decision", Some("hit"));
            for id in &self.metrics[..3] {
                let _ = hostcalls::increment_metric(*id, 1);
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if self.mode == Mode::HostCalls {
            std::hint::black_box(self.get_property(vec!["upstream", "address"]));
            std::hint::black_box(self.get_http_response_header("content-type"));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.mode == Mode::HostCalls {
            self.bump_counts();
        }
    }
}
