//! Fault soak (issue 8): steady load through a real Envoy with the real filter while, at
//! random times, replicas are killed and restarted, fail their health checks and answer
//! 503 (mode `503`), stall (mode `hang`), and clients reset mid-body and mid-stream and
//! send oversized bodies; one replica is slow throughout (slow streams).
//!
//! Duration: `SOAK_SECONDS` (default 60, the suite's run; `./build.sh soak [SECONDS]`
//! runs it longer, 600 by default). Report (printed): requests sent, answered (2xx),
//! failed while a fault was active (unavoidable: what a killed, stalled or failing
//! replica held), other failures, resets by design; at the end every filter in-flight
//! gauge is 0 and equal to Envoy's own `rq_active` per host, no Wasm VM was created
//! after the start (no VM restart), and Envoy's resident memory after the warm-up and
//! at the end differ by at most 10 %.
//!
//! Configuration pushes: the listener (with the Wasm filter) comes from an LDS file
//! (`path_config_source` + `watched_directory`); a push rewrites it atomically (rename)
//! with another filter configuration (`min_match` changes), and Envoy must accept each
//! one (`listener_manager.lds.update_success`).

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::procs::{free_port, wait_for};
use crate::harness::workload::{chat, chat_with, text};
use crate::harness::{wasm_path, workdir, Client, Envoy, EnvoyConfig, Fleet, ReplicaOpts};

/// Split a rendered bootstrap into one whose listeners come from the LDS file `lds`
/// (in the watched directory `dir`) and that file's content.
fn with_lds(yaml: &str, lds: &Path, dir: &Path) -> (String, String) {
    let (a, b) = (
        yaml.find("  listeners:\n").expect("listeners"),
        yaml.find("  clusters:\n").expect("clusters"),
    );
    let listeners: Vec<&str> = yaml[a + "  listeners:\n".len()..b]
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect();
    let resources = listeners.join("\n").replacen(
        "- name:",
        "- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name:",
        1,
    );
    let bootstrap = format!(
        "node: {{id: soak, cluster: soak}}\n{}{}dynamic_resources:\n  lds_config:\n    resource_api_version: V3\n    path_config_source:\n      path: {}\n      watched_directory: {{path: {}}}\n",
        &yaml[..a],
        &yaml[b..],
        lds.display(),
        dir.display()
    );
    (bootstrap, format!("resources:\n{resources}\n"))
}

/// Write the LDS file atomically (a rename in the watched directory).
fn push_lds(lds: &Path, text: &str) {
    let tmp = lds.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write LDS");
    std::fs::rename(&tmp, lds).expect("rename LDS");
}

/// xorshift64: deterministic per seed, good enough for fault timing.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// One request's outcome: (start, end, succeeded, what happened).
type Outcome = (Instant, Instant, bool, String);

/// Success and a description of a reply.
fn judge(kind: &str, r: Result<crate::harness::Reply, String>) -> (bool, String) {
    match r {
        Ok(r) if r.status == 200 => (true, String::new()),
        Ok(r) => (
            false,
            format!(
                "{kind}: {} {}",
                r.status,
                r.body.chars().take(120).collect::<String>()
            ),
        ),
        Err(e) => (false, format!("{kind}: {e}")),
    }
}

