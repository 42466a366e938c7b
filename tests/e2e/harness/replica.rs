//! Emulated model servers (`replica-emulator`): real HTTP servers with OpenAI endpoints,
//! SSE streaming, `/health`, vLLM `/metrics` and `/debug/requests`.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::procs::{free_port, port_open, wait_for, Proc};
use super::{emulator_bin, Client};

/// Timing and failure knobs of one emulator.
#[derive(Debug, Clone)]
pub struct ReplicaOpts {
    /// Prefill cost per uncached prompt token (µs).
    pub prefill_us_per_token: f64,
    /// Inter-token latency (ms).
    pub decode_ms_per_token: f64,
    /// Concurrently running sequences.
    pub max_running: usize,
    /// `none | 503 | hang | die`.
    pub fail: &'static str,
    /// LoRA adapters served (`--lora-adapters`), listed as loaded in `/metrics`.
    pub lora_adapters: Vec<String>,
}

impl Default for ReplicaOpts {
    /// Fast replicas: tests are about placement, not timing.
    fn default() -> Self {
        ReplicaOpts {
            prefill_us_per_token: 2.0,
            decode_ms_per_token: 0.2,
            max_running: 64,
            fail: "none",
            lora_adapters: Vec::new(),
        }
    }
}

/// One running emulator.
pub struct Replica {
    /// Its `--id`, echoed in `x-replica-id`.
    pub id: String,
    /// Its loopback port.
    pub port: u16,
    proc: Proc,
}

impl Replica {
    /// `127.0.0.1:<port>`, the form the filter and Envoy use.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Kill the process (SIGKILL): the replica dies without a goodbye.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Switch the failure mode at run time.
    pub fn set_fail(&self, mode: &str) {
        let r = Client::new(Duration::from_secs(5))
            .post(&self.url(&format!("/admin/fail?mode={mode}")), b"", &[])
            .unwrap_or_else(|e| panic!("replica {}: set fail mode: {e}", self.id));
        assert!(
            r.status < 300,
            "replica {}: /admin/fail -> {}",
            self.id,
            r.status
        );
    }

    /// Make `/metrics` report `waiting` queued requests and KV usage `kv` (`None`: the
    /// real value), through the emulator's `/admin/metrics-override`.
    pub fn set_load(&self, waiting: Option<u32>, kv: Option<f64>) {
        let show = |v: Option<String>| v.unwrap_or_default();
        let path = format!(
            "/admin/metrics-override?waiting={}&kv_usage={}",
            show(waiting.map(|w| w.to_string())),
            show(kv.map(|k| k.to_string()))
        );
        let r = Client::new(Duration::from_secs(5))
            .post(&self.url(&path), b"", &[])
            .unwrap_or_else(|e| panic!("replica {}: metrics override: {e}", self.id));
        assert!(
            r.status < 300,
            "replica {}: {path} -> {} {}",
            self.id,
            r.status,
            r.body
        );
    }

    /// Recent requests as the emulator saw them (`/debug/requests`), oldest first.
    pub fn requests(&self) -> Vec<Value> {
        let r = Client::new(Duration::from_secs(5))
            .get(&self.url("/debug/requests"))
            .unwrap_or_else(|e| panic!("replica {}: /debug/requests: {e}", self.id));
        let v: Value = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("replica {}: /debug/requests not JSON: {e}", self.id));
        match v {
            Value::Array(a) => a,
            Value::Object(mut o) => match o.remove("requests") {
                Some(Value::Array(a)) => a,
                _ => panic!(
                    "replica {}: /debug/requests has no `requests` array",
                    self.id
                ),
            },
            _ => panic!("replica {}: /debug/requests is not a list", self.id),
        }
    }

    /// Requests to model endpoints (`/v1/...`) only, not health checks.
    pub fn model_requests(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/v1/")))
            .collect()
    }

    /// One value from `/metrics` (Prometheus text), by metric name (labels ignored).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let r = Client::new(Duration::from_secs(5))
            .get(&self.url("/metrics"))
            .ok()?;
        r.body.lines().find_map(|l| {
            let l = l.trim();
            if l.starts_with('#') {
                return None;
            }
            let (key, value) = l.rsplit_once(' ')?;
            let bare = key.split('{').next()?;
            (bare == name).then(|| value.parse().ok()).flatten()
        })
    }
}

