//! `GET /debug/requests`: a ring of the last [`CAPACITY`] requests with their headers and timing.
//!
//! A record is pushed when a request arrives (so hung requests show up too) and completed in
//! place by sequence number when it ends. Records are ordered by `seq` (with gaps: admin and
//! debug requests are not logged), so push and eviction are O(1) and lookup is a binary search.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

pub const CAPACITY: usize = 1000;

/// One request as the emulator saw it.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Record {
    pub seq: u64,
    /// Arrival, ms since the emulator started.
    pub t_ms: f64,
    pub method: String,
    pub path: String,
    /// All request headers; repeated headers are joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// `pending` until the request ends, then `ok`, `error`, `aborted`, `hang`.
    pub outcome: &'static str,
    pub status: Option<u16>,
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    pub queued_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub total_ms: Option<f64>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct DebugLog {
    records: VecDeque<Record>,
}

impl DebugLog {
    pub fn push(&mut self, r: Record) {
        if self.records.len() == CAPACITY {
            self.records.pop_front();
        }
        self.records.push_back(r);
    }

    /// The record of `seq`, if it is still in the ring.
    pub fn get_mut(&mut self, seq: u64) -> Option<&mut Record> {
        let i = self.records.binary_search_by_key(&seq, |r| r.seq).ok()?;
        self.records.get_mut(i)
    }

    /// Records with `seq > since` (all if `since` is None), oldest first.
    pub fn since(&self, since: Option<u64>) -> Vec<&Record> {
        self.records
            .iter()
            .filter(|r| since.is_none_or(|s| r.seq > s))
            .collect()
    }

    pub fn clear(&mut self) {
        self.records.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_last_capacity_and_finds_by_seq() {
        let mut log = DebugLog::default();
        for seq in (0..(CAPACITY as u64 + 5)).map(|s| s * 2) {
            log.push(Record {
                seq,
                outcome: "pending",
                ..Default::default()
            });
        }
        assert_eq!(log.since(None).len(), CAPACITY);
        assert!(log.get_mut(8).is_none()); // evicted
        assert!(log.get_mut(1001).is_none()); // never logged
        log.get_mut(1000).unwrap().outcome = "ok";
        assert_eq!(log.since(Some(999))[0].outcome, "ok");
        assert_eq!(log.since(Some(2 * CAPACITY as u64 + 6)).len(), 1);
    }
}
