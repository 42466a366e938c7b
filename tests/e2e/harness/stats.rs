//! Envoy admin `/stats` (text form: `name: value` per line) and the filter's stat names.
//!
//! Envoy may prefix stats defined by a Wasm module (e.g. `wasmcustom.`); lookups accept
//! the bare name or any `<prefix>.<name>`.

use std::collections::BTreeMap;

/// Decision branches, as the filter names them.
pub const BRANCHES: [&str; 9] = [
    "hit",
    "spill",
    "least_loaded",
    "cold",
    "no_key",
    "bad_input",
    "random",
    "round_robin",
    "least_request",
];

/// Key sources, as the filter names them.
pub const SOURCES: [&str; 8] = [
    "chat",
    "completions",
    "responses",
    "raw",
    "oversize",
    "routing_id",
    "none",
    "malformed",
];

/// A snapshot of counters and gauges.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Full stat name → value.
    pub values: BTreeMap<String, u64>,
}

impl Stats {
    /// Parse the text form.
    pub fn parse(text: &str) -> Stats {
        let values = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(": ")?;
                Some((k.trim().to_string(), v.trim().parse().ok()?))
            })
            .collect();
        Stats { values }
    }

    /// The stat `name` (or `<prefix>.name`), if present.
    pub fn find(&self, name: &str) -> Option<u64> {
        let suffix = format!(".{name}");
        self.values
            .iter()
            .find(|(k, _)| *k == name || k.ends_with(&suffix))
            .map(|(_, v)| *v)
    }

    /// The stat `name`; panics with the list of filter stats if it does not exist.
    pub fn get(&self, name: &str) -> u64 {
        self.find(name).unwrap_or_else(|| {
            panic!(
                "stat {name} not found; prefix_router stats present:\n{}",
                self.dump("prefix_router")
            )
        })
    }

    /// `prefix_router.branch.<b>`.
    pub fn branch(&self, b: &str) -> u64 {
        self.get(&format!("prefix_router.branch.{b}"))
    }

    /// `prefix_router.source.<s>`.
    pub fn source(&self, s: &str) -> u64 {
        self.get(&format!("prefix_router.source.{s}"))
    }

    /// Sum of all branch counters.
    pub fn branch_total(&self) -> u64 {
        BRANCHES.iter().map(|b| self.branch(b)).sum()
    }

    /// Sum of all source counters.
    pub fn source_total(&self) -> u64 {
        SOURCES.iter().map(|s| self.source(s)).sum()
    }

    /// Stats whose name contains `needle` (all stats of one endpoint: `127_0_0_1_<port>`).
    pub fn matching(&self, needle: &str) -> Vec<(&str, u64)> {
        self.values
            .iter()
            .filter(|(k, _)| k.contains(needle))
            .map(|(k, v)| (k.as_str(), *v))
            .collect()
    }

    /// The in-flight gauge of `endpoint` (`127.0.0.1:port`).
    pub fn in_flight(&self, endpoint: &str) -> u64 {
        let label = endpoint.replace(['.', ':'], "_");
        let found: Vec<_> = self
            .matching(&label)
            .into_iter()
            .filter(|(k, _)| k.contains("prefix_router") && k.contains("in_flight"))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one in-flight gauge for {endpoint}, found {found:?}; stats:\n{}",
            self.dump("prefix_router")
        );
        found[0].1
    }

    /// `name: value` lines of stats containing `needle`.
    pub fn dump(&self, needle: &str) -> String {
        self.values
            .iter()
            .filter(|(k, _)| k.contains(needle))
            .map(|(k, v)| format!("  {k}: {v}\n"))
            .collect()
    }
}