/// A set of emulators, ids `r0`, `r1`, ….
pub struct Fleet {
    /// The replicas, in start order.
    pub replicas: Vec<Replica>,
}

impl Fleet {
    /// Start `n` emulators with the same options.
    pub fn start(dir: &std::path::Path, n: usize, opts: &ReplicaOpts) -> Fleet {
        Fleet::start_each(dir, &vec![opts.clone(); n])
    }

    /// Start one emulator per entry of `opts` and wait until each answers `/health`.
    pub fn start_each(dir: &std::path::Path, opts: &[ReplicaOpts]) -> Fleet {
        let mut replicas = Vec::new();
        for (i, o) in opts.iter().enumerate() {
            let id = format!("r{i}");
            let port = free_port();
            let proc = spawn_emulator(dir, &id, port, o, 0);
            replicas.push(Replica { id, port, proc });
        }
        for r in &mut replicas {
            r.wait_up();
        }
        Fleet { replicas }
    }

    /// `IP:port` of every replica, start order.
    pub fn endpoints(&self) -> Vec<String> {
        self.replicas.iter().map(Replica::addr).collect()
    }
}

/// Start one emulator process (`generation` numbers its log after restarts).
fn spawn_emulator(
    dir: &std::path::Path,
    id: &str,
    port: u16,
    o: &ReplicaOpts,
    generation: u32,
) -> Proc {
    let mut cmd = Command::new(emulator_bin());
    cmd.args(["--port", &port.to_string(), "--id", id])
        .args([
            "--prefill-us-per-token",
            &o.prefill_us_per_token.to_string(),
        ])
        .args(["--decode-ms-per-token", &o.decode_ms_per_token.to_string()])
        .args(["--max-running", &o.max_running.to_string()])
        .args(["--fail", o.fail]);
    if !o.lora_adapters.is_empty() {
        cmd.args(["--lora-adapters", &o.lora_adapters.join(",")]);
    }
    let log = if generation == 0 {
        dir.join(format!("{id}.log"))
    } else {
        dir.join(format!("{id}.{generation}.log"))
    };
    Proc::spawn(&format!("replica {id}"), cmd, &log)
}

impl Replica {
    /// Start a killed replica again on the same port (a new process, empty cache) and
    /// wait until it answers `/health`.
    pub fn restart(&mut self, dir: &std::path::Path, opts: &ReplicaOpts, generation: u32) {
        self.proc.kill();
        self.proc = spawn_emulator(dir, &self.id, self.port, opts, generation);
        self.wait_up();
    }

    /// Wait until `/health` answers (panics with the log otherwise).
    fn wait_up(&mut self) {
        let client = Client::new(Duration::from_secs(2));
        let r = self;
        {
            let up = wait_for(Duration::from_secs(15), || {
                if let Some(s) = r.proc.exited() {
                    panic!(
                        "replica {} exited at start ({s}): {}",
                        r.id,
                        r.proc.log_tail(2000)
                    );
                }
                (port_open(r.port) && client.get(&r.url("/health")).is_ok()).then_some(())
            });
            assert!(
                up.is_some(),
                "replica {} not up: {}",
                r.id,
                r.proc.log_tail(2000)
            );
        }
    }
}

impl Fleet {
    /// The replica with `id`.
    pub fn by_id(&self, id: &str) -> &Replica {
        self.replicas
            .iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no replica {id}"))
    }

    /// The replica listening at `addr` (`127.0.0.1:port`).
    pub fn by_addr(&self, addr: &str) -> &Replica {
        self.replicas
            .iter()
            .find(|r| r.addr() == addr)
            .unwrap_or_else(|| panic!("no replica at {addr}"))
    }

    /// Every model request seen by any replica.
    pub fn all_model_requests(&self) -> Vec<(String, Value)> {
        self.replicas
            .iter()
            .flat_map(|r| r.model_requests().into_iter().map(|v| (r.id.clone(), v)))
            .collect()
    }
}
