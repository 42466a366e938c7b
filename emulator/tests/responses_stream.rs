//! Integration test: streamed `POST /v1/responses` (`stream: true`) from the real binary —
//! the Responses API's semantic SSE events in order, one text delta per token as it is
//! generated, and a `response.completed` whose response id continues the conversation.

use std::time::Instant;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Method;
use replica_emulator::client::Client;
use serde_json::{json, Value};

mod support;
use support::Emu;

/// (ms after sending, `event:` name, parsed `data:`) of every event of one streamed response.
async fn events(c: &Client, body: &Value) -> (u16, Option<String>, Vec<(f64, String, Value)>) {
    let t0 = Instant::now();
    let (resp, conn) = c
        .send(
            Method::POST,
            "/v1/responses",
            &[],
            Bytes::from(body.to_string()),
        )
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let mut body = resp.into_body();
    let (mut buf, mut out) = (String::new(), Vec::new());
    while let Some(f) = body.frame().await {
        if let Ok(d) = f.expect("frame").into_data() {
            buf.push_str(&String::from_utf8_lossy(&d));
            while let Some(i) = buf.find("\n\n") {
                let ev: String = buf.drain(..i + 2).collect();
                let (name, data) = ev.trim().split_once('\n').expect("event: and data: lines");
                let name = name
                    .strip_prefix("event: ")
                    .expect("event line")
                    .to_string();
                let data = data.strip_prefix("data: ").expect("data line");
                let v: Value = serde_json::from_str(data).expect("JSON data");
                out.push((t0.elapsed().as_secs_f64() * 1e3, name, v));
            }
        }
    }
    conn.done();
    assert!(buf.trim().is_empty(), "trailing bytes: {buf:?}");
    (status, ctype, out)
}

#[test]
fn streamed_responses_follow_the_openai_event_sequence() {
    let emu = Emu::start(&["--id", "r-resp", "--decode-ms-per-token", "30"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = Client::new(&emu.url()).unwrap();
        let first = json!({"model": "m", "instructions": "i".repeat(2000), "input": "hello",
                           "max_output_tokens": 4, "stream": true});
        let (status, ctype, ev) = events(&c, &first).await;
        assert_eq!(status, 200);
        assert!(ctype.unwrap_or_default().starts_with("text/event-stream"));
        let names: Vec<&str> = ev.iter().map(|(_, n, _)| n.as_str()).collect();
        let mut want = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        want.extend(["response.output_text.delta"; 4]);
        want.extend([
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]);
        assert_eq!(names, want);
        for (i, (_, name, v)) in ev.iter().enumerate() {
            assert_eq!(v["type"], json!(name), "{v}");
            assert_eq!(v["sequence_number"], json!(i), "{v}");
        }
        // Deltas leave as tokens are generated (30 ms apart), not at the end.
        let deltas: Vec<&(f64, String, Value)> = ev
            .iter()
            .filter(|(_, n, _)| n == "response.output_text.delta")
            .collect();
        assert!(
            deltas[3].0 - deltas[0].0 >= 60.0,
            "deltas not streamed: {ev:?}"
        );
        let text: String = deltas
            .iter()
            .map(|(_, _, v)| v["delta"].as_str().unwrap())
            .collect();
        let created = &ev[0].2["response"];
        let done = &ev[ev.len() - 1].2["response"];
        assert_eq!(created["status"], "in_progress");
        assert!(created["usage"].is_null());
        assert_eq!(done["status"], "completed");
        assert_eq!(done["id"], created["id"]);
        assert_eq!(done["output"][0]["content"][0]["text"], json!(text));
        assert_eq!(
            ev[8].2["text"],
            json!(text),
            "output_text.done carries the whole text"
        );
        let u = &done["usage"];
        assert_eq!(u["output_tokens"], 4);
        assert_eq!(u["input_tokens_details"]["cached_tokens"], 0, "cold cache");
        let prompt = u["input_tokens"].as_u64().unwrap();

        // The stored conversation continues, streamed: its prefix comes from the cache.
        let id = done["id"].as_str().unwrap().to_string();
        let next = json!({"model": "m", "input": "and then?", "previous_response_id": id,
                          "max_output_tokens": 2, "stream": true});
        let (status, _, ev) = events(&c, &next).await;
        assert_eq!(status, 200);
        let done = &ev.last().expect("events").2;
        assert_eq!(done["type"], "response.completed");
        assert_eq!(done["response"]["previous_response_id"], json!(id));
        let cached = done["response"]["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached + 16 >= prompt && cached <= prompt + 4,
            "cached {cached} of a {prompt}-token first prompt"
        );

        // Bad `stream` values are refused like other fields.
        let bad = json!({"input": "x", "stream": "yes"}).to_string();
        let (s, _) = c
            .call(Method::POST, "/v1/responses", bad)
            .await
            .expect("call");
        assert_eq!(s, 400);
    });
}
