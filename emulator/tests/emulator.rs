//! Integration tests: start the real `replica-emulator` binary on a loopback port and talk HTTP
//! to it (streaming, usage/cached_tokens, timing, metrics, debug log, fail modes, queueing).
//! Every child process is killed by a Drop guard, also when an assertion fails.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Method;
use replica_emulator::client::Client;
use replica_emulator::prom;
use serde_json::{json, Value};

mod support;
use support::Emu;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A chat request whose rendered prompt is exactly 4 * `tokens` characters (4 chars/token).
fn chat_body(tokens: usize, stream: bool, max_tokens: usize) -> Value {
    // "<|user|>\n" (9) + content + "\n<|assistant|>\n" (15) = 24 chars of template.
    let content = "x".repeat(tokens * 4 - 24);
    json!({
        "model": "emulated-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// SSE events of one streamed response with the time each arrived (ms after sending).
struct Streamed {
    status: u16,
    replica: Option<String>,
    /// The echoed `x-prefix-router-decision`, if any.
    decision: Option<String>,
    events: Vec<(f64, String)>,
}

async fn stream(c: &Client, path: &str, body: &Value, headers: &[(String, String)]) -> Streamed {
    let t0 = Instant::now();
    let (resp, conn) = c
        .send(Method::POST, path, headers, Bytes::from(body.to_string()))
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let replica = resp
        .headers()
        .get("x-replica-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let decision = resp
        .headers()
        .get("x-prefix-router-decision")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let mut body = resp.into_body();
    let mut buf = String::new();
    let mut events = Vec::new();
    while let Some(f) = body.frame().await {
        let f = f.expect("frame");
        if let Ok(d) = f.into_data() {
            buf.push_str(&String::from_utf8_lossy(&d));
            while let Some(i) = buf.find("\n\n") {
                let ev: String = buf.drain(..i + 2).collect();
                events.push((t0.elapsed().as_secs_f64() * 1e3, ev.trim().to_string()));
            }
        }
    }
    conn.done();
    Streamed {
        status,
        replica,
        decision,
        events,
    }
}

fn usage_of(events: &[(f64, String)]) -> Value {
    events
        .iter()
        .filter_map(|(_, e)| serde_json::from_str::<Value>(e.strip_prefix("data: ")?).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .expect("a usage chunk")
}

async fn metrics(c: &Client) -> std::collections::BTreeMap<String, f64> {
    let (s, text) = c.get_text("/metrics").await.expect("metrics");
    assert_eq!(s, 200);
    prom::sum_by_name(&prom::parse(&text))
}

#[test]
fn streams_tokens_one_by_one_with_usage_and_done() {
    let emu = Emu::start(&["--id", "r-stream", "--decode-ms-per-token", "40"]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let s = stream(&c, "/v1/chat/completions", &chat_body(64, true, 5), &[]).await;
        assert_eq!(s.status, 200);
        assert_eq!(s.replica.as_deref(), Some("r-stream"));
        let tokens: Vec<&(f64, String)> = s
            .events
            .iter()
            .filter(|(_, e)| e.contains("\"content\""))
            .collect();
        assert_eq!(tokens.len(), 5, "{:?}", s.events);
        // Each token is its own event, spaced by the decode time (not buffered until the end).
        let spread = tokens[4].0 - tokens[0].0;
        assert!(
            spread >= 150.0,
            "tokens arrived within {spread} ms: not streamed"
        );
        assert!(tokens[0].1.contains("\"role\":\"assistant\""));
        assert!(tokens[4].1.contains("\"finish_reason\":\"length\""));
        let last = &s.events[s.events.len() - 1].1;
        assert_eq!(last, "data: [DONE]");
        let u = usage_of(&s.events);
        assert_eq!(u["prompt_tokens"], 64);
        assert_eq!(u["completion_tokens"], 5);
        assert_eq!(u["total_tokens"], 69);

        // Without include_usage: no usage chunk, still [DONE].
        let mut b = chat_body(64, true, 2);
        b.as_object_mut().unwrap().remove("stream_options");
        let s = stream(&c, "/v1/chat/completions", &b, &[]).await;
        assert!(s.events.iter().all(|(_, e)| !e.contains("\"usage\"")));
        assert_eq!(s.events.last().unwrap().1, "data: [DONE]");

        // Completions API, streamed.
        let b = json!({"prompt": "y".repeat(400), "max_tokens": 3, "stream": true,
                       "stream_options": {"include_usage": true}});
        let s = stream(&c, "/v1/completions", &b, &[]).await;
        assert_eq!(s.status, 200);
        assert_eq!(
            s.events
                .iter()
                .filter(|(_, e)| e.contains("\"text\":\""))
                .count(),
            3
        );
        assert_eq!(usage_of(&s.events)["prompt_tokens"], 100);
    });
}

#[test]
fn repeated_prompt_is_served_from_cache_and_faster() {
    let emu = Emu::start(&[
        "--prefill-us-per-token",
        "1000",
        "--prefill-overhead-ms",
        "2",
        "--decode-ms-per-token",
        "1",
    ]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let before = metrics(&c).await;
        let body = chat_body(256, true, 2);
        let cold = stream(&c, "/v1/chat/completions", &body, &[]).await;
        let warm = stream(&c, "/v1/chat/completions", &body, &[]).await;
        let (uc, uw) = (usage_of(&cold.events), usage_of(&warm.events));
        assert_eq!(uc["prompt_tokens_details"]["cached_tokens"], 0);
        // floor((256 - 1) / 16) * 16: the last block is recomputed.
        assert_eq!(uw["prompt_tokens_details"]["cached_tokens"], 240);
        let ttft = |s: &Streamed| s.events[0].0;
        assert!(
            ttft(&cold) >= 250.0,
            "cold TTFT {} < 256 uncached tokens x 1 ms",
            ttft(&cold)
        );
        assert!(
            ttft(&warm) < ttft(&cold) / 3.0,
            "warm {} cold {}",
            ttft(&warm),
            ttft(&cold)
        );

        // A different prompt misses; the non-streaming API reports usage too.
        let mut other = chat_body(256, false, 2);
        other["messages"][0]["content"] = json!("z".repeat(1000));
        let (s, b) = c
            .call(Method::POST, "/v1/chat/completions", other.to_string())
            .await
            .unwrap();
        assert_eq!(s, 200);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(v["choices"][0]["message"]["content"], " The quick");

        let after = metrics(&c).await;
        let d =
            |k: &str| after.get(k).copied().unwrap_or(-1.0) - before.get(k).copied().unwrap_or(0.0);
        assert_eq!(d("vllm:prefix_cache_queries_total"), 768.0);
        assert_eq!(d("vllm:prefix_cache_hits_total"), 240.0);
        assert_eq!(d("vllm:prompt_tokens_total"), 768.0);
        assert_eq!(d("vllm:generation_tokens_total"), 6.0);
        assert_eq!(d("vllm:request_success_total"), 3.0);
        assert_eq!(d("vllm:time_to_first_token_seconds_count"), 3.0);

        // reset-cache empties the cache: the same prompt misses again.
        let (s, _) = c
            .call(Method::POST, "/admin/reset-cache", "")
            .await
            .unwrap();
        assert_eq!(s, 200);
        let again = stream(&c, "/v1/chat/completions", &body, &[]).await;
        assert_eq!(
            usage_of(&again.events)["prompt_tokens_details"]["cached_tokens"],
            0
        );
    });
}

#[test]
fn metrics_use_vllm_names_and_labels() {
    let emu = Emu::start(&[
        "--model",
        "m1",
        "--lora-adapters",
        "a,b",
        "--cache-blocks",
        "100",
    ]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let (_, text) = c.get_text("/metrics").await.unwrap();
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total",
            "vllm:request_success_total",
            "vllm:lora_requests_info",
            "vllm:cache_config_info",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:time_to_first_token_seconds_count",
        ] {
            assert!(text.lines().any(|l| l.starts_with(name)), "missing {name}");
        }
        let samples = prom::parse(&text);
        let get = |n: &str| samples.iter().find(|s| s.name == n).unwrap();
        assert_eq!(
            get("vllm:num_requests_running")
                .label("model_name")
                .as_deref(),
            Some("m1")
        );
        let lora = get("vllm:lora_requests_info");
        assert_eq!(lora.label("running_lora_adapters").as_deref(), Some("a,b"));
        let cc = get("vllm:cache_config_info");
        assert_eq!(cc.label("block_size").as_deref(), Some("16"));
        assert_eq!(cc.label("num_gpu_blocks").as_deref(), Some("100"));

        let (s, b) = c.get_text("/v1/models").await.unwrap();
        assert_eq!(s, 200);
        let v: Value = serde_json::from_str(&b).unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["id"].as_str())
            .collect();
        assert_eq!(ids, ["m1", "a", "b"]);
        let (s, b) = c.get_text("/health").await.unwrap();
        assert_eq!((s, b.as_str()), (200, "{\"status\":\"ok\"}"));
    });
}

