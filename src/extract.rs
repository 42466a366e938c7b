//! Prefix extraction from a request body.
//!
//! What is hashed:
//! - **Chat completions** (`messages`): the text of each message's `content`,
//!   whether a string or an array of parts (`{"type":"text","text":…}`); the
//!   parts of one message are concatenated, so `"content":"ab"` and
//!   `"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]` give
//!   the same text. A separator marker ends each message. Roles, names and tool
//!   calls are not part of the key. Non-text parts (`image_url`, `input_audio`,
//!   `file`, …) contribute their raw JSON as an uncounted marker.
//! - **Completions** (`prompt`): the string, or each element of an array of
//!   strings or token ids.
//! - **Responses** (`instructions`, then `input`): `input` as a string or an
//!   array of items whose `content` / `text` / `output` are walked as above.
//! - **Raw**: a body that is not a JSON object (first non-blank byte not `{`),
//!   or a JSON object with none of the fields above: its first bytes.
//!
//! Characters are counted for JSON APIs (Unicode scalar values of the text),
//! bytes for raw bodies. The key never depends on JSON whitespace or on the
//! order of object fields. `model` and `cache_salt` are returned for the seed,
//! `prompt_cache_key` as a routing id candidate.
//!
//! Cost: one linear scan of the body by [`crate::json::Scanner`] (structure
//! checked, nothing copied), then the chosen fields' text streamed into the
//! [`PrefixHasher`] with escapes decoded on the fly, stopping once
//! `prefix_length` characters are hashed. No copy of the body.

use crate::hash::{PrefixHasher, PrefixHashes};
use crate::json::{unescape, walk_text, Scanner, ELEMENT_END};
use std::borrow::Cow;

/// Which API shape the prefix came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// OpenAI chat completions (`messages`).
    Chat,
    /// OpenAI completions (`prompt`).
    Completions,
    /// OpenAI Responses (`instructions` + `input`).
    Responses,
    /// Raw body bytes.
    Raw,
}

impl BodyKind {
    /// Stat / log label.
    pub const fn as_str(self) -> &'static str {
        match self {
            BodyKind::Chat => "chat",
            BodyKind::Completions => "completions",
            BodyKind::Responses => "responses",
            BodyKind::Raw => "raw",
        }
    }
}

/// The extracted prefix of one body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted<'a> {
    /// API shape.
    pub kind: BodyKind,
    /// Chained block hashes of the prefix (unseeded).
    pub prefix: PrefixHashes,
    /// The `model` field, if any (seed).
    pub model: Option<Cow<'a, str>>,
    /// The `cache_salt` field (vLLM tenant isolation), if any (seed).
    pub cache_salt: Option<Cow<'a, str>>,
    /// The `prompt_cache_key` field (OpenAI routing id), if any.
    pub prompt_cache_key: Option<Cow<'a, str>>,
}

/// The body looked like JSON (`{` first) but is not a well-formed object, or
/// a scoping field (`model`, `cache_salt`, `prompt_cache_key`) is not a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

const FIELD_END: &[u8] = b"\x1d";

/// Hash the raw first bytes of `body` (raw APIs and oversize bodies).
pub fn raw_prefix(body: &[u8], limit: usize, block_units: usize) -> PrefixHashes {
    let mut h = PrefixHasher::new(limit, block_units);
    h.push_bytes(&body[..body.len().min(limit)]);
    h.finish()
}

/// A scoping field's value: a JSON string, borrowed when it has no escapes.
fn string_field<'a>(name: &str, raw: Option<&'a [u8]>) -> Result<Option<Cow<'a, str>>, Malformed> {
    let Some(raw) = raw else { return Ok(None) };
    let inner = raw
        .strip_prefix(b"\"")
        .and_then(|r| r.strip_suffix(b"\""))
        .ok_or_else(|| Malformed(format!("`{name}` must be a string")))?;
    Ok(Some(match std::str::from_utf8(inner) {
        Ok(s) if !inner.contains(&b'\\') => Cow::Borrowed(s),
        _ => Cow::Owned(unescape(inner)),
    }))
}

