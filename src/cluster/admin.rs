//! Envoy admin `/clusters?format=json`: the hosts of one cluster.
//!
//! Shape (proto3 JSON: false and zero fields are omitted, uint64 stats are
//! strings), verified on Envoy 1.40:
//! `{"cluster_statuses":[{"name":"llm","host_statuses":[{"address":
//! {"socket_address":{"address":"127.0.0.1","port_value":8001}},
//! "stats":[{"type":"GAUGE","name":"rq_active","value":"1"},…],
//! "health_status":{"failed_active_health_check":true,"eds_health_status":"HEALTHY"}}]}]}`.
//!
//! A host is **unavailable** when any of `failed_active_health_check`,
//! `failed_outlier_check`, `pending_dynamic_removal`,
//! `excluded_via_immediate_hc_fail`, `active_hc_timeout` is true, or
//! `eds_health_status` is `UNHEALTHY`, `DRAINING` or `TIMEOUT`. Degraded hosts
//! (`failed_active_degraded_check`, `DEGRADED`) stay available: they serve,
//! only less preferably in Envoy's own balancers.
//!
//! Cost: one serde_json parse of the whole document (≈ 4 KB for 3 hosts;
//! grows with every cluster of the Envoy, so the poll runs on one VM, once
//! per `refresh_ms`, never on a request).

use serde_json::Value;
use std::net::{IpAddr, SocketAddr};

/// Largest admin document parsed (bytes); larger ones are refused.
pub const MAX_ADMIN_BYTES: usize = 16 << 20;

/// One host as the admin API reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatus {
    /// `IP:port`, exactly the form `override_host` matches.
    pub addr: String,
    /// Usable as primary or secondary (see the module docs).
    pub available: bool,
    /// Envoy's requests in flight to this host (`rq_active`, all workers).
    pub rq_active: u32,
}

const UNAVAILABLE_FLAGS: [&str; 5] = [
    "failed_active_health_check",
    "failed_outlier_check",
    "pending_dynamic_removal",
    "excluded_via_immediate_hc_fail",
    "active_hc_timeout",
];

fn host(h: &Value) -> Option<HostStatus> {
    let sa = h.get("address")?.get("socket_address")?;
    let ip: IpAddr = sa.get("address")?.as_str()?.parse().ok()?;
    let port = u16::try_from(sa.get("port_value")?.as_u64()?).ok()?;
    let health = h.get("health_status");
    let flag = |name: &str| {
        health
            .and_then(|s| s.get(name))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let eds = health
        .and_then(|s| s.get("eds_health_status"))
        .and_then(Value::as_str)
        .unwrap_or("HEALTHY");
    let available = !UNAVAILABLE_FLAGS.iter().any(|f| flag(f))
        && !matches!(eds, "UNHEALTHY" | "DRAINING" | "TIMEOUT");
    let rq_active = h
        .get("stats")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|s| s.get("name").and_then(Value::as_str) == Some("rq_active"))
        .and_then(|s| s.get("value"))
        .and_then(|v| match v {
            Value::String(s) => s.parse::<u64>().ok(),
            Value::Number(n) => n.as_u64(),
            _ => None,
        })
        .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX));
    Some(HostStatus {
        addr: SocketAddr::new(ip, port).to_string(),
        available,
        rq_active,
    })
}

/// The hosts of `cluster`, sorted by address, or why not.
///
/// # Errors
/// Not JSON, too large, or no cluster of that name (a typo in `cluster` must
/// be visible, not an empty membership).
pub fn parse_clusters(json: &[u8], cluster: &str) -> Result<Vec<HostStatus>, String> {
    if json.len() > MAX_ADMIN_BYTES {
        return Err(format!("admin document of {} bytes", json.len()));
    }
    let doc: Value = serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let c = doc
        .get("cluster_statuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(cluster))
        .ok_or_else(|| format!("no cluster named {cluster:?} in /clusters"))?;
    let mut hosts: Vec<HostStatus> = c
        .get("host_statuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(host)
        .collect();
    hosts.sort_by(|a, b| a.addr.cmp(&b.addr));
    hosts.dedup_by(|a, b| a.addr == b.addr);
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const DOC: &str = r#"{"cluster_statuses":[
      {"name":"envoy_admin","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":9901}}}]},
      {"name":"llm","added_via_api":true,"host_statuses":[
        {"address":{"socket_address":{"address":"127.0.0.1","port_value":8002}},
         "stats":[{"name":"cx_connect_fail"},{"type":"GAUGE","name":"rq_active","value":"3"}],
         "health_status":{"eds_health_status":"HEALTHY"}},
        {"address":{"socket_address":{"address":"127.0.0.1","port_value":8001}},
         "health_status":{"failed_active_health_check":true,"eds_health_status":"HEALTHY"}},
        {"address":{"socket_address":{"address":"::1","port_value":8003}},
         "health_status":{"eds_health_status":"DRAINING"}},
        {"address":{"socket_address":{"address":"10.0.0.4","port_value":8004}},
         "health_status":{"pending_dynamic_removal":true}},
        {"address":{"socket_address":{"address":"10.0.0.5","port_value":8005}},
         "health_status":{"failed_outlier_check":true}},
        {"address":{"socket_address":{"address":"10.0.0.6","port_value":8006}},
         "health_status":{"failed_active_degraded_check":true,"eds_health_status":"DEGRADED"}},
        {"address":{"pipe":{"path":"/tmp/x"}}}
      ]}]}"#;

    #[test]
    fn flags_addresses_and_rq_active() {
        let hosts = parse_clusters(DOC.as_bytes(), "llm").unwrap();
        let view: Vec<(&str, bool, u32)> = hosts
            .iter()
            .map(|h| (h.addr.as_str(), h.available, h.rq_active))
            .collect();
        assert_eq!(
            view,
            vec![
                ("10.0.0.4:8004", false, 0),
                ("10.0.0.5:8005", false, 0),
                ("10.0.0.6:8006", true, 0),
                ("127.0.0.1:8001", false, 0),
                ("127.0.0.1:8002", true, 3),
                ("[::1]:8003", false, 0),
            ]
        );
    }

    #[test]
    fn wrong_cluster_or_garbage_is_an_error() {
        assert!(parse_clusters(DOC.as_bytes(), "nope").is_err());
        assert!(parse_clusters(b"{", "llm").is_err());
        assert!(parse_clusters(b"[]", "llm").is_err());
        assert_eq!(
            parse_clusters(br#"{"cluster_statuses":[{"name":"llm"}]}"#, "llm").unwrap(),
            vec![]
        );
    }
}
