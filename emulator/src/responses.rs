//! `POST /v1/responses` (OpenAI Responses API), non-streaming, with vLLM's per-instance store.
//!
//! Prompt: `instructions` renders as a system message, `input` as a user message (a string) or
//! as messages (an array of `{role, content}` items, content a string or parts with `text`),
//! with the chat template of [`crate::prompt`]. With `previous_response_id` the prompt is that
//! response's conversation (its prompt and output tokens) followed by the new input, so a
//! follow-up on the same replica reuses the cached prefix. vLLM keeps stored responses in the
//! memory of the instance that produced them: an id this replica does not know answers 404
//! (`Response with id '…' not found.`), as vLLM does. `store` defaults to true; the store keeps
//! the last [`STORE_CAP`] responses.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use hyper::StatusCode;
use serde_json::{json, Value};

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

/// Serves one request: (status, body, outcome if generated).
pub async fn handle(
    emu: &Arc<Emulator>,
    seq: u64,
    body: &[u8],
    arrived: Instant,
) -> (StatusCode, Value, Option<Outcome>) {
    let err = |status: StatusCode, kind: &str, msg: String| {
        let e = json!({"error": {"message": msg, "type": kind, "param": null, "code": status.as_u16()}});
        (status, e, None)
    };
    let bad = |msg: String| err(StatusCode::BAD_REQUEST, "BadRequestError", msg);
    let v: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad("the request body must be a JSON object".into()),
        Err(e) => return bad(format!("invalid JSON: {e}")),
    };
    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        return bad("the emulator serves /v1/responses without streaming".into());
    }
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
        stream: false,
        include_usage: false,
        arrived,
    };
    let o = generate::run(emu.clone(), job.clone(), None).await;
    let id = format!("resp_{}_{seq}", emu.id);
    if store {
        let mut conv = job.tokens;
        conv.extend(tokenize(&o.text, cfg.chars_per_token));
        lock(&emu.responses).put(id.clone(), conv);
    }
    let body = json!({
        "id": id,
        "object": "response",
        "created_at": generate::unix_now(),
        "status": "completed",
        "model": model,
        "previous_response_id": v.get("previous_response_id").cloned().unwrap_or(Value::Null),
        "store": store,
        "output": [{
            "type": "message", "id": format!("msg_{}_{seq}", emu.id), "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": o.text, "annotations": []}],
        }],
        "usage": {
            "input_tokens": o.prompt_tokens,
            "input_tokens_details": {"cached_tokens": o.cached_tokens},
            "output_tokens": o.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": o.prompt_tokens + o.completion_tokens,
        },
    });
    (StatusCode::OK, body, Some(o))
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