/// Extract and hash the prefix of a complete body.
///
/// # Errors
/// [`Malformed`] when the body starts with `{` but is not a well-formed JSON
/// object, or a scoping field is not a string.
pub fn extract(body: &[u8], limit: usize, block_units: usize) -> Result<Extracted<'_>, Malformed> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Ok(Extracted {
            kind: BodyKind::Raw,
            prefix: raw_prefix(body, limit, block_units),
            model: None,
            cache_salt: None,
            prompt_cache_key: None,
        });
    }
    let mut fields: [Option<&[u8]>; 7] = [None; 7];
    const NAMES: [&[u8]; 7] = [
        b"model",
        b"cache_salt",
        b"prompt_cache_key",
        b"messages",
        b"prompt",
        b"instructions",
        b"input",
    ];
    // Chat `messages` (the common case) is hashed during the validating scan
    // itself: one pass over the body. Other fields are walked afterwards.
    let mut h = PrefixHasher::new(limit, block_units);
    let chat = Scanner::new(body)
        .object_members_walking(Some((b"messages", &mut h)), |k, v| {
            if let Some(i) = NAMES.iter().position(|n| *n == k) {
                if fields[i].is_none() {
                    fields[i] = Some(v);
                }
            }
        })
        .map_err(|e| Malformed(e.to_string()))?;
    let [model, salt, cache_key, messages, prompt, instructions, input] = fields;
    let model = string_field("model", model)?;
    let cache_salt = string_field("cache_salt", salt)?;
    let prompt_cache_key = string_field("prompt_cache_key", cache_key)?;

    // Shapes the APIs allow: anything else is a malformed request.
    let shape = |name: &str, raw: Option<&[u8]>, allowed: &[u8]| -> Result<(), Malformed> {
        match raw.and_then(|r| r.first()) {
            Some(c) if !allowed.contains(c) => {
                Err(Malformed(format!("`{name}` has an impossible type")))
            }
            _ => Ok(()),
        }
    };
    shape("messages", messages, b"[")?;
    shape("prompt", prompt, b"\"[")?;
    shape("instructions", instructions, b"\"n")?;
    shape("input", input, b"\"[")?;

    let kind = if chat && messages.is_some() {
        BodyKind::Chat
    } else if instructions.is_some() || input.is_some() {
        if let Some(i) = instructions {
            walk_text(i, &mut h, ELEMENT_END);
        }
        h.push_marker(FIELD_END);
        if let Some(i) = input {
            walk_text(i, &mut h, ELEMENT_END);
        }
        BodyKind::Responses
    } else if let Some(p) = prompt {
        walk_text(p, &mut h, ELEMENT_END);
        BodyKind::Completions
    } else {
        return Ok(Extracted {
            kind: BodyKind::Raw,
            prefix: raw_prefix(body, limit, block_units),
            model,
            cache_salt,
            prompt_cache_key,
        });
    };
    Ok(Extracted {
        kind,
        prefix: h.finish(),
        model,
        cache_salt,
        prompt_cache_key,
    })
}

