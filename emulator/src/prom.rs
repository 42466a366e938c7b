//! Minimal Prometheus text-format reader, and the Envoy admin `/stats` and `/clusters` readers.
//!
//! Prometheus: every non-comment line is `name{labels} value [timestamp]`; label values may hold
//! spaces, braces and escaped quotes. [`parse`] returns the samples; [`sum_by_name`] adds up all
//! series of one metric name (labels ignored), which is what counters like
//! `vllm:prefix_cache_hits_total` need. Cost: O(text).

use std::collections::BTreeMap;

/// One sample: metric name, raw label text (inside the braces), value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: String,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, if present (unescaped).
    pub fn label(&self, key: &str) -> Option<String> {
        let mut rest = self.labels.as_str();
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            let (k, after) = rest.split_once('=')?;
            let after = after.strip_prefix('"')?;
            let mut val = String::new();
            let mut chars = after.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            val.push(if n == 'n' { '\n' } else { n });
                        }
                    }
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => val.push(c),
                }
            }
            let end = end?;
            if k.trim() == key {
                return Some(val);
            }
            rest = &after[end + 1..];
        }
    }
}

/// Parses Prometheus text exposition; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find(['{', ' ']) {
            Some(i) if line.as_bytes()[i] == b'{' => {
                // Find the closing brace outside quotes.
                let mut in_q = false;
                let mut esc = false;
                let mut close = None;
                for (j, c) in line[i + 1..].char_indices() {
                    match c {
                        _ if esc => esc = false,
                        '\\' if in_q => esc = true,
                        '"' => in_q = !in_q,
                        '}' if !in_q => {
                            close = Some(i + 1 + j);
                            break;
                        }
                        _ => {}
                    }
                }
                let Some(c) = close else { continue };
                (&line[..i], &line[i + 1..c], &line[c + 1..])
            }
            Some(i) => (&line[..i], "", &line[i..]),
            None => continue,
        };
        let Some(v) = rest.split_whitespace().next() else {
            continue;
        };
        let value = match v {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(x) => x,
                Err(_) => continue,
            },
        };
        out.push(Sample {
            name: name.to_string(),
            labels: labels.to_string(),
            value,
        });
    }
    out
}

/// Sum of every series of each metric name.
pub fn sum_by_name(samples: &[Sample]) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for s in samples {
        *m.entry(s.name.clone()).or_insert(0.0) += s.value;
    }
    m
}

/// Envoy admin `/stats` text (`name: value` lines): the integer counters and gauges.
/// Histogram lines (`name: P0(...)...`) are skipped.
pub fn envoy_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(": ")?;
            Some((k.trim().to_string(), v.trim().parse::<u64>().ok()?))
        })
        .collect()
}

/// Envoy admin `/clusters` text: `rq_total` per (cluster, host) from lines
/// `cluster::host:port::rq_total::N`.
pub fn envoy_host_rq_total(text: &str) -> BTreeMap<(String, String), u64> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split("::");
            let cluster = parts.next()?;
            let host = parts.next()?;
            let stat = parts.next()?;
            let v = parts.next()?;
            if stat != "rq_total" {
                return None;
            }
            Some((
                (cluster.to_string(), host.to_string()),
                v.trim().parse().ok()?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prometheus_text() {
        let t = "# HELP x y\n# TYPE x counter\n\
                 vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 48\n\
                 vllm:prefix_cache_hits_total{model_name=\"n\"} 2.0\n\
                 llamacpp:prompt_tokens_total 1129\n\
                 weird{a=\"x} y\\\" z\",b=\"2\"} 3 1700000000\n\
                 h_bucket{le=\"+Inf\"} +Inf\nbroken{ 1\n";
        let s = parse(t);
        assert_eq!(s.len(), 5);
        let m = sum_by_name(&s);
        assert_eq!(m["vllm:prefix_cache_hits_total"], 50.0);
        assert_eq!(m["llamacpp:prompt_tokens_total"], 1129.0);
        assert_eq!(m["weird"], 3.0);
        assert_eq!(s[3].label("a").as_deref(), Some("x} y\" z"));
        assert_eq!(s[3].label("b").as_deref(), Some("2"));
        assert_eq!(s[0].label("engine").as_deref(), Some("0"));
        assert_eq!(s[0].label("nope"), None);
    }

    #[test]
    fn parses_envoy_admin_text() {
        let st = "wasmcustom.prefix_router.branch.hit: 12\n\
                  wasmcustom.prefix_router.branch.spill: 3\n\
                  cluster.x.upstream_rq_time: P0(nan,1) P25(nan,2)\n";
        let m = envoy_stats(st);
        assert_eq!(m.len(), 2);
        assert_eq!(m["wasmcustom.prefix_router.branch.spill"], 3);
        let cl = "replicas::127.0.0.1:8001::rq_total::17\n\
                  replicas::127.0.0.1:8001::cx_active::2\n\
                  replicas::default_priority::max_connections::1024\n";
        let h = envoy_host_rq_total(cl);
        assert_eq!(h.len(), 1);
        assert_eq!(
            h[&("replicas".to_string(), "127.0.0.1:8001".to_string())],
            17
        );
    }
}
