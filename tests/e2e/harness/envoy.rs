//! A real Envoy process with the real filter, rendered from parameters.
//!
//! The rendered config has the structure of `envoy/envoy.yaml` (wasm filter with
//! `allow_on_headers_stop_iteration`, override_host cluster with a least_request fallback,
//! upstream header_mutation that strips the target header, retries to the secondary,
//! active `/health` checks) with ports, endpoints and filter JSON as parameters and
//! health-check intervals short enough for tests. Envoy runs with `--concurrency 2`
//! (two worker VMs share the in-flight counts) and `--disable-hot-restart` (several
//! Envoys run at once).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use super::procs::{free_port, port_open, wait_for, Proc};
use super::{envoy_bin, wasm_path, write_file, Client, Stats};

/// Parameters of one Envoy.
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    /// Members of the `llm` cluster (`127.0.0.1:port`).
    pub endpoints: Vec<String>,
    /// Plugin configuration (JSON object) unless [`EnvoyConfig::filter_raw`] is set.
    pub filter: Value,
    /// Plugin configuration as raw text (to test invalid JSON).
    pub filter_raw: Option<String>,
    /// Route `retry_on`.
    pub retry_on: String,
    /// Health-check interval (ms); also the no-traffic interval.
    pub hc_interval_ms: u64,
    /// Listener `per_connection_buffer_limit_bytes` (also the largest socket read).
    pub buffer_limit: u64,
    /// Route `request_body_buffer_limit` (the stream buffer the filter fills).
    pub body_buffer_limit: u64,
    /// Worker threads (`--concurrency`).
    pub concurrency: u32,
    /// A native `header_mutation` strips the target header before the Wasm filter
    /// (as `envoy/envoy.yaml` does).
    pub native_strip: bool,
    /// The Wasm filter's `failure_policy` (`envoy/envoy.yaml`: `FAIL_CLOSED`).
    pub failure_policy: String,
    /// Load this module instead of the filter (to make the VM fail).
    pub wasm: Option<PathBuf>,
    /// Accept WebSocket upgrades (`upgrade_configs`).
    pub websocket: bool,
    /// The Wasm filter comes from an ECDS file (`config_discovery` +
    /// `path_config_source`), so its configuration can be pushed; see
    /// [`Envoy::push_filter`].
    pub ecds: bool,
    /// The cluster is STRICT_DNS with `localhost:<port>` endpoints (resolved by Envoy).
    pub dns: bool,
    /// Members come from an EDS file (`path_config_source` + `watched_directory`)
    /// instead of a STATIC load assignment; see [`Envoy::write_eds`].
    pub eds: bool,
}

/// The Wasm filter message (`"@type"` + `config`) indented by `indent`; `filter` and
/// `wasm` are YAML scalars (JSON string literals).
fn wasm_message(filter: &str, wasm: &str, failure_policy: &str, indent: usize) -> String {
    let lines = [
        "\"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm".to_string(),
        "config:".into(),
        "  name: prefix_router".into(),
        "  root_id: \"\"".into(),
        format!("  failure_policy: {failure_policy}"),
        "  allow_on_headers_stop_iteration: true".into(),
        "  configuration:".into(),
        "    \"@type\": type.googleapis.com/google.protobuf.StringValue".into(),
        format!("    value: {filter}"),
        "  vm_config:".into(),
        "    vm_id: prefix_router".into(),
        "    runtime: envoy.wasm.runtime.v8".into(),
        format!("    code: {{local: {{filename: {wasm}}}}}"),
    ];
    let pad = " ".repeat(indent);
    lines.iter().map(|l| format!("{pad}{l}\n")).collect()
}

/// The ECDS file: one TypedExtensionConfig `prefix_router` holding the Wasm filter.
pub fn ecds_yaml(filter_json: &str, version: u64) -> String {
    let filter = serde_json::to_string(filter_json).expect("string");
    let wasm = serde_json::to_string(&super::wasm_path().to_string_lossy()).expect("string");
    format!(
        "version_info: \"{version}\"\nresources:\n- \"@type\": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig\n  name: prefix_router\n  typed_config:\n{}",
        wasm_message(&filter, &wasm, "FAIL_CLOSED", 4)
    )
}

