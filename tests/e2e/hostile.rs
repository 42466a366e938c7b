//! Hostile traffic (issue 8): a failed VM never lets a client pick its host, junk on
//! other paths never reaches the `affinity` index, tunnels are never paused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::workload::{chat, text};
use crate::harness::{workdir, write_file, Client, Envoy, EnvoyConfig, Fleet, World};

/// A minimal proxy-wasm module (ABI 0.2.1) whose `proxy_on_request_headers` traps
/// (`unreachable`): the VM fails on the first request, as a filter crash would.
/// Encoded by hand (no assembler needed): types, functions, memory, exports, code.
fn trapping_module() -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn section(id: u8, items: &[Vec<u8>], out: &mut Vec<u8>) {
        let mut body = Vec::new();
        leb(items.len(), &mut body);
        for i in items {
            body.extend_from_slice(i);
        }
        out.push(id);
        leb(body.len(), out);
        out.extend(body);
    }
    const I32: u8 = 0x7f;
    let func_type = |params: &[u8], results: &[u8]| {
        let mut t = vec![0x60, params.len() as u8];
        t.extend_from_slice(params);
        t.push(results.len() as u8);
        t.extend_from_slice(results);
        t
    };
    let export = |name: &str, kind: u8, index: u8| {
        let mut e = Vec::new();
        leb(name.len(), &mut e);
        e.extend_from_slice(name.as_bytes());
        e.extend_from_slice(&[kind, index]);
        e
    };
    let body = |code: &[u8]| {
        let mut b = Vec::new();
        leb(code.len() + 1, &mut b);
        b.push(0); // no locals
        b.extend_from_slice(code);
        b
    };
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    section(
        1,
        &[
            func_type(&[], &[]),                 // 0: abi version marker
            func_type(&[I32], &[I32]),           // 1: malloc
            func_type(&[I32, I32], &[]),         // 2: context create
            func_type(&[I32, I32], &[I32]),      // 3: vm start / configure
            func_type(&[I32, I32, I32], &[I32]), // 4: request headers
        ],
        &mut m,
    );
    section(
        3,
        &[vec![0], vec![1], vec![2], vec![3], vec![3], vec![4]],
        &mut m,
    );
    section(5, &[vec![0x00, 0x01]], &mut m); // one memory, min 1 page
    section(
        7,
        &[
            export("memory", 2, 0),
            export("proxy_abi_version_0_2_1", 0, 0),
            export("malloc", 0, 1),
            export("proxy_on_memory_allocate", 0, 1),
            export("proxy_on_context_create", 0, 2),
            export("proxy_on_vm_start", 0, 3),
            export("proxy_on_configure", 0, 4),
            export("proxy_on_request_headers", 0, 5),
        ],
        &mut m,
    );
    section(
        10,
        &[
            body(&[0x0b]),                   // nothing
            body(&[0x41, 0x80, 0x08, 0x0b]), // i32.const 1024
            body(&[0x0b]),                   // nothing
            body(&[0x41, 0x01, 0x0b]),       // i32.const 1 (true)
            body(&[0x41, 0x01, 0x0b]),       // i32.const 1 (true)
            body(&[0x00, 0x0b]),             // unreachable: trap
        ],
        &mut m,
    );
    m
}

/// Requests naming replica `victim` in the target header, `n` of them; returns how many
/// each replica served (by address) and the statuses Envoy answered.
fn spoof(envoy: &Envoy, fleet: &Fleet, victim: &str, n: usize) -> (usize, Vec<u16>) {
    let client = Client::new(Duration::from_secs(10));
    let body = chat(&text("spoof", 300), "hi");
    let mut on_victim = 0;
    let mut statuses = Vec::new();
    for _ in 0..n {
        let r = client
            .post(
                &envoy.url("/v1/chat/completions"),
                body.as_bytes(),
                &[
                    ("content-type", "application/json"),
                    ("x-gateway-destination-endpoint", victim),
                ],
            )
            .expect("request through Envoy");
        statuses.push(r.status);
        if r.replica().map(|id| fleet.by_id(id).addr()) == Some(victim.to_string()) {
            on_victim += 1;
        }
    }
    (on_victim, statuses)
}

