//! `POST /v1/responses` (OpenAI Responses API), JSON or streamed, with vLLM's per-instance store.
//!
//! Prompt: `instructions` renders as a system message, `input` as a user message (a string) or
//! as messages (an array of `{role, content}` items, content a string or parts with `text`),
//! with the chat template of [`crate::prompt`]. With `previous_response_id` the prompt is that
//! response's conversation (its prompt and output tokens) followed by the new input, so a
//! follow-up on the same replica reuses the cached prefix. vLLM keeps stored responses in the
//! memory of the instance that produced them: an id this replica does not know answers 404
//! (`Response with id '…' not found.`), as vLLM does. `store` defaults to true; the store keeps
//! the last [`STORE_CAP`] responses.
//!
//! `stream: true` answers `text/event-stream` with the Responses API's semantic events, each
//! `event: <type>\ndata: <json>\n\n` with a `type` and an increasing `sequence_number` and no
//! `[DONE]` sentinel (as OpenAI and vLLM do): `response.created` and `response.in_progress`
//! (the response object, `status: in_progress`, no usage) at once, `response.output_item.added`,
//! `response.content_part.added`, one `response.output_text.delta` per output token as it is
//! generated, then `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done` and `response.completed`, whose `response` is the same object as
//! the JSON answer (`id`, `usage.input_tokens_details.cached_tokens`). The response id is thus
//! at `response.id` (depth 2) in a stream but top-level in JSON. Generation is the chat path's
//! ([`generate::run`] with a sink): its chat-chunk events are read back for their delta text, so
//! the timing model stays in one place. A client that leaves stops the generation (the next
//! send fails); nothing is stored then.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::generate::{self, Job, Outcome};
use crate::lock;
use crate::prompt::{tokenize, Api};
use crate::server::Emulator;

/// Stored responses kept per replica (oldest dropped first).
pub const STORE_CAP: usize = 4096;

/// Stored responses: id → the conversation's tokens (prompt then output).
#[derive(Debug, Default)]
pub struct ResponseStore {
    map: HashMap<String, Vec<u64>>,
    order: VecDeque<String>,
}

impl ResponseStore {
    fn put(&mut self, id: String, tokens: Vec<u64>) {
        if self.order.len() >= STORE_CAP {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        self.order.push_back(id.clone());
        self.map.insert(id, tokens);
    }

    fn get(&self, id: &str) -> Option<Vec<u64>> {
        self.map.get(id).cloned()
    }
}

fn content_text(content: Option<&Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")),
        Some(_) => Err("'content' must be a string or an array".into()),
    }
}

/// The prompt text of a Responses request (see the module documentation).
pub fn render(body: &Value) -> Result<String, String> {
    let mut out = String::new();
    let mut push = |role: &str, text: &str| {
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        out.push_str(text);
        out.push('\n');
    };
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => push("system", s),
        Some(_) => return Err("'instructions' must be a string".into()),
    }
    match body.get("input").ok_or("'input' is required")? {
        Value::String(s) => push("user", s),
        Value::Array(items) if !items.is_empty() => {
            for (i, it) in items.iter().enumerate() {
                let role = it.get("role").and_then(Value::as_str).unwrap_or("user");
                let text =
                    content_text(it.get("content")).map_err(|e| format!("input[{i}]: {e}"))?;
                push(role, &text);
            }
        }
        _ => return Err("'input' must be a string or a non-empty array".into()),
    }
    out.push_str("<|assistant|>\n");
    Ok(out)
}

/// What [`handle`] answers.
pub enum Reply {
    /// A JSON body: status, body, outcome if generated.
    Json(StatusCode, Value, Option<Outcome>),
    /// `200 text/event-stream`: the events, and the outcome once the generation has ended.
    Stream(mpsc::Receiver<Bytes>, oneshot::Receiver<Outcome>),
}

/// What the response object says besides the generation: ids and echoed request fields.
#[derive(Debug, Clone)]
struct Meta {
    id: String,
    msg_id: String,
    model: String,
    previous: Value,
    store: bool,
    created_at: u64,
}

