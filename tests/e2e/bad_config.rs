//! Invalid plugin configuration is refused at load, naming the field.

use std::time::Duration;

use crate::harness::{workdir, Envoy, EnvoyConfig};

/// Each bad configuration makes Envoy refuse to start (exit status non-zero) and its log
/// carries the filter's message naming the field.
#[test]
fn invalid_config_is_refused_with_the_field_named() {
    let dir = workdir("bad-config");
    let eps = vec!["127.0.0.1:9".to_string()];
    let cases: [(&str, EnvoyConfig, &str); 4] = [
        (
            "threshold",
            EnvoyConfig::prefix(&eps).with("concurrency_threshold", 0.into()),
            "concurrency_threshold",
        ),
        (
            "hostname",
            EnvoyConfig::prefix(&eps).with("endpoints", serde_json::json!(["localhost:8000"])),
            "endpoints[0]",
        ),
        (
            "strategy",
            EnvoyConfig::prefix(&eps).with("strategy", "fastest".into()),
            "strategy",
        ),
        (
            "prefix_length",
            EnvoyConfig::prefix(&eps).with("prefix_length", 10.into()),
            "prefix_length",
        ),
    ];
    for (name, cfg, field) in cases {
        let mut e = Envoy::spawn(&dir, &format!("envoy-{name}"), &cfg);
        let status = e.wait_exit(Duration::from_secs(30));
        let log = e.log();
        let status = status.unwrap_or_else(|| {
            panic!(
                "{name}: Envoy accepted the bad config (still running); log:\n{}",
                e.log_tail(4000)
            )
        });
        assert!(!status.success(), "{name}: Envoy exited 0; log:\n{log}");
        let line = log
            .lines()
            .find(|l| l.contains("invalid configuration") && l.contains(&format!("`{field}`")))
            .unwrap_or_else(|| panic!("{name}: no log line naming `{field}`; log:\n{log}"));
        assert!(line.contains("prefix-router"), "{name}: {line}");
    }
}