#[test]
fn debug_log_shows_headers_and_timing() {
    let emu = Emu::start(&["--decode-ms-per-token", "0"]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let h = vec![("x-test-tag".to_string(), "abc123".to_string())];
        let s = stream(&c, "/v1/chat/completions", &chat_body(64, true, 2), &h).await;
        assert_eq!(s.status, 200);
        let (_, b) = c.get_text("/debug/requests").await.unwrap();
        let v: Value = serde_json::from_str(&b).unwrap();
        let reqs = v["requests"].as_array().unwrap();
        let r = reqs
            .iter()
            .find(|r| r["path"] == "/v1/chat/completions")
            .expect("logged");
        assert_eq!(r["headers"]["x-test-tag"], "abc123");
        assert_eq!(r["prompt_tokens"], 64);
        assert_eq!(r["cached_tokens"], 0);
        assert_eq!(r["outcome"], "ok");
        assert!(r["ttft_ms"].as_f64().unwrap() >= 0.0);
        assert!(r["queued_ms"].as_f64().is_some());
        // since= filters by sequence number.
        let seq = r["seq"].as_u64().unwrap();
        let (_, b) = c
            .get_text(&format!("/debug/requests?since={seq}"))
            .await
            .unwrap();
        let v: Value = serde_json::from_str(&b).unwrap();
        assert!(v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["seq"].as_u64() > Some(seq)));
    });
}