impl Meta {
    /// The response object; `o` = None while in progress (no output, no usage).
    fn response(&self, o: Option<&Outcome>) -> Value {
        let (status, output, usage) = match o {
            None => ("in_progress", json!([]), Value::Null),
            Some(o) => (
                "completed",
                json!([self.message("completed", &o.text)]),
                json!({
                    "input_tokens": o.prompt_tokens,
                    "input_tokens_details": {"cached_tokens": o.cached_tokens},
                    "output_tokens": o.completion_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": o.prompt_tokens + o.completion_tokens,
                }),
            ),
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "previous_response_id": self.previous,
            "store": self.store,
            "output": output,
            "usage": usage,
        })
    }

    fn message(&self, status: &str, text: &str) -> Value {
        let content = if status == "completed" {
            json!([Self::part(text)])
        } else {
            json!([])
        };
        json!({"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
               "content": content})
    }

    fn part(text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }
}

/// Numbers the events of one stream.
struct Events {
    next: u64,
}

impl Events {
    /// One SSE event: `fields` (an object) plus `type` and `sequence_number`.
    fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.next);
        self.next += 1;
        Bytes::from(format!("event: {kind}\ndata: {fields}\n\n"))
    }
}

/// The delta text of one chat-completion SSE chunk of [`generate::run`] (None for others).
fn chat_delta(chunk: &[u8]) -> Option<String> {
    let data = std::str::from_utf8(chunk)
        .ok()?
        .trim()
        .strip_prefix("data: ")?;
    let v: Value = serde_json::from_str(data).ok()?;
    v.pointer("/choices/0/delta/content")?
        .as_str()
        .map(str::to_string)
}

/// Runs a streamed response: events to `tx` as they happen; returns the outcome.
async fn stream(emu: Arc<Emulator>, job: Job, meta: Meta, tx: mpsc::Sender<Bytes>) -> Outcome {
    let mut ev = Events { next: 0 };
    let item = |ev: &mut Events, kind: &str, status: &str, text: &str| {
        ev.event(
            kind,
            json!({"output_index": 0, "item": meta.message(status, text)}),
        )
    };
    let part = |ev: &mut Events, kind: &str, text: &str| {
        ev.event(
            kind,
            json!({"item_id": meta.msg_id, "output_index": 0, "content_index": 0,
                   "part": Meta::part(text)}),
        )
    };
    let head = [
        ev.event("response.created", json!({"response": meta.response(None)})),
        ev.event(
            "response.in_progress",
            json!({"response": meta.response(None)}),
        ),
        item(&mut ev, "response.output_item.added", "in_progress", ""),
        part(&mut ev, "response.content_part.added", ""),
    ];
    for e in head {
        // A client already gone: the generation still runs and stops at its first token.
        let _ = tx.send(e).await;
    }
    let (chat_tx, mut chat_rx) = mpsc::channel::<Bytes>(64);
    let msg_id = meta.msg_id.clone();
    let forward = async move {
        while let Some(chunk) = chat_rx.recv().await {
            let Some(delta) = chat_delta(&chunk) else {
                continue;
            };
            let e = ev.event(
                "response.output_text.delta",
                json!({"item_id": msg_id, "output_index": 0, "content_index": 0,
                       "delta": delta, "logprobs": []}),
            );
            if tx.send(e).await.is_err() {
                break; // dropping chat_rx stops the generation
            }
        }
        (ev, tx)
    };
    let generation = tokio::spawn(generate::run(emu.clone(), job.clone(), Some(chat_tx)));
    let (mut ev, tx) = forward.await;
    let o = generation.await.unwrap_or_else(|_| Outcome {
        aborted: true,
        ..Outcome::default()
    });
    if o.aborted {
        return o;
    }
    store_conversation(&emu, &meta, job.tokens, &o);
    let tail = [
        ev.event(
            "response.output_text.done",
            json!({"item_id": meta.msg_id, "output_index": 0, "content_index": 0,
                   "text": o.text, "logprobs": []}),
        ),
        part(&mut ev, "response.content_part.done", &o.text),
        item(&mut ev, "response.output_item.done", "completed", &o.text),
        ev.event(
            "response.completed",
            json!({"response": meta.response(Some(&o))}),
        ),
    ];
    for e in tail {
        if tx.send(e).await.is_err() {
            break;
        }
    }
    o
}

