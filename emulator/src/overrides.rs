//! Reported-metric overrides: make a replica REPORT a given queue or KV usage in `/metrics`
//! without actually being loaded (for routing tests: "one replica reports a full queue").
//!
//! Set at start with `--report-waiting N`, `--report-running N`, `--report-kv-usage X`, or at run
//! time with `POST /admin/metrics-override` (JSON body `{"waiting": 500, "kv_usage": 0.95}` or
//! query `?waiting=500&kv_usage=0.95`; a field that is absent or `null` is cleared, so `{}`
//! restores the real values), like `--fail` / `POST /admin/fail`. Only the reported gauges
//! change (`vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`
//! and `vllm:gpu_cache_usage_perc`); scheduling and `/admin/state`'s live counts do not.

use serde_json::{json, Value};

/// Values reported instead of the live ones, when set.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    pub kv_usage: Option<f64>,
}

const FIELDS: [&str; 3] = ["waiting", "running", "kv_usage"];

fn check(field: &str, v: f64) -> Result<f64, String> {
    let ok = v.is_finite() && v >= 0.0 && (field != "kv_usage" || v <= 1.0);
    if ok {
        Ok(v)
    } else {
        Err(format!(
            "'{field}' must be a finite number >= 0{}",
            if field == "kv_usage" { " and <= 1" } else { "" }
        ))
    }
}

impl Overrides {
    fn set(&mut self, field: &str, v: Option<f64>) {
        match field {
            "waiting" => self.waiting = v,
            "running" => self.running = v,
            _ => self.kv_usage = v,
        }
    }

    /// From a JSON object (`null`/absent clears a field; unknown fields are an error).
    pub fn from_json(body: &[u8]) -> Result<Overrides, String> {
        let v: Value = if body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?
        };
        let obj = v.as_object().ok_or("the body must be a JSON object")?;
        let mut o = Overrides::default();
        for (k, val) in obj {
            if !FIELDS.contains(&k.as_str()) {
                return Err(format!("unknown field '{k}' (waiting, running, kv_usage)"));
            }
            let n = match val {
                Value::Null => None,
                v => Some(check(
                    k,
                    v.as_f64().ok_or(format!("'{k}' must be a number"))?,
                )?),
            };
            o.set(k, n);
        }
        Ok(o)
    }

    /// From a query string `waiting=500&kv_usage=0.95` (empty value clears).
    pub fn from_query(q: &str) -> Result<Overrides, String> {
        let mut o = Overrides::default();
        for kv in q.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            if !FIELDS.contains(&k) {
                return Err(format!("unknown field '{k}' (waiting, running, kv_usage)"));
            }
            let n = if v.is_empty() {
                None
            } else {
                let f = v
                    .parse::<f64>()
                    .map_err(|_| format!("'{k}' must be a number"))?;
                Some(check(k, f)?)
            };
            o.set(k, n);
        }
        Ok(o)
    }

    /// JSON view for `/admin/state` and the override endpoint's answer.
    pub fn to_json(&self) -> Value {
        json!({"waiting": self.waiting, "running": self.running, "kv_usage": self.kv_usage})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_query_forms_agree_and_validate() {
        let j = Overrides::from_json(br#"{"waiting": 500, "kv_usage": 0.95}"#).unwrap();
        let q = Overrides::from_query("waiting=500&kv_usage=0.95").unwrap();
        assert_eq!(j, q);
        assert_eq!(
            (j.waiting, j.running, j.kv_usage),
            (Some(500.0), None, Some(0.95))
        );
        assert_eq!(Overrides::from_json(b"").unwrap(), Overrides::default());
        assert_eq!(
            Overrides::from_json(br#"{"waiting":null}"#).unwrap(),
            Overrides::default()
        );
        for bad in [
            &br#"{"kv_usage": 1.5}"#[..],
            br#"{"waiting": -1}"#,
            br#"{"x": 1}"#,
            b"[1]",
            br#"{"waiting":"5"}"#,
        ] {
            assert!(
                Overrides::from_json(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(Overrides::from_query("kv_usage=nan").is_err());
        assert!(Overrides::from_query("bogus=1").is_err());
    }
}