/// With the VM failed (a module that traps on every request), a client-supplied
/// `x-gateway-destination-endpoint` never picks the host: with the shipped
/// `failure_policy: FAIL_CLOSED` every request is refused by Envoy and no replica sees
/// it; even fail-open, the native `header_mutation` in front of the Wasm filter strips
/// the header (requests spread over the replicas by the fallback policy). Control: with
/// fail-open and no native strip, every spoofed request lands on the victim, which is
/// the hole the two defences close.
#[test]
fn spoofed_header_never_picks_the_host_when_the_vm_fails() {
    let dir = workdir("vm-failed");
    let wasm = write_file(&dir, "trap.wasm", "");
    std::fs::write(&wasm, trapping_module()).expect("write module");
    let fleet = Fleet::start(&dir, 3, &Default::default());
    let eps = fleet.endpoints();
    let victim = eps[0].clone();
    let n = 30;
    let run = |name: &str, policy: &str, strip: bool| {
        let mut cfg = EnvoyConfig::new(&eps);
        cfg.wasm = Some(wasm.clone());
        cfg.failure_policy = policy.into();
        cfg.native_strip = strip;
        let envoy = Envoy::start(&dir, name, &cfg);
        let out = spoof(&envoy, &fleet, &victim, n);
        let log = envoy.log();
        (out, log)
    };

    let ((on_victim, statuses), log) = run("closed", "FAIL_CLOSED", true);
    assert_eq!(on_victim, 0, "statuses {statuses:?}");
    assert!(
        statuses.iter().all(|s| *s >= 500),
        "fail-closed answered {statuses:?}"
    );
    assert!(
        fleet.all_model_requests().is_empty(),
        "a replica was reached with the VM failed"
    );
    assert!(
        log.contains("proxy_on_request_headers"),
        "the VM did not fail as planned:\n{log}"
    );

    // Fail-open: the request that hits the trap fails (one per worker VM, 2 here),
    // later ones bypass the failed filter.
    let served = |statuses: &[u16]| statuses.iter().filter(|s| **s == 200).count();
    let ((on_victim, statuses), _) = run("open-stripped", "FAIL_OPEN", true);
    assert!(served(&statuses) >= n - 2, "{statuses:?}");
    assert!(
        on_victim < served(&statuses),
        "fail-open with the native strip: all {on_victim} served requests obeyed the spoofed header"
    );

    let ((on_victim, statuses), _) = run("open-bare", "FAIL_OPEN", false);
    assert!(served(&statuses) >= n - 2, "{statuses:?}");
    assert_eq!(
        on_victim,
        served(&statuses),
        "control: without either defence the spoofed header should pick the host"
    );
}

