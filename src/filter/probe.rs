//! Measuring instruments for the per-request cost (issue 12), compiled out
//! of the shipped filter. Two kinds, both chosen at build time:
//!
//! - **Ablations** (`PR_ABLATE`, an environment variable read by the
//!   compiler, e.g. `PR_ABLATE=noprop,nodecision ./build.sh`): each named
//!   part of the request path is switched off, so a paired profile
//!   (`OVERHEAD_COMPARE_WASM=<ablated build> ./build.sh bench profile`)
//!   prices that part alone. Names: see [`Ablate`]. The release build has
//!   no `PR_ABLATE`: every check is a constant `false` the optimiser
//!   removes. Ablated builds change behaviour (an ablated header write
//!   routes round robin, …) and are for the bench only.
//! - **Self-profile** (cargo feature `selfprof`, off by default): the
//!   adapter reads the host clock around its phases ([`Phase`]) and logs,
//!   every [`REPORT_EVERY`] requests, the mean ns per request of each phase
//!   (warn level, so Envoy's default log level shows it). The clock reads
//!   are themselves host calls (~0.1–1 µs each): absolute figures are upper
//!   bounds, differences between phases are what to read.

/// A part of the request path that an ablated build leaves out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ablate {
    /// `nodecision`: no decision header (as `decision_header: ""`).
    Decision,
    /// `notarget`: no target header either (Envoy's fallback policy routes).
    Target,
    /// `noprop`: no access-log filter-state property.
    Property,
    /// `noresp`: the response callbacks return at once (no `upstream.address`,
    /// no response headers, no chunk read, no record; `on_log` still releases).
    Response,
    /// `noroute`: read the body, then nothing (no routing, no shared data,
    /// no header write): the adapter's fixed cost next to the floor R.
    Route,
    /// `nokey`: route without the body (no JSON scan or hashing).
    Key,
    /// `noslots`: the index slot table reads nothing and writes nothing.
    Slots,
    /// `noflush`: counters and gauges are never published.
    Flush,
    /// `noidleflush`: a request end that leaves the VM idle writes neither
    /// its release nor the batched stats (the next take or tick does).
    IdleFlush,
}

impl Ablate {
    fn name(self) -> &'static str {
        match self {
            Ablate::Decision => "nodecision",
            Ablate::Target => "notarget",
            Ablate::Property => "noprop",
            Ablate::Response => "noresp",
            Ablate::Route => "noroute",
            Ablate::Key => "nokey",
            Ablate::Slots => "noslots",
            Ablate::Flush => "noflush",
            Ablate::IdleFlush => "noidleflush",
        }
    }
}

/// The ablations of this build (`PR_ABLATE` at compile time).
const ABLATE: Option<&str> = option_env!("PR_ABLATE");

/// Is `part` switched off in this build? (`false` in every normal build.)
#[inline]
pub fn off(part: Ablate) -> bool {
    match ABLATE {
        None => false,
        Some(list) => list.split(',').any(|w| w.trim() == part.name()),
    }
}

/// Phases of a request timed by the `selfprof` feature.
#[derive(Clone, Copy, Debug)]
pub enum Phase {
    /// `on_http_request_headers`.
    Headers,
    /// Reading the buffered request body into the VM.
    Body,
    /// The membership view and the routing key (JSON scan + hashing).
    Key,
    /// The load picture (in-flight counts, down marks).
    Picture,
    /// `affinity`: index lookup, choice and pending record.
    Select,
    /// Taking the in-flight count (CAS).
    Take,
    /// The target and decision header writes.
    SetHeaders,
    /// The rest of routing (stats, bookkeeping, debug line).
    RouteRest,
    /// `on_http_response_headers`.
    RespHeaders,
    /// `on_http_response_body` (all chunks).
    RespBody,
    /// `on_log`.
    Log,
}

#[cfg(feature = "selfprof")]
mod imp {
    use super::Phase;
    use std::cell::Cell;

    pub const PHASES: usize = 11;
    const NAMES: [&str; PHASES] = [
        "headers",
        "body",
        "key",
        "picture",
        "select",
        "take",
        "set_headers",
        "route_rest",
        "resp_headers",
        "resp_body",
        "log",
    ];

    thread_local! {
        static SUM: [Cell<u64>; PHASES] = const { [const { Cell::new(0) }; PHASES] };
        static REQUESTS: Cell<u64> = const { Cell::new(0) };
    }

    pub fn start() -> u64 {
        super::super::host::now_nanos()
    }

    pub fn end(phase: Phase, t0: u64) {
        let dt = super::super::host::now_nanos().saturating_sub(t0);
        SUM.with(|s| {
            if let Some(c) = s.get(phase as usize) {
                c.set(c.get().saturating_add(dt));
            }
        });
    }

    pub fn request_done(every: u64) {
        let n = REQUESTS.with(|r| {
            r.set(r.get() + 1);
            r.get()
        });
        if n % every != 0 {
            return;
        }
        let mut line = String::new();
        let mut total = 0;
        SUM.with(|s| {
            for (c, name) in s.iter().zip(NAMES) {
                let v = c.replace(0);
                total += v;
                line.push_str(&format!(" {name}={}", v / every));
            }
        });
        log::warn!(
            "selfprof ns/request over {every}: total={}{line}",
            total / every
        );
    }
}

/// Requests between two self-profile log lines.
#[cfg_attr(not(feature = "selfprof"), allow(dead_code))]
pub const REPORT_EVERY: u64 = 2000;

/// A phase starts (`selfprof`: the host clock; else 0, no call).
#[inline]
pub fn start() -> u64 {
    #[cfg(feature = "selfprof")]
    {
        imp::start()
    }
    #[cfg(not(feature = "selfprof"))]
    {
        0
    }
}

/// A phase that began at `t0` ends.
#[inline]
pub fn end(_phase: Phase, _t0: u64) {
    #[cfg(feature = "selfprof")]
    imp::end(_phase, _t0);
}

/// A request ended (`selfprof`: every [`REPORT_EVERY`] a log line).
#[inline]
pub fn request_done() {
    #[cfg(feature = "selfprof")]
    imp::request_done(REPORT_EVERY);
}