#[test]
fn the_routers_decision_header_is_echoed_on_the_response() {
    let emu = Emu::start(&["--decode-ms-per-token", "0"]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let h = vec![("x-prefix-router-decision".to_string(), "spill".to_string())];
        let s = stream(&c, "/v1/chat/completions", &chat_body(64, true, 2), &h).await;
        assert_eq!(s.status, 200);
        assert_eq!(s.decision.as_deref(), Some("spill"));
        assert!(s.replica.is_some());
        // Not sent: not invented.
        let s = stream(&c, "/v1/chat/completions", &chat_body(64, true, 2), &[]).await;
        assert_eq!((s.status, s.decision), (200, None));
        // Non-streamed and error responses echo it too.
        let (resp, _abandoned) = c
            .send(Method::GET, "/nope", &h, Bytes::new())
            .await
            .expect("send");
        assert_eq!(resp.status().as_u16(), 404);
        assert_eq!(
            resp.headers()
                .get("x-prefix-router-decision")
                .map(|v| v.as_bytes()),
            Some(&b"spill"[..])
        );
    });
}

#[test]
fn errors_are_json_like_vllm_and_big_bodies_are_read() {
    let emu = Emu::start(&["--decode-ms-per-token", "0", "--max-model-len", "1000"]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let (s, b) = c.get_text("/nope").await.unwrap();
        assert_eq!(s, 404);
        assert!(serde_json::from_str::<Value>(&b).unwrap()["error"]["message"].is_string());
        let (s, b) = c
            .call(Method::POST, "/v1/chat/completions", "{not json")
            .await
            .unwrap();
        assert_eq!(s, 400);
        assert_eq!(
            serde_json::from_slice::<Value>(&b).unwrap()["error"]["code"],
            400
        );
        let (s, _) = c
            .call(Method::POST, "/v1/chat/completions", r#"{"messages":[]}"#)
            .await
            .unwrap();
        assert_eq!(s, 400);
        let (s, _) = c
            .call(Method::GET, "/v1/chat/completions", "")
            .await
            .unwrap();
        assert_eq!(s, 405);
        // Over --max-model-len (prompt + max_tokens): 400.
        let (s, _) = c
            .call(
                Method::POST,
                "/v1/chat/completions",
                chat_body(990, false, 20).to_string(),
            )
            .await
            .unwrap();
        assert_eq!(s, 400);
        // A 65 MiB body is read completely (the prompt itself is small).
        let mut big = chat_body(64, false, 1);
        big["x_padding"] = json!("p".repeat(65 << 20));
        let (s, b) = c
            .call(Method::POST, "/v1/chat/completions", big.to_string())
            .await
            .unwrap();
        assert_eq!(
            s,
            200,
            "{}",
            String::from_utf8_lossy(&b[..b.len().min(300)])
        );
    });
}