#[test]
fn fault_soak() {
    let secs: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = workdir("soak");
    let fast = ReplicaOpts::default();
    let slow = ReplicaOpts {
        decode_ms_per_token: 20.0,
        ..ReplicaOpts::default()
    };
    let opts = vec![slow, fast.clone(), fast.clone(), fast];
    let fleet = Mutex::new(Fleet::start_each(&dir, &opts));
    let eps = fleet.lock().unwrap().endpoints();
    let cfg = EnvoyConfig::new(&eps).with("index_slots", json!(4096));
    let ports = (free_port(), free_port());
    let wasm = wasm_path().to_string_lossy().to_string();
    let lds_dir = dir.join("lds");
    std::fs::create_dir_all(&lds_dir).expect("mkdir lds");
    let lds = lds_dir.join("listeners.yaml");
    let render = |c: &EnvoyConfig| with_lds(&c.render(ports.0, ports.1, &wasm), &lds, &lds_dir);
    let (bootstrap, listeners) = render(&cfg);
    push_lds(&lds, &listeners);
    let mut envoy = Envoy::spawn_yaml(&dir, "envoy", &bootstrap, ports, &eps, cfg.concurrency);
    envoy.wait_ready();
    let lds_updates = |e: &Envoy| e.stats().get("listener_manager.lds.update_success");
    let lds_at_start = lds_updates(&envoy);
    let url = envoy.url("/v1/chat/completions");
    let groups: Vec<String> = (0..30).map(|g| text(&format!("soak-{g}"), 3000)).collect();

    // Warm-up: every group once, so the index and the VMs reach their working size.
    let client = Client::new(Duration::from_secs(15));
    for g in &groups {
        let _ = client.post_json(&url, &chat(g, "warm up"));
    }
    let vm_stats = |e: &Envoy| {
        e.stats()
            .matching("wasm.envoy.wasm.runtime")
            .into_iter()
            .filter(|(k, _)| k.ends_with(".created"))
            .map(|(_, v)| v)
            .sum::<u64>()
    };
    let vms_at_start = vm_stats(&envoy);
    let rss_start = envoy.rss_kb().expect("Envoy RSS");

    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let outcomes: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    let faults: Mutex<Vec<(Instant, Instant, String)>> = Mutex::new(Vec::new());
    let resets = AtomicU64::new(0);
    let pushes = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Load: 4 threads × 5 requests/s, a mix of kinds.
        for t in 0..4u64 {
            let (outcomes, resets, groups, url, envoy) =
                (&outcomes, &resets, &groups, &url, &envoy);
            s.spawn(move || {
                let client = Client::new(Duration::from_secs(15));
                let mut x = 0x2545_f491_4f6c_dd1d ^ (t + 1);
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let tick = Instant::now();
                    let g = &groups[(next(&mut x) % groups.len() as u64) as usize];
                    let user = format!("q{t}-{i}");
                    let t0 = Instant::now();
                    let (ok, what) = match i % 20 {
                        0..=11 => judge("chat", client.post_json(url, &chat(g, &user))),
                        12..=14 => judge(
                            "stream",
                            client
                                .post_streaming(url, &chat_with(g, &user, 30, true))
                                .and_then(|s| s.finish()),
                        ),
                        15 => {
                            // Reset mid-stream: read the first chunk, then hang up.
                            if let Ok(mut s) = client.post_streaming(url, &chat_with(g, &user, 200, true)) {
                                let _ = s.first_chunk();
                            }
                            resets.fetch_add(1, Ordering::Relaxed);
                            i += 1;
                            continue;
                        }
                        16 => {
                            // Reset mid-body: half of a declared body, then hang up.
                            if let Ok(mut c) = TcpStream::connect(("127.0.0.1", envoy.port)) {
                                let _ = c.write_all(
                                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"messages\":[",
                                );
                                let _ = c.write_all(&[b' '; 40_000]);
                            }
                            resets.fetch_add(1, Ordering::Relaxed);
                            i += 1;
                            continue;
                        }
                        17 => {
                            // Oversized: above max_body_bytes (768 KiB), routed on its raw
                            // prefix; padded with JSON whitespace so the prompt stays small.
                            let mut big = chat(g, &user);
                            big.pop();
                            big.push_str(&" ".repeat(900 << 10));
                            big.push('}');
                            judge("oversize", client.post_json(url, &big))
                        }
                        _ => {
                            let r = client
                            .post_json(
                                &envoy.url("/v1/completions"),
                                &json!({"model": "m", "prompt": format!("{g} {user}"), "max_tokens": 4}).to_string(),
                            )
                            ;
                            judge("completions", r)
                        }
                    };
                    outcomes.lock().unwrap().push((t0, Instant::now(), ok, what));
                    i += 1;
                    if let Some(rest) = Duration::from_millis(200).checked_sub(tick.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            });
        }
        // Faults: every 3–6 s one replica is killed (restarted 2 s later), fails (503 and
        // failing health checks) or stalls (hang) for 2 s. One fault at a time.
        let (fleet, faults, dir, opts, pushes) = (&fleet, &faults, &dir, &opts, &pushes);
        let (cfg, render, lds) = (&cfg, &render, &lds);
        s.spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut generation = 1;
            loop {
                let wait = Duration::from_millis(3000 + next(&mut x) % 3000);
                if Instant::now() + wait + Duration::from_secs(3) > deadline {
                    break;
                }
                std::thread::sleep(wait);
                let k = (next(&mut x) % 4) as usize;
                let kind = ["kill", "503", "hang", "push"][(next(&mut x) % 4) as usize];
                let t0 = Instant::now();
                match kind {
                    "push" => {
                        // A new filter configuration; requests must not notice.
                        let n = pushes.fetch_add(1, Ordering::Relaxed) + 1;
                        let c = cfg
                            .clone()
                            .with("min_match", json!(0.2 + 0.01 * (n % 10) as f64));
                        push_lds(lds, &render(&c).1);
                        continue;
                    }
                    "kill" => {
                        fleet.lock().unwrap().replicas[k].kill();
                        std::thread::sleep(Duration::from_secs(2));
                        fleet.lock().unwrap().replicas[k].restart(dir, &opts[k], generation);
                        generation += 1;
                    }
                    mode => {
                        fleet.lock().unwrap().replicas[k].set_fail(mode);
                        std::thread::sleep(Duration::from_secs(2));
                        fleet.lock().unwrap().replicas[k].set_fail("none");
                    }
                }
                faults
                    .lock()
                    .unwrap()
                    .push((t0, Instant::now(), format!("{kind} r{k}")));
            }
        });
    });

    // Drain: stalled requests end at the client timeout (15 s); health recovers.
    envoy.wait_health(&eps, true, Duration::from_secs(20));
    let drained = wait_for(Duration::from_secs(30), || {
        let st = envoy.stats();
        eps.iter().all(|e| st.in_flight(e) == 0).then_some(st)
    });
    let clusters = envoy.admin("/clusters");
    let rq_active: Vec<(String, u64)> = eps
        .iter()
        .map(|e| {
            let key = format!("llm::{e}::rq_active::");
            let v = clusters
                .lines()
                .find_map(|l| l.strip_prefix(&key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(u64::MAX);
            (e.clone(), v)
        })
        .collect();
    let vms_at_end = vm_stats(&envoy);
    let pushes = pushes.load(Ordering::Relaxed);
    let pushes_accepted = lds_updates(&envoy) - lds_at_start;
    let rss_end = envoy.rss_kb().expect("Envoy RSS");

    // A failure is unavoidable if the request overlapped a fault (plus 3 s for health
    // checks and retries to settle).
    let faults = faults.into_inner().unwrap();
    let outcomes = outcomes.into_inner().unwrap();
    let overlaps = |(a, b, _, _): &Outcome| {
        faults
            .iter()
            .any(|(f0, f1, _)| *a <= *f1 + Duration::from_secs(3) && *b >= *f0)
    };
    let answered = outcomes.iter().filter(|o| o.2).count();
    let unavoidable = outcomes.iter().filter(|o| !o.2 && overlaps(o)).count();
    let other = outcomes.iter().filter(|o| !o.2 && !overlaps(o)).count();
    let report = format!(
        "soak {secs} s: sent {} (+{} resets by design), answered {answered}, failed during a fault {unavoidable}, other failures {other}; faults {}: {:?}; in-flight at end {}; Envoy rq_active {:?}; Wasm VMs created before / during the soak {vms_at_start} / {} (VM restarts: {}); Envoy RSS {rss_start} kB -> {rss_end} kB ({:+.1} %); config pushes {pushes} (accepted {pushes_accepted})",
        outcomes.len(),
        resets.load(Ordering::Relaxed),
        faults.len(),
        faults.iter().map(|f| f.2.as_str()).collect::<Vec<_>>(),
        if drained.is_some() { "all 0" } else { "NOT 0" },
        rq_active,
        vms_at_end - vms_at_start,
        (vms_at_end - vms_at_start).saturating_sub(pushes_accepted),
        (rss_end as f64 / rss_start as f64 - 1.0) * 100.0,
    );
    let others: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.2 && !overlaps(o))
        .map(|o| o.3.as_str())
        .take(10)
        .collect();
    let report = format!("{report}; other failures: {others:?}");
    println!("{report}");
    let _ = std::fs::write(dir.join("report.txt"), &report);
    assert!(drained.is_some(), "{report}");
    assert!(rq_active.iter().all(|(_, v)| *v == 0), "{report}");
    assert!(
        vms_at_start > 0,
        "no wasm runtime `created` stat found: {report}"
    );
    // A configuration push creates one base VM for the new filter configuration
    // (the workers keep theirs); any VM created beyond that is a restart.
    assert!(
        vms_at_end - vms_at_start <= pushes_accepted,
        "a Wasm VM was restarted: {report}"
    );
    assert!(
        (rss_end as f64) <= rss_start as f64 * 1.10,
        "Envoy memory grew more than 10 %: {report}"
    );
    assert!(
        !faults.is_empty() || secs < 10,
        "no fault injected: {report}"
    );
    assert_eq!(other, 0, "{report}");
    assert_eq!(pushes_accepted, pushes, "{report}");
    assert!(answered * 10 >= outcomes.len() * 8, "{report}");
}
