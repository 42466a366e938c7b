//! Many gateways, one placement (issue 11): real Envoys that exchange their
//! `affinity` index writes through the `peers` cluster.
//!
//! One test, three arms on fresh replica fleets (7 emulators each), the same
//! seeded mixed workload (the demo's mix: 50 % requests on 12 shared
//! 2 000-token system prompts, 30 % multi-turn chats, 20 % unique short
//! prompts), sent open loop by a client that picks a live gateway at random
//! for every request:
//! 1. one Envoy (the reference hit rate);
//! 2. three Envoys without `peers` (what the exchange fixes; printed);
//! 3. three Envoys with `peers`, then one killed mid-run, then a fourth
//!    started cold. Hit rates are the replicas' own counters
//!    (`vllm:prefix_cache_hits_total / queries_total`) and, per time window or
//!    gateway, the `cached_tokens` of each response.
//!
//! It also sends unsigned and garbage requests to the sync path and expects
//! 403 / 400, counted in the stats, and never forwarded to a replica; and it
//! measures the sync bytes each gateway served per routed request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::procs::{free_port, wait_for};
use crate::harness::workload::{text, MODEL};
use crate::harness::{wasm_path, workdir, Client, Envoy, EnvoyConfig, Fleet, ReplicaOpts};
use prefix_router::peers::HEADER_BYTES;

const SECRET: &str = "e2e-peers-secret-0123456789";
const PEERS_PATH: &str = "/prefix-router/peers";
/// Pull period of the test's gateways (ms; the default is 100: faster pulls
/// keep the comparison with one Envoy stable on a loaded 2-core machine).
const PULL_MS: u64 = 50;
/// Offered load (requests per second, open loop).
const RATE: f64 = 50.0;

/// Does the peers cluster speak HTTP/2 (`E2E_PEERS_H1=1`: HTTP/1.1, to
/// compare the bytes of a pull)? With HTTP/2 a pull's headers are mostly
/// HPACK indices (the secret, the target header, the method) on one
/// long-lived connection per peer.
fn peers_h2() -> bool {
    std::env::var("E2E_PEERS_H1").map_or(true, |v| v != "1")
}

/// The `prefix_router_peers` cluster over the gateways' listener ports (YAML
/// lines under `clusters:`), `override_host` with a round-robin fallback,
/// HTTP/2 if `h2` (the listener's codec is AUTO: it accepts prior-knowledge
/// HTTP/2).
fn peers_cluster(ports: &[u16], h2: bool) -> String {
    let h2 = if h2 {
        r#"    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
"#
    } else {
        ""
    };
    let hosts: String = ports
        .iter()
        .map(|p| {
            format!("        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}\n")
        })
        .collect();
    format!(
        r#"  - name: prefix_router_peers
    type: STATIC
    connect_timeout: 0.25s
{h2}    load_assignment:
      cluster_name: prefix_router_peers
      endpoints:
      - lb_endpoints:
{hosts}    load_balancing_policy:
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
                  name: envoy.load_balancing_policies.round_robin
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
"#
    )
}

fn gateway_config(endpoints: &[String], peers: bool) -> EnvoyConfig {
    let c = EnvoyConfig::new(endpoints);
    if !peers {
        return c;
    }
    c.with(
        "peers",
        json!({"cluster": "prefix_router_peers", "admin_cluster": "envoy_admin",
               "secret": SECRET, "pull_ms": PULL_MS, "hosts_refresh_ms": 500,
               "min_publish_chars": min_publish()}),
    )
}