#[test]
fn fail_modes_switch_at_runtime() {
    let mut emu = Emu::start(&["--fail", "503", "--decode-ms-per-token", "0"]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let body = chat_body(64, false, 1).to_string();
        assert_eq!(c.get_text("/health").await.unwrap().0, 503);
        assert_eq!(
            c.call(Method::POST, "/v1/chat/completions", body.clone())
                .await
                .unwrap()
                .0,
            503
        );

        let (s, _) = c
            .call(Method::POST, "/admin/fail?mode=none", "")
            .await
            .unwrap();
        assert_eq!(s, 200);
        assert_eq!(c.get_text("/health").await.unwrap().0, 200);
        assert_eq!(
            c.call(Method::POST, "/v1/chat/completions", body.clone())
                .await
                .unwrap()
                .0,
            200
        );
        assert_eq!(
            c.call(Method::POST, "/admin/fail?mode=bogus", "")
                .await
                .unwrap()
                .0,
            400
        );

        // hang: accepted, never answered; admin endpoints still work.
        c.call(Method::POST, "/admin/fail?mode=hang", "")
            .await
            .unwrap();
        let hung = tokio::time::timeout(
            Duration::from_millis(400),
            c.call(Method::POST, "/v1/chat/completions", body.clone()),
        )
        .await;
        assert!(hung.is_err(), "a hanging replica answered: {hung:?}");
        let (_, b) = c.get_text("/debug/requests").await.unwrap();
        assert!(b.contains("\"outcome\":\"hang\""));
        c.call(Method::POST, "/admin/fail?mode=none", "")
            .await
            .unwrap();
        assert_eq!(c.get_text("/health").await.unwrap().0, 200);

        // die: the next request kills the process without an answer.
        c.call(Method::POST, "/admin/fail?mode=die", "")
            .await
            .unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), c.get_text("/health")).await;
        assert!(
            matches!(r, Ok(Err(_))),
            "expected a dropped connection, got {r:?}"
        );
    });
    assert_eq!(emu.wait_exit(Duration::from_secs(5)), Some(1));
}

#[test]
fn max_running_queues_fifo_and_gauges_return_to_zero() {
    let emu = Emu::start(&[
        "--max-running",
        "1",
        "--prefill-overhead-ms",
        "200",
        "--prefill-us-per-token",
        "0",
        "--decode-ms-per-token",
        "5",
    ]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let body = chat_body(64, false, 1).to_string();
        let t0 = Instant::now();
        let probe = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            metrics(&c).await
        };
        let (a, b, m) = tokio::join!(
            c.call(Method::POST, "/v1/chat/completions", body.clone()),
            c.call(Method::POST, "/v1/chat/completions", body.clone()),
            probe
        );
        assert_eq!((a.unwrap().0, b.unwrap().0), (200, 200));
        assert!(
            t0.elapsed() >= Duration::from_millis(390),
            "ran in parallel: {:?}",
            t0.elapsed()
        );
        assert_eq!(m["vllm:num_requests_running"], 1.0);
        assert_eq!(m["vllm:num_requests_waiting"], 1.0);
        let (_, log) = c.get_text("/debug/requests").await.unwrap();
        let v: Value = serde_json::from_str(&log).unwrap();
        let mut queued: Vec<f64> = v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["path"] == "/v1/chat/completions")
            .map(|r| r["queued_ms"].as_f64().unwrap())
            .collect();
        queued.sort_by(f64::total_cmp);
        assert!(queued[0] < 50.0 && queued[1] >= 180.0, "{queued:?}");

        // A client that leaves mid-stream frees its slot.
        let slow = chat_body(64, true, 1000);
        let (resp, _conn) = c
            .send(
                Method::POST,
                "/v1/chat/completions",
                &[],
                Bytes::from(slow.to_string()),
            )
            .await
            .unwrap();
        let mut b = resp.into_body();
        let _ = b.frame().await; // first token
        drop(b);
        drop(_conn);
        let end = Instant::now() + Duration::from_secs(5);
        let c2 = Client::new(&emu.url()).unwrap();
        loop {
            let m = metrics(&c2).await;
            if m["vllm:num_requests_running"] == 0.0 && m["vllm:kv_cache_usage_perc"] == 0.0 {
                break;
            }
            assert!(Instant::now() < end, "slot or KV blocks leaked: {m:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// The prefix cache is looked up when the prefill starts (vLLM: at schedule time), not when the
/// running slot is taken: with one prefill lane, a request queued behind another with the same
/// prompt reuses what that one computed.
#[test]
fn cache_is_checked_when_the_prefill_is_scheduled() {
    let emu = Emu::start(&[
        "--prefill-lanes",
        "1",
        "--prefill-us-per-token",
        "300",
        "--decode-ms-per-token",
        "0",
    ]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let body = chat_body(512, true, 1);
        // Both take a running slot at once; the second waits for the lane (≈ 150 ms).
        let (a, b) = tokio::join!(
            stream(&c, "/v1/chat/completions", &body, &[]),
            stream(&c, "/v1/chat/completions", &body, &[])
        );
        let cached: Vec<u64> = [&a, &b]
            .iter()
            .map(|s| {
                assert_eq!(s.status, 200);
                usage_of(&s.events)["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0)
            })
            .collect();
        assert_eq!(cached.iter().filter(|&&x| x == 0).count(), 1, "{cached:?}");
        assert_eq!(
            cached.iter().filter(|&&x| x >= 496).count(),
            1,
            "{cached:?}"
        );
    });
}

/// The engine is the shared engine model: a small KV cache preempts (recompute) and every
/// request still completes with all its tokens; the step's token budget chunks a long prefill.
#[test]
fn kv_pressure_preempts_and_budget_chunks_the_prefill() {
    let emu = Emu::start(&[
        "--cache-blocks",
        "20",
        "--decode-ms-per-token",
        "1",
        "--prefill-overhead-ms",
        "0",
        "--prefill-us-per-token",
        "0",
        "--max-num-batched-tokens",
        "64",
    ]);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let before = metrics(&c).await;
        // Each grows to 96 + 120 tokens = 14 blocks: two cannot both fit in 20.
        let mut a = chat_body(96, false, 120);
        a["messages"][0]["content"] = json!("a".repeat(96 * 4 - 24));
        let mut b = a.clone();
        b["messages"][0]["content"] = json!("b".repeat(96 * 4 - 24));
        let (ra, rb) = tokio::join!(
            c.call(Method::POST, "/v1/chat/completions", a.to_string()),
            c.call(Method::POST, "/v1/chat/completions", b.to_string())
        );
        for r in [ra, rb] {
            let (s, body) = r.unwrap();
            assert_eq!(s, 200);
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["usage"]["completion_tokens"], 120);
        }
        let after = metrics(&c).await;
        let d =
            |k: &str| after.get(k).copied().unwrap_or(-1.0) - before.get(k).copied().unwrap_or(0.0);
        assert!(d("vllm:num_preemptions_total") >= 1.0, "{after:?}");
        assert_eq!(after["vllm:kv_cache_usage_perc"], 0.0);

        // 512 prompt tokens at 64 per step: at least 8 steps of 1 ms before the first token.
        let s = stream(&c, "/v1/chat/completions", &chat_body(512, true, 1), &[]).await;
        assert_eq!(s.status, 200);
        assert!(s.events[0].0 >= 8.0, "TTFT {} ms", s.events[0].0);
    });
}

