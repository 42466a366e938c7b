//! Passive health, per request: a primary that did not serve its request is
//! marked down in shared data for every worker ([`crate::cluster::sync::mark_failed`]).
//!
//! "Did not serve": at response headers, `upstream.address` names another
//! host (Envoy retried on the secondary after a connect failure, reset or
//! 503, or the fallback policy picked), or no upstream was reached and the
//! response is a 503 (`UF`/`URX`, `no healthy upstream`). No host call of its
//! own on success (`upstream.address` and `:status` are read once by the
//! caller); on a failure, one CAS update of the `down` table.

use super::host::{self, HostShared};
use super::local::marks_written;
use super::root::Plugin;
use super::stats::HostFailure;
use crate::cluster::request::Slot;
use crate::cluster::sync::mark_failed;

/// Check the request's primary against the upstream that answered
/// (`status`: the response's `:status`, read by the caller).
pub fn check_primary(p: &Plugin, slot: &Slot, upstream: Option<&str>, status: Option<&[u8]>) {
    let Some(primary) = slot.primary.as_deref() else {
        return;
    };
    if !slot.primary_failed(upstream, upstream.is_none() && status == Some(b"503")) {
        return;
    }
    let now = host::now_nanos() / 1_000_000;
    let refresh = p.config().discovery.as_ref().map_or(1000, |d| d.refresh_ms);
    let marked = mark_failed(&HostShared, &p.keys, primary, now, refresh);
    marks_written();
    match marked {
        Ok(()) => p.stats.marked_down(),
        Err(_) => p.stats.failure(HostFailure::SharedData),
    }
}