/// `peers.min_publish_chars` (`E2E_PEERS_MIN_PUBLISH` overrides the default, to measure).
fn min_publish() -> u64 {
    std::env::var("E2E_PEERS_MIN_PUBLISH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

/// Start Envoy `name` on `ports` (admin, listener) with the peers cluster over
/// `peer_ports` (none: no cluster), without waiting.
fn spawn_gateway(
    dir: &std::path::Path,
    name: &str,
    cfg: &EnvoyConfig,
    (admin, port): (u16, u16),
    peer_ports: &[u16],
) -> Envoy {
    spawn_gateway_h(dir, name, cfg, (admin, port), (peer_ports, peers_h2()))
}

/// [`spawn_gateway`], the peers cluster speaking HTTP/2 or not.
fn spawn_gateway_h(
    dir: &std::path::Path,
    name: &str,
    cfg: &EnvoyConfig,
    (admin, port): (u16, u16),
    (peer_ports, h2): (&[u16], bool),
) -> Envoy {
    let yaml = cfg.render_in(admin, port, &wasm_path().to_string_lossy(), dir);
    let yaml = if peer_ports.is_empty() {
        yaml
    } else {
        yaml.replacen(
            "  clusters:\n",
            &format!("  clusters:\n{}", peers_cluster(peer_ports, h2)),
            1,
        )
    };
    Envoy::spawn_yaml(
        dir,
        name,
        &yaml,
        (admin, port),
        &cfg.endpoints,
        cfg.concurrency,
    )
}

/// The demo's mixed workload, seeded: bodies in sending order.
struct Mixed {
    rng: u64,
    n: usize,
    /// Active chats: (id, turns so far, messages).
    chats: Vec<(usize, usize, Vec<Value>)>,
    next_chat: usize,
}

impl Mixed {
    fn new(seed: u64) -> Mixed {
        let mut m = Mixed {
            rng: seed | 1,
            n: 0,
            chats: Vec::new(),
            next_chat: 0,
        };
        for _ in 0..6 {
            m.open_chat();
        }
        m
    }

    fn rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn open_chat(&mut self) {
        let id = self.next_chat;
        self.next_chat += 1;
        let sys = json!({"role": "system", "content": text(&format!("chat-system-{id}"), 800)});
        self.chats.push((id, 0, vec![sys]));
    }

    fn body(messages: &[Value]) -> String {
        json!({"model": MODEL, "messages": messages, "max_tokens": 4}).to_string()
    }

    fn take(&mut self, k: usize) -> Vec<String> {
        (0..k).map(|_| self.next_body()).collect()
    }

    fn next_body(&mut self) -> String {
        self.n += 1;
        let n = self.n;
        let r = self.rand() % 100;
        if r < 50 {
            let g = self.rand() % 12;
            Mixed::body(&[
                json!({"role": "system", "content": text(&format!("group-{g}"), 8000)}),
                json!({"role": "user", "content": text(&format!("question-{n}"), 128)}),
            ])
        } else if r < 80 {
            let i = (self.rand() % self.chats.len() as u64) as usize;
            let (id, turns, msgs) = &mut self.chats[i];
            msgs.push(
                json!({"role": "user", "content": text(&format!("chat-{id}-turn-{turns}"), 600)}),
            );
            let body = Mixed::body(msgs);
            msgs.push(json!({"role": "assistant", "content": format!("answer {id} {turns}")}));
            *turns += 1;
            if *turns == 5 {
                self.chats.remove(i);
                self.open_chat();
            }
            body
        } else {
            Mixed::body(&[json!({"role": "user", "content": text(&format!("unique-{n}"), 128)})])
        }
    }
}

/// One request's outcome.
#[derive(Debug, Clone)]
struct Outcome {
    /// When it was sent, since the phase started.
    at: Duration,
    gateway: usize,
    /// 0: transport error.
    status: u16,
    prompt: u64,
    cached: u64,
    bytes: usize,
}

/// The live gateways: (index, listener URL).
type Live = Arc<Mutex<Vec<(usize, String)>>>;

/// Send `bodies` open loop at [`RATE`], each to a random live gateway.
/// `sent` counts the requests sent so far (to act mid-run).
fn run(bodies: Vec<String>, live: &Live, sent: &Arc<AtomicUsize>) -> Vec<Outcome> {
    let bodies = Arc::new(bodies);
    let next = Arc::new(AtomicUsize::new(0));
    let out = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..12)
        .map(|w| {
            let (bodies, next, out, live, sent) = (
                bodies.clone(),
                next.clone(),
                out.clone(),
                live.clone(),
                sent.clone(),
            );
            std::thread::spawn(move || {
                let client = Client::new(Duration::from_secs(15));
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(body) = bodies.get(i) else { break };
                    let due = Duration::from_secs_f64(i as f64 / RATE);
                    if let Some(wait) = due.checked_sub(t0.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let (gateway, url) = {
                        let l = live.lock().unwrap();
                        l[(rng % l.len() as u64) as usize].clone()
                    };
                    let at = t0.elapsed();
                    sent.fetch_add(1, Ordering::SeqCst);
                    let reply = client.post_json(&format!("{url}/v1/chat/completions"), body);
                    let (status, prompt, cached) = match reply {
                        Ok(r) => {
                            let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
                            let usage = &v["usage"];
                            (
                                r.status,
                                usage["prompt_tokens"].as_u64().unwrap_or(0),
                                usage
                                    .pointer("/prompt_tokens_details/cached_tokens")
                                    .and_then(Value::as_u64)
                                    .unwrap_or(0),
                            )
                        }
                        Err(_) => (0, 0, 0),
                    };
                    out.lock().unwrap().push(Outcome {
                        at,
                        gateway,
                        status,
                        prompt,
                        cached,
                        bytes: body.len(),
                    });
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("client thread");
    }
    let mut v = out.lock().unwrap().clone();
    v.sort_by_key(|o| o.at);
    v
}

/// Token hit rate (%) of `outcomes` (answered ones).
fn hit_rate<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> f64 {
    let (mut p, mut c) = (0u64, 0u64);
    for o in outcomes {
        p += o.prompt;
        c += o.cached;
    }
    if p == 0 {
        0.0
    } else {
        100.0 * c as f64 / p as f64
    }
}

/// Replica counters: (hits, queries) summed over the fleet.
fn replica_counters(fleet: &Fleet) -> (f64, f64) {
    fleet.replicas.iter().fold((0.0, 0.0), |(h, q), r| {
        (
            h + r.metric("vllm:prefix_cache_hits_total").unwrap_or(0.0),
            q + r.metric("vllm:prefix_cache_queries_total").unwrap_or(0.0),
        )
    })
}

fn replica_hit_rate(fleet: &Fleet, before: (f64, f64)) -> f64 {
    let (h, q) = replica_counters(fleet);
    let (dh, dq) = (h - before.0, q - before.1);
    if dq <= 0.0 {
        0.0
    } else {
        100.0 * dh / dq
    }
}

/// A raw HTTP/1.1 request to `port` (status, body bytes).
fn raw(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\ncontent-length: 0\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write");
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |i| i + 4);
    let status = std::str::from_utf8(&resp[..head_end.min(resp.len())])
        .ok()
        .and_then(|h| h.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, resp[head_end..].to_vec())
}

/// Hit rate of one fleet behind `n` gateways (peers off) over `bodies`.
fn reference_arm(name: &str, n: usize, bodies: &[String]) -> f64 {
    let dir = workdir(name);
    let fleet = Fleet::start(&dir, 7, &ReplicaOpts::default());
    let cfg = gateway_config(&fleet.endpoints(), false);
    let mut gws: Vec<Envoy> = (0..n)
        .map(|i| {
            spawn_gateway(
                &dir,
                &format!("gw{i}"),
                &cfg,
                (free_port(), free_port()),
                &[],
            )
        })
        .collect();
    for g in &mut gws {
        g.wait_ready();
    }
    let live: Live = Arc::new(Mutex::new(
        gws.iter()
            .enumerate()
            .map(|(i, g)| (i, g.url("")))
            .collect(),
    ));
    let before = replica_counters(&fleet);
    let out = run(bodies.to_vec(), &live, &Arc::new(AtomicUsize::new(0)));
    let failed = out.iter().filter(|o| o.status != 200).count();
    assert_eq!(failed, 0, "{name}: {failed} failed requests");
    replica_hit_rate(&fleet, before)
}

#[test]
fn three_gateways_agree_survive_a_kill_and_a_cold_start() {
    let mut work = Mixed::new(7);
    let phase1 = work.take(300);
    let phase2 = work.take(300);
    let phase3 = work.take(400);

    // 1. One Envoy; 2. three without peers.
    let single = reference_arm("gateways-single", 1, &phase1);
    let indep = reference_arm("gateways-indep", 3, &phase1);

    // 3. Three Envoys with peers (a fourth port reserved for the cold start).
    let dir = workdir("gateways-peers");
    let fleet = Fleet::start(&dir, 7, &ReplicaOpts::default());
    let cfg = gateway_config(&fleet.endpoints(), true);
    let ports: Vec<(u16, u16)> = (0..4).map(|_| (free_port(), free_port())).collect();
    let peer_ports: Vec<u16> = ports.iter().map(|p| p.1).collect();
    let mut gws: Vec<Option<Envoy>> = (0..3)
        .map(|i| {
            Some(spawn_gateway(
                &dir,
                &format!("gw{i}"),
                &cfg,
                ports[i],
                &peer_ports,
            ))
        })
        .collect();
    for g in gws.iter_mut().flatten() {
        g.wait_ready();
    }
    let live: Live = Arc::new(Mutex::new(
        gws.iter()
            .enumerate()
            .filter_map(|(i, g)| g.as_ref().map(|g| (i, g.url(""))))
            .collect(),
    ));
    let before = replica_counters(&fleet);
    let out1 = run(phase1, &live, &Arc::new(AtomicUsize::new(0)));
    let peers = replica_hit_rate(&fleet, before);
    let failed = out1.iter().filter(|o| o.status != 200).count();
    eprintln!(
        "gateways: replica hit rate, same {} requests: one Envoy {single:.1} %, three without peers {indep:.1} %, three with peers {peers:.1} %",
        out1.len()
    );
    assert_eq!(failed, 0, "failed requests with three gateways");
    assert!(
        (peers - single).abs() <= 3.0,
        "three gateways with peers: {peers:.1} % vs one Envoy {single:.1} %"
    );

    // Kill gateway 2 after 90 requests of phase 2: remove it from the client's
    // list, then SIGKILL. Only requests sent to it before that may fail.
    let sent = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (live, sent) = (live.clone(), sent.clone());
        let victim = gws[2].take().expect("gateway 2");
        std::thread::spawn(move || {
            let t0 = Instant::now();
            wait_for(Duration::from_secs(30), || {
                (sent.load(Ordering::SeqCst) >= 90).then_some(())
            });
            live.lock().unwrap().retain(|(i, _)| *i != 2);
            let removed = t0.elapsed();
            drop(victim); // SIGKILL
            removed
        })
    };
    let out2 = run(phase2, &live, &sent);
    let removed = killer.join().expect("killer");
    let bad: Vec<_> = out2
        .iter()
        .filter(|o| o.status != 200 && !(o.gateway == 2 && o.at <= removed))
        .collect();
    assert!(
        bad.is_empty(),
        "requests lost beyond the killed gateway's: {bad:?}"
    );
    let held = out2.iter().filter(|o| o.status != 200).count();
    let before_kill = hit_rate(out2.iter().filter(|o| o.at <= removed && o.status == 200));
    let windows: Vec<f64> = (0..5)
        .map(|s| {
            let lo = removed + Duration::from_secs(s);
            hit_rate(
                out2.iter()
                    .filter(|o| o.at > lo && o.at <= lo + Duration::from_secs(1)),
            )
        })
        .collect();
    let after = hit_rate(out2.iter().filter(|o| o.at > removed));
    eprintln!(
        "gateways: killed gateway 2 at {removed:?} ({held} requests it held failed); hit rate before {before_kill:.1} %, after {after:.1} %, 1-s windows after the kill {windows:.1?}"
    );
    let recovered = windows.iter().position(|&w| w >= before_kill - 5.0);
    assert!(
        recovered.is_some_and(|s| s < 5),
        "hit rate did not recover within 5 s: before {before_kill:.1} %, windows {windows:.1?}"
    );

    // A fourth gateway starts cold and takes a third of the traffic.
    let mut d = spawn_gateway(&dir, "gw3", &cfg, ports[3], &peer_ports);
    let started = Instant::now();
    d.wait_ready();
    let ready_after = started.elapsed();
    live.lock().unwrap().push((3, d.url("")));
    gws.push(Some(d));
    let out3 = run(phase3, &live, &Arc::new(AtomicUsize::new(0)));
    assert!(
        out3.iter().all(|o| o.status == 200),
        "failed requests with the cold gateway"
    );
    let others = hit_rate(out3.iter().filter(|o| o.gateway != 3));
    let cold = hit_rate(out3.iter().filter(|o| o.gateway == 3));
    let cold_first = hit_rate(
        out3.iter()
            .filter(|o| o.gateway == 3 && o.at <= Duration::from_secs(2)),
    );
    let by_window = |cold: bool| -> Vec<f64> {
        (0..4)
            .map(|w| {
                let lo = Duration::from_secs(2 * w);
                hit_rate(out3.iter().filter(|o| {
                    (o.gateway == 3) == cold && o.at > lo && o.at <= lo + Duration::from_secs(2)
                }))
            })
            .collect()
    };
    eprintln!(
        "gateways: 2-s windows after the cold start: cold gateway {:.1?}, the others {:.1?}",
        by_window(true),
        by_window(false)
    );
    let d_stats = gws[3].as_ref().expect("gw3").stats();
    eprintln!(
        "gateways: cold gateway ready after {ready_after:?}; its hit rate {cold:.1} % (first 2 s {cold_first:.1} %) vs the others {others:.1} %; pulled {} batches, applied {} writes; its decisions hit {} cold {} spill {} (gw0: hit {} cold {} spill {}); snapshot: {} slots filled",
        d_stats.get("prefix_router.peers.pull_ok"),
        d_stats.get("prefix_router.peers.writes_applied"),
        d_stats.branch("hit"),
        d_stats.branch("cold"),
        d_stats.branch("spill"),
        gws[0].as_ref().expect("gw0").stats().branch("hit"),
        gws[0].as_ref().expect("gw0").stats().branch("cold"),
        gws[0].as_ref().expect("gw0").stats().branch("spill"),
        d_stats.get("prefix_router.peers.snapshot_applied"),
    );
    // The sync path: refused without the secret (403), with garbage (400),
    // answered with it; never forwarded to a replica.
    let port = ports[0].1;
    let path0 = format!("{PEERS_PATH}?since=0");
    assert_eq!(raw(port, "GET", &path0, &[]).0, 403);
    assert_eq!(
        raw(
            port,
            "GET",
            &path0,
            &[("x-prefix-router-peer", "wrong-secret-0123456789")]
        )
        .0,
        403
    );
    let auth = [("x-prefix-router-peer", SECRET)];
    assert_eq!(
        raw(port, "GET", &format!("{PEERS_PATH}?since=abc"), &auth).0,
        400
    );
    assert_eq!(
        raw(port, "GET", &format!("{PEERS_PATH}?since=1&x=2"), &auth).0,
        400
    );
    assert_eq!(raw(port, "POST", &path0, &auth).0, 400);
    let (status, body) = raw(port, "GET", &path0, &auth);
    assert_eq!(status, 200);
    assert_eq!(&body[..4], &prefix_router::peers::MAGIC, "not a batch");
    let a = gws[0].as_ref().expect("gw0").stats();
    assert!(a.get("prefix_router.peers.unauthorized") >= 2);
    assert!(a.get("prefix_router.peers.bad_request") >= 3);
    for r in &fleet.replicas {
        assert!(
            r.requests()
                .iter()
                .all(|q| !q["path"].as_str().unwrap_or("").contains("prefix-router")),
            "a sync request reached replica {}",
            r.id
        );
    }

    // Sync traffic of each surviving gateway, measured: the entry bytes it
    // served (its writes, to 2 peers, plus the cold gateway's one-off
    // catch-up of the whole log) and received, per routed request; a pull's
    // fixed cost (28-byte batch header + HTTP, measured on the wire by
    // Envoy's counters of the peers cluster) scales with time, so it is
    // given at 1 000 req/s and the default 100 ms period. The bound is
    // checked on what a gateway sends (served entries + served pulls'
    // fixed cost); sent + received is printed.
    let all: Vec<&Outcome> = out1.iter().chain(&out2).chain(&out3).collect();
    let elapsed = out1.last().map_or(0.0, |o| o.at.as_secs_f64())
        + out2.last().map_or(0.0, |o| o.at.as_secs_f64())
        + out3.last().map_or(0.0, |o| o.at.as_secs_f64());
    for (i, g) in gws.iter().enumerate() {
        let Some(g) = g else { continue };
        let s = g.stats();
        let mine: Vec<&&Outcome> = all.iter().filter(|o| o.gateway == i).collect();
        let routed = mine.len().max(1) as f64;
        // Request bytes: the body plus ~200 B of request line and headers.
        let own_bytes = mine.iter().map(|o| o.bytes + 200).sum::<usize>().max(1) as f64;
        let served = s.get("prefix_router.peers.served_bytes");
        let pulls = s.get("prefix_router.peers.served");
        let entries = served.saturating_sub(pulls * HEADER_BYTES as u64) as f64;
        let published = s.get("prefix_router.peers.writes_published") as f64;
        let sent = 100.0 * entries / own_bytes;
        let pulled_ok = s.get("prefix_router.peers.pull_ok");
        let received_entries = s
            .get("prefix_router.peers.pulled_bytes")
            .saturating_sub(pulled_ok * HEADER_BYTES as u64);
        let received = 100.0 * received_entries as f64 / own_bytes;
        // On the wire (Envoy's own counters of the peers cluster): what this
        // gateway's pulls sent and received, headers included; the bytes of
        // a pull besides its entries (a served pull costs the same).
        let wire = |d: &str| {
            s.get(&format!(
                "cluster.prefix_router_peers.upstream_cx_{d}_bytes_total"
            ))
        };
        let (tx, rx) = (wire("tx"), wire("rx"));
        let wire_pulls = s
            .get("cluster.prefix_router_peers.upstream_rq_total")
            .max(1);
        let per_pull = (tx + rx).saturating_sub(received_entries) as f64 / wire_pulls as f64;
        // Pulls served per second at the defaults: per peer one index pull
        // every 100 ms and a queue-only pull every 25 ms between them
        // (`queue_ms`), 40 a second, each costing a head each way (an upper
        // bound: a queue pull has no batch); the test pulls every 50 ms.
        let pulls_per_s = pulls as f64 / elapsed.max(1.0) * (PULL_MS as f64 / 25.0);
        let fixed_at_1000 = 100.0 * pulls_per_s * per_pull / (1000.0 * own_bytes / routed);
        eprintln!(
            "gateways: gw{i}: routed {routed} ({own_bytes} request bytes), published {published} writes ({:.2}/request); served {pulls} pulls, {served} B, {entries} B of entries; pulls on the wire ({}): {wire_pulls}, sent {tx} B, received {rx} B, {per_pull:.0} B per pull besides entries; share of its request bytes: entries sent {sent:.2} % + received {received:.2} %, pulls at 1000 req/s (100 ms, queue pulls every 25) {fixed_at_1000:.2} % each way; snapshot served {} B; pull_ok {} pull_fail {} bad_batch {} lost {}; queue tables received {}, queue-only pulls {}",
            published / routed,
            if peers_h2() { "HTTP/2" } else { "HTTP/1.1" },
            s.get("prefix_router.peers.snapshot_bytes"),
            s.get("prefix_router.peers.pull_ok"),
            s.get("prefix_router.peers.pull_fail"),
            s.get("prefix_router.peers.bad_batch"),
            s.get("prefix_router.peers.writes_lost"),
            s.get("prefix_router.peers.queues_received"),
            s.get("prefix_router.peers.queue_pulls"),
        );
        // The peers' queued-prefill tables travel with the pulls (a table
        // is sent only while the serving gateway has tokens queued).
        assert!(
            s.get("prefix_router.peers.queues_received") > 0,
            "gw{i} received no queue table"
        );
        // Between index pulls the tables come by queue-only pulls
        // (`queue_ms`, default 25 ms < the test's 50 ms pull period).
        assert!(
            s.get("prefix_router.peers.queue_pulls") > 0,
            "gw{i} made no queue-only pull"
        );
        assert!(
            sent + fixed_at_1000 < 1.0,
            "gw{i}: sync traffic sent {sent:.2} % + {fixed_at_1000:.2} % of request bytes"
        );
    }
    assert!(
        d_stats.get("prefix_router.peers.snapshot_applied") > 0,
        "the cold gateway copied nothing"
    );
    assert!(
        cold >= others - 3.0,
        "cold gateway {cold:.1} % vs the others {others:.1} % over its first {:?}",
        out3.last().map(|o| o.at)
    );
}

/// A fake peer on loopback for `life`: `garbage` answers every request 200
/// with bytes that are not a valid batch (the batch magic, then junk);
/// otherwise it accepts, reads and never answers (a hung peer). Returns its
/// port and the number of requests it has read so far; the thread stops by
/// itself after `life` (bounded).
fn fake_peer(garbage: bool, life: Duration) -> (u16, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind fake peer");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let end = Instant::now() + life;
        let mut held = Vec::new();
        while Instant::now() < end {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).ok();
                    s.set_read_timeout(Some(Duration::from_millis(200))).ok();
                    let mut buf = [0u8; 4096];
                    if s.read(&mut buf).is_ok_and(|n| n > 0) {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    if garbage {
                        let mut body = prefix_router::peers::MAGIC.to_vec();
                        body.extend(
                            (0..200u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8),
                        );
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        let _ = s.write_all(head.as_bytes());
                        let _ = s.write_all(&body);
                    } else {
                        held.push(s); // never answered
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    (port, seen)
}

/// A peer that answers garbage, one that hangs and one that is down cost
/// nothing but staleness: every request is served, each kind is counted
/// (`bad_batch`, `pull_timeout`, `pull_refused`, and the pulls skipped while
/// backing off in `pull_backoff`), the garbage peer is pulled at most about
/// once a second per gateway once backed off (not every 100 ms), nothing of
/// theirs is merged; a real peer pulling at the shipped default period
/// (100 ms) still learns this gateway's writes; and hostile requests to the
/// sync path are refused.
#[test]
fn hostile_peers_cost_only_staleness() {
    let dir = workdir("gateways-hostile");
    let fleet = Fleet::start(&dir, 3, &ReplicaOpts::default());
    let life = Duration::from_secs(120);
    let ((bad, bad_seen), (hung, _)) = (fake_peer(true, life), fake_peer(false, life));
    let down = free_port(); // nothing listens: connection refused
    let ports: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
    let peer_ports = [bad, hung, down, ports[0].1, ports[1].1];
    // The shipped defaults: pull_ms 100, timeout_ms 250, hosts_refresh_ms 1000.
    let cfg = EnvoyConfig::new(&fleet.endpoints()).with(
        "peers",
        json!({"cluster": "prefix_router_peers", "admin_cluster": "envoy_admin",
               "secret": SECRET}),
    );
    let mut gws: Vec<Envoy> = (0..2)
        .map(|i| {
            // HTTP/1.1: the fake peers speak nothing else.
            let peers = (&peer_ports[..], false);
            spawn_gateway_h(&dir, &format!("gw{i}"), &cfg, ports[i], peers)
        })
        .collect();
    for g in &mut gws {
        g.wait_ready();
    }
    // Let the puller list the hosts and meet the fake peers.
    std::thread::sleep(Duration::from_millis(2500));
    let (window_start, garbage_before) = (Instant::now(), bad_seen.load(Ordering::SeqCst));
    let live: Live = Arc::new(Mutex::new(vec![(0, gws[0].url(""))]));
    let out = run(
        Mixed::new(11).take(60),
        &live,
        &Arc::new(AtomicUsize::new(0)),
    );
    let failed = out.iter().filter(|o| o.status != 200).count();
    assert_eq!(failed, 0, "{failed} requests failed with hostile peers");
    std::thread::sleep(Duration::from_millis(1500));
    let garbage_pulls = bad_seen.load(Ordering::SeqCst) - garbage_before;
    let window = window_start.elapsed().as_secs_f64();
    let a = gws[0].stats();
    let b = gws[1].stats();
    let stat =
        |s: &crate::harness::stats::Stats, k: &str| s.get(&format!("prefix_router.peers.{k}"));
    eprintln!(
        "gateways: hostile peers: garbage peer pulled {garbage_pulls} times in {window:.1} s by 2 gateways; gw0 pull_ok {} pull_fail {} refused {} timeout {} bad_batch {} backoff {} applied {} published {} hosts {}; gw1 pull_ok {} applied {}",
        stat(&a, "pull_ok"),
        stat(&a, "pull_fail"),
        stat(&a, "pull_refused"),
        stat(&a, "pull_timeout"),
        stat(&a, "bad_batch"),
        stat(&a, "pull_backoff"),
        stat(&a, "writes_applied"),
        stat(&a, "writes_published"),
        stat(&a, "hosts"),
        stat(&b, "pull_ok"),
        stat(&b, "writes_applied"),
    );
    assert!(
        stat(&a, "bad_batch") >= 1,
        "the garbage peer was not counted"
    );
    assert!(
        stat(&a, "pull_timeout") >= 1,
        "the hung peer was not counted"
    );
    assert!(
        stat(&a, "pull_refused") >= 1,
        "the down peer was not counted"
    );
    assert_eq!(
        stat(&a, "pull_fail"),
        stat(&a, "pull_refused") + stat(&a, "pull_timeout")
    );
    assert!(stat(&a, "pull_backoff") >= 1, "no pull was skipped");
    // Backed off: at most one pull a second per gateway once at the 1-s cap
    // (plus the doubling steps 200, 400, 800 ms), against 10 a second each
    // without back-off.
    let bound = 2.0 * (window + 4.0);
    assert!(
        (garbage_pulls as f64) <= bound,
        "the garbage peer was pulled {garbage_pulls} times in {window:.1} s (bound {bound:.0})"
    );
    assert_eq!(stat(&a, "hosts"), 5);
    // The real peer, pulling at the default period, learned gw0's writes.
    assert!(stat(&a, "writes_published") > 0);
    assert!(stat(&b, "pull_ok") > 0 && stat(&b, "writes_applied") > 0);
    // Hostile clients on the sync path: refused, counted, never forwarded.
    let port = ports[0].1;
    let auth = [("x-prefix-router-peer", SECRET)];
    let huge = format!("{PEERS_PATH}?since={}", "9".repeat(4000));
    assert_eq!(raw(port, "GET", &huge, &auth).0, 400);
    let same_len = "x".repeat(SECRET.len());
    let wrong = [("x-prefix-router-peer", same_len.as_str())];
    assert_eq!(
        raw(port, "GET", &format!("{PEERS_PATH}?since=0"), &wrong).0,
        403
    );
    assert_eq!(
        raw(port, "GET", &format!("{PEERS_PATH}?slots=x"), &auth).0,
        400
    );
    // The queue-only pull: the secret is required; the answer has no body.
    assert_eq!(
        raw(port, "GET", &format!("{PEERS_PATH}?queued"), &wrong).0,
        403
    );
    let (status, body) = raw(port, "GET", &format!("{PEERS_PATH}?queued"), &auth);
    assert_eq!((status, body.len()), (200, 0));
    assert_eq!(
        raw(port, "GET", &format!("{PEERS_PATH}?queued=1"), &auth).0,
        400
    );
    let a = gws[0].stats();
    assert!(stat(&a, "bad_request") >= 3 && stat(&a, "unauthorized") >= 2);
    for r in &fleet.replicas {
        assert!(r
            .requests()
            .iter()
            .all(|q| !q["path"].as_str().unwrap_or("").contains("prefix-router")));
    }
}