/// The EDS file (a DiscoveryResponse with one ClusterLoadAssignment for `llm`).
pub fn eds_yaml(endpoints: &[String], version: u64) -> String {
    let hosts: String = endpoints
        .iter()
        .map(|e| {
            let (ip, p) = e.rsplit_once(':').expect("IP:port");
            format!("    - endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {p}}}}}}}\n")
        })
        .collect();
    format!(
        "version_info: \"{version}\"\nresources:\n- \"@type\": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\n  cluster_name: llm\n  endpoints:\n  - lb_endpoints:\n{hosts}"
    )
}

impl EnvoyConfig {
    /// The shipped default strategy (`affinity`, no `strategy` field) over
    /// `endpoints` (filter list = cluster list), defaults otherwise except the
    /// decision header, which is sent (the tests read it).
    pub fn new(endpoints: &[String]) -> EnvoyConfig {
        EnvoyConfig {
            endpoints: endpoints.to_vec(),
            // The decision header is off in the filter's defaults; the tests read it.
            filter: json!({"endpoints": endpoints, "decision_header": "x-prefix-router-decision"}),
            filter_raw: None,
            retry_on: "connect-failure,refused-stream,reset,retriable-status-codes".into(),
            hc_interval_ms: 500,
            buffer_limit: 1 << 20,
            body_buffer_limit: 4 << 20,
            concurrency: 2,
            native_strip: true,
            failure_policy: "FAIL_CLOSED".into(),
            wasm: None,
            websocket: false,
            ecds: false,
            dns: false,
            eds: false,
        }
    }

    /// Discovery mode: the filter follows cluster `llm` through the admin
    /// cluster `envoy_admin` every `refresh_ms`, with no `endpoints`.
    pub fn discovery(mut self, refresh_ms: u64) -> EnvoyConfig {
        if let Some(m) = self.filter.as_object_mut() {
            m.remove("endpoints");
        }
        self.with("cluster", json!("llm"))
            .with("admin_cluster", json!("envoy_admin"))
            .with("refresh_ms", json!(refresh_ms))
    }

    /// Strategy `prefix` over `endpoints`, defaults otherwise.
    pub fn prefix(endpoints: &[String]) -> EnvoyConfig {
        EnvoyConfig::new(endpoints).with("strategy", json!("prefix"))
    }

    /// Set one field of the plugin configuration.
    pub fn with(mut self, key: &str, value: Value) -> EnvoyConfig {
        self.filter[key] = value;
        self
    }

    /// Cold placement in ring order at equal loads, the owner the core
    /// predicts without state: no spread of new prefixes by cache pressure
    /// (`spread_cold`, on by default) and no request-share bound
    /// (`share_factor`, set by some configs), which both pick by history.
    pub fn ring_order(self) -> EnvoyConfig {
        self.with("spread_cold", Value::Bool(false))
            .with("share_factor", Value::from(0))
    }

    /// The plugin configuration text.
    pub fn filter_json(&self) -> String {
        self.filter_raw
            .clone()
            .unwrap_or_else(|| self.filter.to_string())
    }

    /// Render the Envoy YAML.
    pub fn render(&self, admin_port: u16, port: u16, wasm: &str) -> String {
        self.render_in(admin_port, port, wasm, std::path::Path::new("."))
    }

