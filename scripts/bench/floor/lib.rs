//! Floor filters of the overhead benchmark (see Cargo.toml): the plugin
//! configuration (a `StringValue`) selects `noop` or `read`. Bench-only: this
//! crate is never shipped and the product has no such mode.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(FloorRoot { read: false }) });
}}

struct FloorRoot {
    read: bool,
}

impl Context for FloorRoot {}

impl RootContext for FloorRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        self.read = self.get_plugin_configuration().as_deref() == Some(b"read".as_slice());
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(FloorHttp { read: self.read }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct FloorHttp {
    read: bool,
}

impl Context for FloorHttp {}

impl HttpContext for FloorHttp {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.read && !end_of_stream {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if !self.read {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        // Copy the whole body into the VM, as the router does, and keep the
        // optimiser from dropping the read.
        let body = self.get_http_request_body(0, size);
        std::hint::black_box(body.map_or(0, |b| b.len()));
        Action::Continue
    }
}