/// The Responses API's `previous_response_id` (a top-level string; the last
/// one if repeated, as Python's `json` keeps it), if any. A second scan of the
/// body, done only for Responses API bodies (`BodyKind::Responses`).
pub fn previous_response_id(body: &[u8]) -> Option<String> {
    let mut found = None;
    Scanner::new(body)
        .object_members(|k, v| {
            if k == b"previous_response_id" {
                found = Some(v);
            }
        })
        .ok()?;
    string_field("previous_response_id", found)
        .ok()
        .flatten()
        .map(Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn key(body: &str) -> (BodyKind, Option<u64>, usize) {
        let e = extract(body.as_bytes(), 2048, 256).unwrap();
        (e.kind, e.prefix.last(), e.prefix.units)
    }

    #[test]
    fn whitespace_and_field_order_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi"}]}"#;
        let b = "{ \"messages\" : [ { \"content\" : \"You are helpful.\" ,\n \"role\":\"system\"},\n\t{\"content\":\"Hi\",\"role\":\"user\"} ],\n \"model\" : \"m\" }";
        assert_eq!(key(a), key(b));
        assert_eq!(key(a).0, BodyKind::Chat);
        assert_eq!(key(a).2, "You are helpful.Hi".chars().count());
    }

    #[test]
    fn content_string_equals_text_parts() {
        let s = r#"{"messages":[{"role":"user","content":"hello world"}]}"#;
        let p = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello "},{"type":"text","text":"world"}]}]}"#;
        let one =
            r#"{"messages":[{"role":"user","content":[{"text":"hello world","type":"text"}]}]}"#;
        assert_eq!(key(s), key(p));
        assert_eq!(key(s), key(one));
    }

    #[test]
    fn message_boundaries_matter() {
        let a = r#"{"messages":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}"#;
        let b = r#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}"#;
        assert_ne!(key(a).1, key(b).1);
    }

    #[test]
    fn escapes_are_text() {
        let a = r#"{"messages":[{"role":"user","content":"line\nnext \u00e9"}]}"#;
        let b = "{\"messages\":[{\"role\":\"user\",\"content\":\"line\\nnext é\"}]}";
        assert_eq!(key(a), key(b));
        assert_eq!(key(a).2, 11);
    }

    #[test]
    fn images_change_the_key_but_not_the_count() {
        let a = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"A"}},{"type":"text","text":"x"}]}]}"#;
        let b = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"B"}},{"type":"text","text":"x"}]}]}"#;
        assert_ne!(key(a).1, key(b).1);
        assert_eq!(key(a).2, 1);
    }

    #[test]
    fn completions_and_responses() {
        let c = r#"{"model":"m","prompt":"Once upon a time"}"#;
        assert_eq!(key(c).0, BodyKind::Completions);
        assert_eq!(key(c).2, 16);
        let batch = r#"{"prompt":["a","b"]}"#;
        assert_eq!(key(batch).2, 2);
        let tokens = r#"{"prompt":[1,22,333]}"#;
        assert_eq!(key(tokens).2, 6);
        let r1 = r#"{"instructions":"Be brief.","input":"What is Rust?"}"#;
        let r2 = r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"What is Rust?"}]}],"instructions":"Be brief."}"#;
        assert_eq!(key(r1).0, BodyKind::Responses);
        assert_eq!(key(r1).2, key(r2).2);
        assert_eq!(key(r1).2, 22);
    }

    #[test]
    fn raw_bodies() {
        let (kind, k, units) = key("plain text body");
        assert_eq!(kind, BodyKind::Raw);
        assert!(k.is_some());
        assert_eq!(units, 15);
        // JSON object without a known field: raw bytes.
        assert_eq!(key(r#"{"inputs":"hello"}"#).0, BodyKind::Raw);
        assert_eq!(key("").1, None);
    }

    #[test]
    fn malformed_json_is_reported() {
        for bad in [
            r#"{"messages":[{"content":"x"}"#,
            "{not json",
            r#"{"messages":"#,
            r#"{"model":1}"#,
            r#"{"model":"m","messages":5}"#,
            r#"{"messages":[{"content":"\q"}]}"#,
            r#"{"prompt":{"a":1}}"#,
            r#"{"input":7}"#,
            r#"{"messages":[{"content":"x"} {"content":"y"}]}"#,
            r#"{"messages":[1,]}"#,
            r#"{"messages":[{"content":"x",}]}"#,
            r#"{"messages":[{"content" "x"}]}"#,
        ] {
            assert!(extract(bad.as_bytes(), 2048, 256).is_err(), "{bad}");
        }
        // Faults after the hashed budget are still found (one pass validates all).
        let long = "y".repeat(3000);
        for bad in [
            format!(r#"{{"messages":[{{"content":"{long}\q"}}]}}"#),
            format!(r#"{{"messages":[{{"content":"{long}"}},{{"content":"z"]}}"#),
            format!(r#"{{"messages":[{{"content":"{long}"}}],"model":}}"#),
            format!("{{\"messages\":[{{\"content\":\"{long}\"}},{{\"content\":\"tab\tx\"}}]}}"),
        ] {
            assert!(
                extract(bad.as_bytes(), 2048, 256).is_err(),
                "{}",
                &bad[3000..]
            );
        }
    }

    #[test]
    fn scoping_fields() {
        let e = extract(
            br#"{"model":"llama","cache_salt":"t1","prompt_cache_key":"k","prompt":"x"}"#,
            2048,
            256,
        )
        .unwrap();
        assert_eq!(e.model.as_deref(), Some("llama"));
        assert_eq!(e.cache_salt.as_deref(), Some("t1"));
        assert_eq!(e.prompt_cache_key.as_deref(), Some("k"));
    }

    #[test]
    fn prefix_is_bounded_in_characters() {
        let long = "é".repeat(5000);
        let a = format!(r#"{{"messages":[{{"role":"user","content":"{long}A"}}]}}"#);
        let b = format!(r#"{{"messages":[{{"role":"user","content":"{long}B"}}]}}"#);
        assert_eq!(key(&a), key(&b));
        assert_eq!(key(&a).2, 2048);
    }

    #[test]
    fn previous_response_id_is_read() {
        let b = br#"{"model":"m","input":"hi","previous_response_id":"resp_1","x":{"previous_response_id":"inner"}}"#;
        assert_eq!(previous_response_id(b).as_deref(), Some("resp_1"));
        let dup = br#"{"previous_response_id":"a","previous_response_id":"b"}"#;
        assert_eq!(previous_response_id(dup).as_deref(), Some("b"));
        assert_eq!(
            previous_response_id(br#"{"previous_response_id":null}"#),
            None
        );
        assert_eq!(previous_response_id(br#"{"input":"x"}"#), None);
        assert_eq!(previous_response_id(b"not json"), None);
    }
}