    /// Render the Envoy YAML; an EDS file lives in `dir/eds/eds.yaml`, an ECDS one in
    /// `dir/ecds/wasm.yaml`.
    pub fn render_in(
        &self,
        admin_port: u16,
        port: u16,
        wasm: &str,
        dir: &std::path::Path,
    ) -> String {
        let hosts: String = self
            .endpoints
            .iter()
            .map(|e| {
                let (ip, p) = e.rsplit_once(':').expect("IP:port");
                format!(
                    "        - endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {p}}}}}}}\n"
                )
            })
            .collect();
        // A JSON string literal is a valid YAML double-quoted scalar.
        let filter = serde_json::to_string(&self.filter_json()).expect("string");
        let wasm = serde_json::to_string(wasm).expect("string");
        let hc = format!("{:.3}s", self.hc_interval_ms as f64 / 1000.0);
        let retry_on = &self.retry_on;
        let buffer = self.buffer_limit;
        let body_buffer = self.body_buffer_limit;
        let failure_policy = &self.failure_policy;
        let native_strip = if self.native_strip {
            r#"          - name: envoy.filters.http.header_mutation
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
                - remove: x-gateway-destination-endpoint
"#
        } else {
            ""
        };
        let eds_dir = dir.join("eds");
        let wasm_filter = if self.ecds {
            let ecds = dir.join("ecds");
            format!(
                "          - name: prefix_router\n            config_discovery:\n              config_source:\n                resource_api_version: V3\n                path_config_source:\n                  path: {}\n                  watched_directory: {{path: {}}}\n              type_urls: [type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm]\n",
                ecds.join("wasm.yaml").display(),
                ecds.display()
            )
        } else {
            format!(
                "          - name: envoy.filters.http.wasm\n            typed_config:\n{}",
                wasm_message(&filter, &wasm, failure_policy, 14)
            )
        };
        let members = if self.eds {
            format!(
                "    type: EDS\n    eds_cluster_config:\n      eds_config:\n        resource_api_version: V3\n        path_config_source:\n          path: {}\n          watched_directory: {{path: {}}}\n",
                eds_dir.join("eds.yaml").display(),
                eds_dir.display()
            )
        } else if self.dns {
            let hosts = hosts.replace("address: 127.0.0.1,", "address: localhost,");
            format!("    type: STRICT_DNS\n    dns_lookup_family: V4_ONLY\n    load_assignment:\n      cluster_name: llm\n      endpoints:\n      - lb_endpoints:\n{hosts}")
        } else {
            format!("    type: STATIC\n    load_assignment:\n      cluster_name: llm\n      endpoints:\n      - lb_endpoints:\n{hosts}")
        };
        let upgrades = if self.websocket {
            "          upgrade_configs: [{upgrade_type: websocket}]\n"
        } else {
            ""
        };
        format!(
            r#"node: {{id: prefix-router-e2e, cluster: prefix-router-e2e}}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}
stats_config:
  stats_tags:
  - tag_name: endpoint
    regex: '^wasmcustom\.prefix_router\.endpoint\.(([^.]+)\.)'
static_resources:
  listeners:
  - name: llm_ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    per_connection_buffer_limit_bytes: {buffer}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: llm_ingress
          stream_idle_timeout: 30s
{upgrades}          access_log:
          - name: envoy.access_loggers.stdout
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
              log_format:
                text_format_source:
                  inline_string: "ACCESS %REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% upstream=%UPSTREAM_HOST% decision=%REQ(x-prefix-router-decision)% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% replica=%RESP(x-replica-id)% dur=%DURATION% tag=%REQ(x-test-tag)% usage=%FILTER_STATE(wasm.prefix_router:PLAIN)%\n"
          route_config:
            name: llm_routes
            virtual_hosts:
            - name: llm
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                request_body_buffer_limit: {body_buffer}
                route:
                  cluster: llm
                  timeout: 60s
                  retry_policy:
                    retry_on: {retry_on}
                    retriable_status_codes: [503]
                    num_retries: 2
                    retry_host_predicate:
                    - name: envoy.retry_host_predicates.previous_hosts
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
                    host_selection_retry_max_attempts: 5
          http_filters:
{native_strip}{wasm_filter}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              upstream_http_filters:
              - name: envoy.filters.http.header_mutation
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
                  mutations:
                    request_mutations:
                    - remove: x-gateway-destination-endpoint
              - name: envoy.filters.http.upstream_codec
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec
  clusters:
  - name: envoy_admin
    type: STATIC
    connect_timeout: 0.5s
    load_assignment:
      cluster_name: envoy_admin
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}}}
  - name: llm
    connect_timeout: 0.5s
    circuit_breakers:
      thresholds:
      - {{priority: DEFAULT, max_connections: 4096, max_pending_requests: 4096, max_requests: 4096, max_retries: 256}}
{members}    health_checks:
    - timeout: 0.5s
      interval: {hc}
      no_traffic_interval: {hc}
      unhealthy_threshold: 1
      healthy_threshold: 1
      http_health_check: {{path: /health}}
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - header: x-gateway-destination-endpoint
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.least_request
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest
"#
        )
    }
}

/// A running Envoy.
pub struct Envoy {
    proc: Proc,
    /// Admin port.
    pub admin_port: u16,
    /// Listener port.
    pub port: u16,
    /// The YAML it runs.
    pub config_path: PathBuf,
    /// Cluster members (to wait for their health).
    pub endpoints: Vec<String>,
    /// Directory of the EDS file.
    eds_dir: PathBuf,
    eds_version: u64,
}