/// Index flooding: ~2000 random 64 KiB `text/plain` POSTs to a non-API path (answered
/// 404 by the replicas) do not touch the `affinity` index: ten chat prefixes routed
/// before the flood are all still known after it (branch `hit`, same replica), even
/// with the smallest index (1024 slots, which the flood would overwrite 60 times if it
/// were recorded).
#[test]
fn flooding_other_paths_leaves_the_index_alone() {
    let w = World::start("flood", &World::replicas(3), |c| {
        c.with("index_slots", json!(1024))
    });
    let bodies: Vec<String> = (0..10)
        .map(|i| chat(&text(&format!("tenant-{i}"), 2048), "question"))
        .collect();
    let mut first = Vec::new();
    for b in &bodies {
        let r = w.chat(b);
        assert_eq!(r.status, 200, "{}", r.body);
        first.push(w.served_by(&r));
    }
    let before = w.envoy.wait_idle();
    assert_eq!(
        before.branch("cold"),
        10,
        "{}",
        before.dump("prefix_router")
    );

    let total = 2000usize;
    let sent = AtomicUsize::new(0);
    let url = w.envoy.url("/upload");
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (sent, url) = (&sent, &url);
            s.spawn(move || {
                let client = Client::new(Duration::from_secs(30));
                let mut x =
                    0x9e37_79b9_7f4a_7c15u64 ^ (t << 32) ^ started.elapsed().as_nanos() as u64;
                let mut body = vec![0u8; 64 << 10];
                while sent.fetch_add(1, Ordering::Relaxed) < total {
                    for b in body.iter_mut() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        *b = b'a' + (x % 26) as u8;
                    }
                    let r = client
                        .post(url, &body, &[("content-type", "text/plain")])
                        .expect("flood request");
                    assert_eq!(r.status, 404, "{}", r.body);
                }
            });
        }
    });
    let flood = w.envoy.wait_idle();
    assert!(
        flood.source("raw") >= total as u64,
        "{}",
        flood.dump("prefix_router.source")
    );

    for (b, want) in bodies.iter().zip(&first) {
        let r = w.chat(b);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(&w.served_by(&r), want);
    }
    let after = w.envoy.wait_idle();
    assert_eq!(
        after.branch("hit") - flood.branch("hit"),
        10,
        "prefixes forgotten after the flood: {}",
        after.dump("prefix_router.branch")
    );
}

/// An `Upgrade: websocket` request is routed at once (no body to wait for: its stream is
/// a tunnel that never ends) and reaches a replica, which answers it; the filter never
/// pauses it until the idle timeout.
#[test]
fn upgrade_requests_are_not_paused() {
    let w = World::start("upgrade", &World::replicas(2), |mut c| {
        c.websocket = true;
        c
    });
    let mut s = TcpStream::connect(("127.0.0.1", w.envoy.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let started = Instant::now();
    s.write_all(
        b"GET /v1/realtime HTTP/1.1\r\nHost: llm\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .expect("send");
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(
        head.starts_with("HTTP/1.1 "),
        "no answer within 5 s (paused?): {head:?}"
    );
    assert!(
        head.contains("x-replica-id"),
        "not answered by a replica: {head}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let st = w.envoy.wait_idle();
    assert_eq!(st.source("none"), 1, "{}", st.dump("prefix_router"));
}

/// Clients that reset mid-body, before the filter routed (a small body cut short) and
/// after it routed (a body above `max_body_bytes`, routed on its first bytes, then cut):
/// nothing leaks (every in-flight gauge back to 0), and the next request is served.
#[test]
fn client_reset_mid_body_leaks_nothing() {
    let w = World::start("reset", &World::replicas(2), |c| c);
    let max = w.router().config().max_body_bytes;
    for (i, (declared, sent)) in [(200_000usize, 50_000usize), (4 << 20, max + (64 << 10))]
        .into_iter()
        .enumerate()
    {
        for _ in 0..5 {
            let mut s = TcpStream::connect(("127.0.0.1", w.envoy.port)).expect("connect");
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: llm\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n{{\"messages\":[{{\"role\":\"user\",\"content\":\""
            );
            s.write_all(head.as_bytes()).expect("headers");
            let chunk = vec![b'x'; 16 << 10];
            let mut n = head.len();
            while n < sent {
                if s.write_all(&chunk).is_err() {
                    break;
                }
                n += chunk.len();
            }
            std::thread::sleep(Duration::from_millis(100));
            drop(s); // reset mid-body
        }
        let st = w.envoy.wait_idle();
        let routed = st.branch_total();
        assert!(
            if i == 0 { routed == 0 } else { routed >= 1 },
            "case {i}: {routed} routed; {}",
            st.dump("prefix_router")
        );
    }
    let r = w.chat(&chat(&text("after-reset", 500), "q"));
    assert_eq!(r.status, 200, "{}", r.body);
    w.envoy.wait_idle();
}
