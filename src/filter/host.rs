//! Host calls that never panic.
//!
//! The proxy-wasm SDK's `hostcalls` (and the `Context` helpers built on them)
//! `panic!` on any status they do not expect, and a panic aborts the VM of the
//! whole worker. This module calls the proxy-wasm ABI 0.2.1 imports directly and
//! returns every status to the caller as a [`HostError`]. The host hands back
//! memory allocated through the SDK's exported `proxy_on_memory_allocate`
//! (a boxed slice of exactly `size` bytes), which is reclaimed here as a `Vec`
//! of the same length and capacity, as the SDK itself does.

use super::tally::{count, HostCall};
use crate::cluster::shared::{ShareError, SharedData};
use std::fmt;
use std::ptr::{null, null_mut};

/// A non-OK status from the host (raw ABI status code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub u32);

/// ABI status `CasMismatch`.
pub const CAS_MISMATCH: HostError = HostError(8);

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            1 => "NotFound",
            2 => "BadArgument",
            3 => "SerializationFailure",
            4 => "ParseFailure",
            7 => "Empty",
            8 => "CasMismatch",
            10 => "InternalFailure",
            12 => "Unimplemented",
            _ => "Unknown",
        };
        write!(f, "host status {} ({name})", self.0)
    }
}

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const EMPTY: u32 = 7;

const MAP_REQUEST_HEADERS: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;
const MAP_HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
/// Buffer type of a `dispatch_http_call` response body.
pub const BUFFER_HTTP_CALL_RESPONSE_BODY: u32 = 4;
/// Buffer type of the request body.
pub const BUFFER_REQUEST_BODY: u32 = 0;
/// Buffer type of the plugin configuration.
pub const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;

/// Metric kinds of `proxy_define_metric`.
#[derive(Debug, Clone, Copy)]
pub enum MetricKind {
    /// Monotonic counter.
    Counter = 0,
    /// Gauge.
    Gauge = 1,
    /// Histogram (`record_metric` adds a sample).
    Histogram = 2,
}

/// Log levels of `proxy_log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Trace.
    Trace = 0,
    /// Debug.
    Debug = 1,
    /// Info.
    Info = 2,
    /// Warn.
    Warn = 3,
    /// Error.
    Error = 4,
}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_size: usize) -> u32;
    fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_set_property(path: *const u8, path_size: usize, data: *const u8, size: usize) -> u32;
}

/// Ask for `on_tick` every `ms` milliseconds (0 stops it).
pub fn set_tick_period_ms(ms: u32) -> Result<(), HostError> {
    count(HostCall::Other);
    // SAFETY: plain value.
    status(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// A header of the current `dispatch_http_call` response (`:status` …).
pub fn http_call_response_header(name: &str) -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::HeaderGet);
    // SAFETY: pointer and length of a live str; valid out pointers.
    fetch(|d, s| unsafe {
        proxy_get_header_map_value(
            MAP_HTTP_CALL_RESPONSE_HEADERS,
            name.as_ptr(),
            name.len(),
            d,
            s,
        )
    })
}

/// Shared data through the host, for the pure core's [`SharedData`] users.
pub struct HostShared;

fn share_error(e: HostError) -> ShareError {
    if e == CAS_MISMATCH {
        ShareError::CasMismatch
    } else {
        ShareError::Host(e.0)
    }
}

impl SharedData for HostShared {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), ShareError> {
        shared_get(key).map_err(share_error)
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), ShareError> {
        shared_set(key, value, cas).map_err(share_error)
    }
}

fn status(code: u32) -> Result<(), HostError> {
    if code == OK {
        Ok(())
    } else {
        Err(HostError(code))
    }
}

/// Take ownership of host-returned memory.
///
/// # Safety
/// `data` must be null or a pointer the host obtained from
/// `proxy_on_memory_allocate(size)`.
unsafe fn take(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        None
    } else {
        Some(Vec::from_raw_parts(data, size, size))
    }
}

/// Fetch bytes through a "return data + size" host call; NotFound / Empty → `None`.
fn fetch(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Result<Option<Vec<u8>>, HostError> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    let code = call(&mut data, &mut size);
    match code {
        // SAFETY: on OK the host allocated `data` through proxy_on_memory_allocate.
        OK => Ok(unsafe { take(data, size) }),
        NOT_FOUND | EMPTY => Ok(None),
        other => Err(HostError(other)),
    }
}

/// Write a log line; failures are ignored (there is nowhere to report them).
pub fn log(level: Level, message: &str) {
    // SAFETY: pointer and length of a live str.
    let _ = unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) };
}

/// The host's current log level (Info if it cannot be read).
pub fn log_level() -> Level {
    count(HostCall::Other);
    let mut l: u32 = Level::Info as u32;
    // SAFETY: valid out pointer.
    let code = unsafe { proxy_get_log_level(&mut l) };
    if code != OK {
        return Level::Info;
    }
    match l {
        0 => Level::Trace,
        1 => Level::Debug,
        2 => Level::Info,
        3 => Level::Warn,
        _ => Level::Error,
    }
}

/// Host time in nanoseconds since the epoch (0 if unavailable).
pub fn now_nanos() -> u64 {
    count(HostCall::Clock);
    let mut t: u64 = 0;
    // SAFETY: valid out pointer.
    let code = unsafe { proxy_get_current_time_nanoseconds(&mut t) };
    if code == OK {
        t
    } else {
        0
    }
}

/// Bytes `[start, start+max)` of a buffer.
pub fn buffer(kind: u32, start: usize, max: usize) -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::BufferGet);
    // SAFETY: out pointers are valid for the duration of the call.
    fetch(|d, s| unsafe { proxy_get_buffer_bytes(kind, start, max, d, s) })
}