/// TTFT (ms) of a short prompt sent 30 ms after a long one, on an emulator with `args`.
fn short_after_long_ttft(args: &[&str]) -> (f64, f64) {
    let emu = Emu::start(args);
    rt().block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let (long, short) = (chat_body(2000, true, 1), chat_body(16, true, 1));
        let later = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            stream(&c, "/v1/chat/completions", &short, &[]).await
        };
        let (l, s) = tokio::join!(stream(&c, "/v1/chat/completions", &long, &[]), later);
        assert_eq!((l.status, s.status), (200, 200));
        (l.events[0].0, s.events[0].0)
    })
}

#[test]
fn api_delay_lets_a_short_prompt_reach_the_engine_before_a_long_one() {
    // One prefill at a time, 100 µs per prompt token: the long prompt's prefill takes 200 ms.
    let base = [
        "--prefill-lanes",
        "1",
        "--prefill-us-per-token",
        "100",
        "--prefill-overhead-ms",
        "0",
        "--decode-ms-per-token",
        "5",
    ];
    // Without an API delay the engine admits in arrival order: the short prompt waits for
    // the long one's prefill.
    let (_, short) = short_after_long_ttft(&base);
    assert!(
        short >= 120.0,
        "short prompt not behind the long one: {short} ms"
    );
    // With 100 µs per token of API delay the long prompt reaches the engine after 200 ms,
    // the short one after 31.6 ms: it is prefilled first, and the delay counts in the TTFT.
    let mut args = base.to_vec();
    args.extend(["--api-delay-ms", "0", "--api-us-per-token", "100"]);
    let (long, short) = short_after_long_ttft(&args);
    assert!(short < 80.0, "short prompt waited: {short} ms");
    assert!(
        long >= 390.0,
        "long prompt: {long} ms < 200 ms delay + 200 ms prefill"
    );
}