impl Envoy {
    /// Start Envoy on free ports without waiting for it.
    pub fn spawn(dir: &std::path::Path, name: &str, cfg: &EnvoyConfig) -> Envoy {
        let (admin_port, port) = (free_port(), free_port());
        let wasm = cfg.wasm.clone().unwrap_or_else(wasm_path);
        let yaml = cfg.render_in(admin_port, port, &wasm.to_string_lossy(), dir);
        if cfg.ecds {
            std::fs::create_dir_all(dir.join("ecds")).expect("mkdir ecds");
            write_file(
                &dir.join("ecds"),
                "wasm.yaml",
                &ecds_yaml(&cfg.filter_json(), 1),
            );
        }
        if cfg.eds {
            std::fs::create_dir_all(dir.join("eds")).expect("mkdir eds");
            write_file(&dir.join("eds"), "eds.yaml", &eds_yaml(&cfg.endpoints, 1));
        }
        Envoy::spawn_yaml(
            dir,
            name,
            &yaml,
            (admin_port, port),
            &cfg.endpoints,
            cfg.concurrency,
        )
    }

    /// Start Envoy with a ready-made YAML whose admin and listener ports are `ports`.
    pub fn spawn_yaml(
        dir: &std::path::Path,
        name: &str,
        yaml: &str,
        (admin_port, port): (u16, u16),
        endpoints: &[String],
        concurrency: u32,
    ) -> Envoy {
        let config_path = write_file(dir, &format!("{name}.yaml"), yaml);
        let mut cmd = Command::new(envoy_bin());
        cmd.current_dir(dir)
            .arg("-c")
            .arg(&config_path)
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--disable-hot-restart", "--log-level", "info"])
            .args(["--file-flush-interval-msec", "100"]);
        // Debugging aid: extra Envoy flags, e.g. E2E_ENVOY_ARGS="--component-log-level wasm:debug".
        if let Ok(extra) = std::env::var("E2E_ENVOY_ARGS") {
            cmd.args(extra.split_whitespace());
        }
        let proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log")));
        Envoy {
            proc,
            admin_port,
            port,
            config_path,
            endpoints: endpoints.to_vec(),
            eds_dir: dir.join("eds"),
            eds_version: 1,
        }
    }

    /// Push a new plugin configuration through the ECDS file (atomic rename) and
    /// wait until Envoy applied it (its `config_reload` counter moved).
    pub fn push_filter(&mut self, filter_json: &str) {
        let stat = "extension_config_discovery.http_filter.prefix_router.config_reload";
        let before = self.stats().find(stat).unwrap_or(0);
        self.eds_version += 1;
        let dir = self.eds_dir.with_file_name("ecds");
        let tmp = write_file(
            &dir,
            &format!(".wasm-{}.tmp", self.eds_version),
            &ecds_yaml(filter_json, self.eds_version),
        );
        std::fs::rename(&tmp, dir.join("wasm.yaml")).expect("rename ecds");
        let ok = wait_for(Duration::from_secs(10), || {
            (self.stats().find(stat).unwrap_or(0) > before).then_some(())
        });
        assert!(
            ok.is_some(),
            "ECDS push not applied; log:\n{}",
            self.log_tail(3000)
        );
    }

    /// Replace the EDS membership atomically (write a temporary file, rename it
    /// over `eds.yaml`: the watched directory sees one move).
    pub fn write_eds(&mut self, endpoints: &[String]) {
        self.eds_version += 1;
        let tmp = write_file(
            &self.eds_dir,
            &format!(".eds-{}.tmp", self.eds_version),
            &eds_yaml(endpoints, self.eds_version),
        );
        std::fs::rename(&tmp, self.eds_dir.join("eds.yaml")).expect("rename eds");
        self.endpoints = endpoints.to_vec();
    }