/// A request header's value (first instance), raw bytes.
pub fn request_header(name: &str) -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::HeaderGet);
    // SAFETY: pointer and length of a live str; valid out pointers.
    fetch(|d, s| unsafe {
        proxy_get_header_map_value(MAP_REQUEST_HEADERS, name.as_ptr(), name.len(), d, s)
    })
}

/// Every request header in one call, serialised
/// ([`crate::header_pairs`] reads it).
pub fn request_headers() -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::HeaderGet);
    // SAFETY: valid out pointers.
    fetch(|d, s| unsafe { proxy_get_header_map_pairs(MAP_REQUEST_HEADERS, d, s) })
}

/// Every response header in one call, serialised
/// ([`crate::header_pairs`] reads it).
pub fn response_headers() -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::HeaderGet);
    // SAFETY: valid out pointers.
    fetch(|d, s| unsafe { proxy_get_header_map_pairs(MAP_RESPONSE_HEADERS, d, s) })
}

/// Set (replace every instance of) a request header.
pub fn set_request_header(name: &str, value: &str) -> Result<(), HostError> {
    count(HostCall::HeaderSet);
    // SAFETY: pointers and lengths of live strs.
    status(unsafe {
        proxy_replace_header_map_value(
            MAP_REQUEST_HEADERS,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Remove every instance of a request header.
pub fn remove_request_header(name: &str) -> Result<(), HostError> {
    count(HostCall::HeaderRemove);
    // SAFETY: pointer and length of a live str.
    match unsafe { proxy_remove_header_map_value(MAP_REQUEST_HEADERS, name.as_ptr(), name.len()) } {
        OK | NOT_FOUND => Ok(()),
        other => Err(HostError(other)),
    }
}

/// A property (`["upstream", "address"]` …); path segments are NUL-separated.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, HostError> {
    property_path(&path.join("\0"))
}

/// A property by its NUL-separated path (`"upstream\0address"`): no
/// allocation of its own.
pub fn property_path(joined: &str) -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::PropertyGet);
    // SAFETY: pointer and length of a live str; valid out pointers.
    fetch(|d, s| unsafe { proxy_get_property(joined.as_ptr(), joined.len(), d, s) })
}

/// Set a property (filter state `wasm.<name>`, e.g. for the access log).
pub fn set_property(name: &str, value: &str) -> Result<(), HostError> {
    count(HostCall::PropertySet);
    // SAFETY: pointers and lengths of live strs.
    status(unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Shared data value and its CAS token; a missing key is `(None, 0)`.
pub fn shared_get(key: &str) -> Result<(Option<Vec<u8>>, u32), HostError> {
    count(HostCall::SharedGet);
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    let mut cas: u32 = 0;
    // SAFETY: pointer and length of a live str; valid out pointers.
    let code =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match code {
        // SAFETY: on OK the host allocated `data` through proxy_on_memory_allocate.
        OK => Ok((unsafe { take(data, size) }, cas)),
        NOT_FOUND => Ok((None, 0)),
        other => Err(HostError(other)),
    }
}

/// Write shared data; `cas == 0` writes unconditionally, otherwise the write
/// fails with [`CAS_MISMATCH`] if the value changed since it was read.
pub fn shared_set(key: &str, value: &[u8], cas: u32) -> Result<(), HostError> {
    count(HostCall::SharedSet);
    let ptr = if value.is_empty() {
        null()
    } else {
        value.as_ptr()
    };
    // SAFETY: pointers and lengths of live slices.
    status(unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), ptr, value.len(), cas) })
}

/// Define a metric; returns its id.
pub fn define_metric(kind: MetricKind, name: &str) -> Result<u32, HostError> {
    count(HostCall::MetricDefine);
    let mut id: u32 = 0;
    // SAFETY: pointer and length of a live str; valid out pointer.
    status(unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Add `offset` to a counter or gauge; failures are ignored by callers that
/// cannot do anything about them, so this returns nothing.
pub fn increment_metric(id: u32, offset: i64) {
    count(HostCall::MetricIncrement);
    // SAFETY: plain values.
    let _ = unsafe { proxy_increment_metric(id, offset) };
}

/// Set a gauge.
pub fn record_metric(id: u32, value: u64) {
    count(HostCall::MetricRecord);
    // SAFETY: plain values.
    let _ = unsafe { proxy_record_metric(id, value) };
}

/// A `log` crate backend over [`log`], and a panic hook that reports the panic
/// message before the VM aborts.
pub struct HostLogger;

static LOGGER: HostLogger = HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }
    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Error => Level::Error,
            log::Level::Warn => Level::Warn,
            log::Level::Info => Level::Info,
            log::Level::Debug => Level::Debug,
            log::Level::Trace => Level::Trace,
        };
        log(level, &format!("prefix-router: {}", record.args()));
    }
    fn flush(&self) {}
}

/// Install the logger and the panic hook. Makes no host call (host calls are
/// refused during `_initialize`). Idempotent.
pub fn init_logging() {
    if log::set_logger(&LOGGER).is_ok() {
        std::panic::set_hook(Box::new(|info| {
            log(Level::Error, &format!("prefix-router: panic: {info}"))
        }));
    }
    log::set_max_level(log::LevelFilter::Info);
}

/// Follow the host's log level (call from a context callback).
pub fn sync_log_level() {
    log::set_max_level(match log_level() {
        Level::Trace => log::LevelFilter::Trace,
        Level::Debug => log::LevelFilter::Debug,
        Level::Info => log::LevelFilter::Info,
        Level::Warn => log::LevelFilter::Warn,
        Level::Error => log::LevelFilter::Error,
    });
}
