//! Host calls per request, counted by kind (a measuring instrument).
//!
//! Every wrapper in [`super::host`] bumps one VM-local cell (a plain
//! increment: the VM is single-threaded, the cost is a load and a store).
//! `on_log` writes, at debug level only, the calls made since the previous
//! `on_log` of this VM: with one request at a time (`c=1`) that is exactly
//! one request's host calls, the setting `./build.sh bench hostcalls` uses.
//! `proxy_log` itself is not counted (it only runs at debug level).

use std::cell::Cell;

/// Kinds of host call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCall {
    /// `proxy_get_header_map_value` (request, response, dispatch response).
    HeaderGet,
    /// `proxy_replace_header_map_value`.
    HeaderSet,
    /// `proxy_remove_header_map_value`.
    HeaderRemove,
    /// `proxy_get_buffer_bytes` (request body, response chunk, configuration).
    BufferGet,
    /// `proxy_get_property`.
    PropertyGet,
    /// `proxy_set_property`.
    PropertySet,
    /// `proxy_get_shared_data`.
    SharedGet,
    /// `proxy_set_shared_data`.
    SharedSet,
    /// `proxy_increment_metric`.
    MetricIncrement,
    /// `proxy_record_metric`.
    MetricRecord,
    /// `proxy_define_metric`.
    MetricDefine,
    /// `proxy_get_current_time_nanoseconds`.
    Clock,
    /// Anything else (log level, tick period).
    Other,
}

const KINDS: usize = 13;

/// Names in [`HostCall`] order (the log line's keys).
const NAMES: [&str; KINDS] = [
    "header_get",
    "header_set",
    "header_remove",
    "buffer_get",
    "property_get",
    "property_set",
    "shared_get",
    "shared_set",
    "metric_increment",
    "metric_record",
    "metric_define",
    "clock",
    "other",
];

thread_local! {
    static CALLS: [Cell<u32>; KINDS] = const { [const { Cell::new(0) }; KINDS] };
}

/// Count one host call.
#[inline]
pub fn count(kind: HostCall) {
    CALLS.with(|c| {
        if let Some(cell) = c.get(kind as usize) {
            cell.set(cell.get().wrapping_add(1));
        }
    });
}

/// The calls counted since the previous `take`, as `total=N kind=n …`
/// (kinds with no call left out); resets the counts.
pub fn take_line() -> String {
    let mut total = 0u32;
    let mut parts = String::new();
    CALLS.with(|c| {
        for (cell, name) in c.iter().zip(NAMES) {
            let n = cell.replace(0);
            if n > 0 {
                total = total.wrapping_add(n);
                parts.push_str(&format!(" {name}={n}"));
            }
        }
    });
    format!("total={total}{parts}")
}