/// With `store`, keeps the conversation (prompt then output tokens) under the response id.
fn store_conversation(emu: &Emulator, meta: &Meta, mut conv: Vec<u64>, o: &Outcome) {
    if meta.store {
        conv.extend(tokenize(&o.text, emu.cfg.chars_per_token));
        lock(&emu.responses).put(meta.id.clone(), conv);
    }
}

/// Serves one request (see the module documentation).
pub async fn handle(emu: &Arc<Emulator>, seq: u64, body: &[u8], arrived: Instant) -> Reply {
    let err = |status: StatusCode, kind: &str, msg: String| {
        let e = json!({"error": {"message": msg, "type": kind, "param": null, "code": status.as_u16()}});
        Reply::Json(status, e, None)
    };
    let bad = |msg: String| err(StatusCode::BAD_REQUEST, "BadRequestError", msg);
    let v: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad("the request body must be a JSON object".into()),
        Err(e) => return bad(format!("invalid JSON: {e}")),
    };
    let stream_on = match v.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return bad("'stream' must be a boolean".into()),
    };
    let cfg = &emu.cfg;
    let mut tokens = match v.get("previous_response_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(id)) => match lock(&emu.responses).get(id) {
            Some(t) => t,
            None => {
                return err(
                    StatusCode::NOT_FOUND,
                    "NotFoundError",
                    format!("Response with id '{id}' not found."),
                )
            }
        },
        Some(_) => return bad("'previous_response_id' must be a string".into()),
    };
    match render(&v) {
        Ok(text) => tokens.extend(tokenize(&text, cfg.chars_per_token)),
        Err(e) => return bad(e),
    }
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&cfg.model)
        .to_string();
    let max_tokens = v
        .get("max_output_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(16)
        .max(1) as usize;
    let store = v.get("store").and_then(Value::as_bool).unwrap_or(true);
    let job = Job {
        api: Api::Chat,
        seq,
        model: model.clone(),
        lora: None,
        cache_salt: v
            .get("cache_salt")
            .and_then(Value::as_str)
            .map(str::to_string),
        tokens,
        max_tokens,
        stream: stream_on,
        include_usage: false,
        arrived,
    };
    let meta = Meta {
        id: format!("resp_{}_{seq}", emu.id),
        msg_id: format!("msg_{}_{seq}", emu.id),
        model,
        previous: v
            .get("previous_response_id")
            .cloned()
            .unwrap_or(Value::Null),
        store,
        created_at: generate::unix_now(),
    };
    if stream_on {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let (done_tx, done_rx) = oneshot::channel();
        let emu = emu.clone();
        tokio::spawn(async move {
            let _ = done_tx.send(stream(emu, job, meta, tx).await);
        });
        return Reply::Stream(rx, done_rx);
    }
    let o = generate::run(emu.clone(), job.clone(), None).await;
    store_conversation(emu, &meta, job.tokens, &o);
    Reply::Json(StatusCode::OK, meta.response(Some(&o)), Some(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_forms() {
        let a = render(&json!({"instructions": "Be brief.", "input": "Hi"})).unwrap();
        assert_eq!(a, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
        let b = render(&json!({"instructions": "Be brief.", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        ]}))
        .unwrap();
        assert_eq!(a, b);
        assert!(render(&json!({})).is_err());
        assert!(render(&json!({"input": []})).is_err());
        assert!(render(&json!({"input": "x", "instructions": 3})).is_err());
    }

    #[test]
    fn store_is_bounded() {
        let mut s = ResponseStore::default();
        for i in 0..STORE_CAP + 3 {
            s.put(format!("r{i}"), vec![i as u64]);
        }
        assert!(s.get("r0").is_none() && s.get("r2").is_none());
        assert_eq!(s.get("r3"), Some(vec![3]));
        assert_eq!(s.map.len(), STORE_CAP);
    }
}