    /// Start Envoy and wait until it is ready, its listener accepts and every cluster
    /// member passed a health check. Panics with Envoy's log otherwise. A start that
    /// lost a port race (another test bound the "free" port first) is retried with new
    /// ports, at most 3 attempts.
    pub fn start(dir: &std::path::Path, name: &str, cfg: &EnvoyConfig) -> Envoy {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut e = Envoy::spawn(dir, name, cfg);
            match e.ready_or_exit() {
                Err(log) if attempt < 3 && log.contains("ddress already in use") => {
                    eprintln!("{name}: port race on start (attempt {attempt}), retrying");
                }
                Err(log) => panic!("{name} exited during start; log:\n{log}"),
                Ok(()) => {
                    e.wait_health(&e.endpoints.clone(), true, Duration::from_secs(15));
                    return e;
                }
            }
        }
    }

    /// Wait until ready (see [`Envoy::start`]).
    pub fn wait_ready(&mut self) {
        if let Err(log) = self.ready_or_exit() {
            panic!("{} exited during start; log:\n{log}", self.proc.name);
        }
        self.wait_health(&self.endpoints.clone(), true, Duration::from_secs(15));
    }

    /// Wait until `/ready` answers 200 and the listener accepts; `Err(log tail)` if
    /// the process exited first. Panics if neither happens in 30 s.
    fn ready_or_exit(&mut self) -> Result<(), String> {
        let admin = Client::new(Duration::from_secs(2));
        let ready_url = format!("http://127.0.0.1:{}/ready", self.admin_port);
        let mut exited = None;
        let ok = wait_for(Duration::from_secs(30), || {
            if let Some(s) = self.proc.exited() {
                exited = Some(format!("({s}) {}", self.proc.log_tail(6000)));
                return Some(());
            }
            let ready = admin.get(&ready_url).is_ok_and(|r| r.status == 200);
            (ready && port_open(self.port)).then_some(())
        });
        if let Some(log) = exited {
            return Err(log);
        }
        assert!(
            ok.is_some(),
            "{} not ready in 30 s (config {}); log:\n{}",
            self.proc.name,
            self.config_path.display(),
            self.proc.log_tail(6000)
        );
        Ok(())
    }

    /// Wait until each of `endpoints` is healthy (`healthy = true`) or failing its
    /// health check (`false`) in Envoy's `/clusters` view.
    pub fn wait_health(&self, endpoints: &[String], healthy: bool, timeout: Duration) {
        let ok = wait_for(timeout, || {
            let text = self.admin("/clusters");
            endpoints
                .iter()
                .all(|e| {
                    let key = format!("llm::{e}::health_flags::");
                    text.lines()
                        .find_map(|l| l.strip_prefix(&key))
                        .is_some_and(|flags| (flags.trim() == "healthy") == healthy)
                })
                .then_some(())
        });
        assert!(
            ok.is_some(),
            "{}: endpoints {endpoints:?} not {} in {timeout:?}; /clusters:\n{}",
            self.proc.name,
            if healthy { "healthy" } else { "unhealthy" },
            self.admin("/clusters")
                .lines()
                .filter(|l| l.contains("health_flags"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// `http://127.0.0.1:<listener><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// GET an admin path, body as text ("" on error).
    pub fn admin(&self, path: &str) -> String {
        Client::new(Duration::from_secs(5))
            .get(&format!("http://127.0.0.1:{}{path}", self.admin_port))
            .map(|r| r.body)
            .unwrap_or_default()
    }

    /// The Envoy process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// Resident memory of the Envoy process (kB, `/proc/<pid>/status` `VmRSS`).
    pub fn rss_kb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }

    /// Current stats.
    pub fn stats(&self) -> Stats {
        Stats::parse(&self.admin("/stats"))
    }

    /// Wait (≤ 5 s) until every endpoint's in-flight gauge is 0; return the stats then.
    /// Panics with the gauges if they do not drain (a leaked count).
    pub fn wait_idle(&self) -> Stats {
        let mut last = Stats::default();
        let idle = wait_for(Duration::from_secs(5), || {
            last = self.stats();
            self.endpoints
                .iter()
                .all(|e| last.in_flight(e) == 0)
                .then_some(())
        });
        assert!(
            idle.is_some(),
            "{}: in-flight gauges did not return to 0:\n{}",
            self.proc.name,
            last.dump("in_flight")
        );
        last
    }

    /// Envoy's log (stdout access log lines start with `ACCESS`, then stderr).
    pub fn log(&self) -> String {
        self.proc.log_text()
    }

    /// The access-log lines.
    pub fn access_log(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.starts_with("ACCESS "))
            .map(str::to_string)
            .collect()
    }

    /// The access log once it has at least `n` lines (≤ 5 s: Envoy flushes it periodically).
    pub fn wait_access_log(&self, n: usize) -> Vec<String> {
        let mut lines = Vec::new();
        let _ = wait_for(Duration::from_secs(5), || {
            lines = self.access_log();
            (lines.len() >= n).then_some(())
        });
        lines
    }

    /// Wait up to `timeout` for Envoy to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.proc.wait_exit(timeout)
    }

    /// Last `max` bytes of the log.
    pub fn log_tail(&self, max: usize) -> String {
        self.proc.log_tail(max)
    }
}
