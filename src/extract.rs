//! Prefix extraction from a request body.
//!
//! What is hashed:
//! - **Chat completions** (`messages`): the text of each message's `content`,
//!   whether a string or an array of parts (`{"type":"text","text":…}`); the
//!   parts of one message are concatenated, so `"content":"ab"` and
//!   `"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]` give
//!   the same text. A separator marker ends each message, and so does its last
//!   hash block: each message is cut into blocks of its own (the last one
//!   partial), so the key of turn `k` of a conversation is an exact prefix of
//!   turn `k + 1`'s ([`PrefixHasher::end_element`]). Roles, names and tool
//!   calls are not part of the key. Non-text parts (`image_url`, `input_audio`,
//!   `file`, …) contribute an uncounted 8-byte digest of their value that does
//!   not depend on its JSON spelling (whitespace, escapes, member order).
//! - **Completions** (`prompt`): the string, or each element of an array of
//!   strings (each closing its block) or token ids (one block run).
//! - **Responses** (`instructions`, then `input`): `input` as a string or an
//!   array of items whose `content` / `text` / `output` are walked as above;
//!   `instructions` and each item close their last block.
//! - **`prefix` strategy** (SageMaker-style, the first `prefix_length`
//!   characters): the same blocks; only the last hash (the whole window,
//!   text and message boundaries) is its key: the cuts are a function of
//!   the window's text and boundaries, so equal windows still give equal
//!   keys and any difference in them a different key, as before.
//! - **Raw**: a body that is not a JSON object (first non-blank byte not `{`),
//!   or a JSON object with none of the fields above: its first bytes.
//!
//! Characters are counted for JSON APIs (Unicode scalar values of the text),
//! bytes for raw bodies. The key never depends on JSON whitespace or on the
//! order of object fields. `model` and `cache_salt` are returned for the seed,
//! `prompt_cache_key` as a routing id candidate.
//!
//! Reading the body as the engine does (vLLM and SGLang parse with Python's
//! `json`): keys are compared unescaped (`"m\u0065ssages"` is `messages`); a
//! top-level field given twice takes its **last** value, as Python does; a
//! `null` field is absent (SDKs send `"model": null`, `"cache_salt": null`).
//! A prompt field repeated inside one object (two `content` in a message) is
//! refused as [`Malformed`] (routed as `bad_input`, still served): the walk is
//! a single pass and has hashed the first one already.
//!
//! Cost: one linear scan of the body by [`crate::json::Scanner`] (structure
//! checked, nothing copied), then the chosen fields' text streamed into the
//! [`PrefixHasher`] with escapes decoded on the fly, stopping once
//! `prefix_length` characters are hashed. No copy of the body.

use crate::hash::{PrefixHasher, PrefixHashes};
use crate::json::{key_position, unescape, walk_text, Scanner, ELEMENT_END};
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

/// A scoping field's value: a JSON string, borrowed when it has no escapes
/// (`null` was turned into `None` before).
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
            // Last one wins (Python's `json`); `null` is absent.
            if let Some(i) = key_position(k, &NAMES) {
                fields[i] = (v != b"null").then_some(v);
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
    shape("instructions", instructions, b"\"")?;
    shape("input", input, b"\"[")?;

    let kind = if chat && messages.is_some() {
        BodyKind::Chat
    } else if instructions.is_some() || input.is_some() {
        let bad = |e: crate::json::SyntaxError| Malformed(e.to_string());
        if let Some(i) = instructions {
            walk_text(i, &mut h, ELEMENT_END).map_err(bad)?;
        }
        h.end_element(FIELD_END);
        if let Some(i) = input {
            walk_text(i, &mut h, ELEMENT_END).map_err(bad)?;
        }
        BodyKind::Responses
    } else if let Some(p) = prompt {
        walk_text(p, &mut h, ELEMENT_END).map_err(|e| Malformed(e.to_string()))?;
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

    /// The key a body must get, built from the expected text directly:
    /// `Ok` pieces are counted text, `Err` pieces element ends (uncounted
    /// markers that close the block).
    fn expected(pieces: &[Result<&str, &[u8]>]) -> (Option<u64>, usize) {
        expected_as(pieces, true)
    }

    /// [`expected`] with `Err` pieces as plain markers when `!close`.
    fn expected_as(pieces: &[Result<&str, &[u8]>], close: bool) -> (Option<u64>, usize) {
        let mut h = PrefixHasher::new(2048, 256);
        for p in pieces {
            match p {
                Ok(t) => h.push_str(t),
                Err(m) if close => h.end_element(m),
                Err(m) => h.push_marker(m),
            }
        }
        let r = h.finish();
        (r.last(), r.units)
    }

    /// (key, units) of a body.
    fn text_key(body: &str) -> (Option<u64>, usize) {
        let (_, k, units) = key(body);
        (k, units)
    }

    const END: Result<&str, &[u8]> = Err(ELEMENT_END);

    #[test]
    fn whitespace_and_field_order_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi"}]}"#;
        let b = "{ \"messages\" : [ { \"content\" : \"You are helpful.\" ,\n \"role\":\"system\"},\n\t{\"content\":\"Hi\",\"role\":\"user\"} ],\n \"model\" : \"m\" }";
        assert_eq!(key(a), key(b));
        assert_eq!(key(a).0, BodyKind::Chat);
        assert_eq!(
            text_key(a),
            expected(&[Ok("You are helpful."), END, Ok("Hi"), END])
        );
    }

    #[test]
    fn content_string_equals_text_parts() {
        let s = r#"{"messages":[{"role":"user","content":"hello world"}]}"#;
        let p = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello "},{"type":"text","text":"world"}]}]}"#;
        let one =
            r#"{"messages":[{"role":"user","content":[{"text":"hello world","type":"text"}]}]}"#;
        assert_eq!(key(s), key(p));
        assert_eq!(key(s), key(one));
        assert_eq!(text_key(s), expected(&[Ok("hello world"), END]));
        // Long multi-part content: the parts of one message share its blocks
        // (a part does not close a block); the message end does.
        let (a, b) = ("x".repeat(300), "y".repeat(100));
        let whole = format!(
            r#"{{"messages":[{{"role":"user","content":"{a}{b}"}},{{"role":"user","content":"z"}}]}}"#
        );
        let parts = format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"{a}"}},{{"type":"text","text":"{b}"}}]}},{{"role":"user","content":"z"}}]}}"#
        );
        let (w, p) = (
            extract(whole.as_bytes(), 2048, 256).unwrap().prefix,
            extract(parts.as_bytes(), 2048, 256).unwrap().prefix,
        );
        assert_eq!(w, p);
        assert_eq!(w.ends, vec![256, 400, 401]);
    }

    #[test]
    fn message_boundaries_matter() {
        let a = r#"{"messages":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}"#;
        let b = r#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}"#;
        assert_ne!(key(a).1, key(b).1);
    }

    /// Chat bodies of turns 1..=n of one conversation (system prompt, then
    /// alternating user / assistant messages of uneven lengths).
    fn conversation(n: usize) -> Vec<String> {
        let lens = [900usize, 40, 256, 0, 700, 13, 512];
        let msgs: Vec<String> = lens
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let role = ["system", "user", "assistant"][if i == 0 { 0 } else { 2 - i % 2 }];
                let text: String = (0..l)
                    .map(|j| char::from(b'a' + ((i * 7 + j) % 26) as u8))
                    .collect();
                format!(r#"{{"role":"{role}","content":"{text}"}}"#)
            })
            .collect();
        (1..=n.min(msgs.len()))
            .map(|k| format!(r#"{{"model":"m","messages":[{}]}}"#, msgs[..k].join(",")))
            .collect()
    }

    #[test]
    fn each_turn_key_is_a_prefix_of_the_next() {
        let turns = conversation(7);
        let keys: Vec<PrefixHashes> = turns
            .iter()
            .map(|b| extract(b.as_bytes(), 65536, 256).unwrap().prefix)
            .collect();
        for (k, pair) in keys.windows(2).enumerate() {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(b.blocks.len() >= a.blocks.len(), "turn {k}");
            assert_eq!(a.blocks[..], b.blocks[..a.blocks.len()], "turn {k}");
            assert_eq!(a.ends[..], b.ends[..a.ends.len()], "turn {k}");
        }
        // The system prompt (900 chars) ends in its own block at 900; the
        // message of exactly 256 chars is one block; the empty one none.
        assert_eq!(keys[0].ends, vec![256, 512, 768, 900]);
        assert_eq!(keys[2].ends, vec![256, 512, 768, 900, 940, 1196]);
        // A trailing empty message adds no block (its marker opens the next
        // one, so it still changes turn 5's key).
        assert_eq!(keys[3], keys[2]);
        let skip_empty = turns[4].replace(r#",{"role":"user","content":""}"#, "");
        assert!(skip_empty.len() < turns[4].len());
        assert_ne!(
            extract(skip_empty.as_bytes(), 65536, 256)
                .unwrap()
                .prefix
                .last(),
            keys[4].last()
        );
        // A raw body (no boundaries) stays in whole blocks.
        let raw = extract(&[b'r'; 700], 2048, 256).unwrap().prefix;
        assert_eq!(raw.ends, vec![256, 512, 700]);
    }

    #[test]
    fn escapes_are_text() {
        let a = r#"{"messages":[{"role":"user","content":"line\nnext \u00e9"}]}"#;
        let b = "{\"messages\":[{\"role\":\"user\",\"content\":\"line\\nnext é\"}]}";
        assert_eq!(key(a), key(b));
        assert_eq!(text_key(a), expected(&[Ok("line\nnext é"), END]));
    }

    #[test]
    fn images_change_the_key_but_not_the_count() {
        let a = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"A"}},{"type":"text","text":"x"}]}]}"#;
        let b = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"B"}},{"type":"text","text":"x"}]}]}"#;
        assert_ne!(key(a).1, key(b).1);
        assert_eq!(key(a).2, 1);
        let text_only = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}"#;
        assert_ne!(key(a).1, key(text_only).1);
    }

    #[test]
    fn completions_and_responses() {
        let c = r#"{"model":"m","prompt":"Once upon a time"}"#;
        assert_eq!(key(c).0, BodyKind::Completions);
        assert_eq!(text_key(c), expected(&[Ok("Once upon a time")]));
        let batch = r#"{"prompt":["a","b"]}"#;
        assert_eq!(text_key(batch), expected(&[Ok("a"), END, Ok("b"), END]));
        let tokens = r#"{"prompt":[1,22,333]}"#;
        let sp: Result<&str, &[u8]> = Err(b" ");
        assert_eq!(
            text_key(tokens),
            expected_as(
                &[Ok("1"), sp, END, Ok("22"), sp, END, Ok("333"), sp, END],
                false
            )
        );
        let field_end: Result<&str, &[u8]> = Err(FIELD_END);
        let r1 = r#"{"instructions":"Be brief.","input":"What is Rust?"}"#;
        let r2 = r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"What is Rust?"}]}],"instructions":"Be brief."}"#;
        assert_eq!(key(r1).0, BodyKind::Responses);
        assert_eq!(
            text_key(r1),
            expected(&[Ok("Be brief."), field_end, Ok("What is Rust?")])
        );
        assert_eq!(
            text_key(r2),
            expected(&[Ok("Be brief."), field_end, Ok("What is Rust?"), END])
        );
    }

    #[test]
    fn duplicate_keys_last_wins_like_python() {
        let chat = |text: &str| format!(r#"{{"messages":[{{"role":"user","content":"{text}"}}]}}"#);
        let dup = r#"{"messages":[{"role":"user","content":"first"}],"model":"a","messages":[{"role":"user","content":"second"}],"model":"b"}"#;
        let e = extract(dup.as_bytes(), 2048, 256).unwrap();
        assert_eq!(e.kind, BodyKind::Chat);
        assert_eq!(e.prefix.last(), key(&chat("second")).1);
        assert_eq!(e.model.as_deref(), Some("b"));
        // A later `null` removes the field, as in Python (`d.get("messages")`).
        let gone = r#"{"messages":[{"role":"user","content":"x"}],"prompt":"p","messages":null}"#;
        assert_eq!(key(gone).0, BodyKind::Completions);
        assert_eq!(text_key(gone), expected(&[Ok("p")]));
        for (body, field) in [
            (r#"{"prompt":"a","prompt":"b"}"#, "b"),
            (
                r#"{"prompt":"x","cache_salt":"s1","cache_salt":"s2"}"#,
                "s2",
            ),
            (
                r#"{"prompt":"x","prompt_cache_key":"k1","prompt_cache_key":"k2"}"#,
                "k2",
            ),
            (
                r#"{"instructions":"i1","input":"x","instructions":"i2"}"#,
                "i2",
            ),
        ] {
            let e = extract(body.as_bytes(), 2048, 256).unwrap();
            let got = match e.kind {
                BodyKind::Responses => {
                    let i2 = format!(r#"{{"instructions":"{field}","input":"x"}}"#);
                    assert_eq!(e.prefix.last(), key(&i2).1, "{body}");
                    continue;
                }
                _ => [e.cache_salt, e.prompt_cache_key]
                    .into_iter()
                    .flatten()
                    .next()
                    .map(|c| c.into_owned()),
            };
            match got {
                Some(v) => assert_eq!(v, field, "{body}"),
                None => assert_eq!(text_key(body), expected(&[Ok(field)]), "{body}"),
            }
        }
    }

    #[test]
    fn escaped_keys_are_unescaped() {
        let plain = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let escaped = r#"{"mod\u0065l":"m","m\u0065ssages":[{"role":"user","c\u006fntent":"hi"}]}"#;
        assert_eq!(key(plain), key(escaped));
        let e = extract(escaped.as_bytes(), 2048, 256).unwrap();
        assert_eq!(e.model.as_deref(), Some("m"));
        let salt = r#"{"prompt":"x","cache\u005fsalt":"t"}"#;
        let e = extract(salt.as_bytes(), 2048, 256).unwrap();
        assert_eq!(e.cache_salt.as_deref(), Some("t"));
        // An escaped key that decodes to something else still does not match.
        assert_eq!(key(r#"{"m\u0065ssagez":[]}"#).0, BodyKind::Raw);
    }

    #[test]
    fn null_fields_are_absent() {
        let with_nulls = r#"{"model":null,"cache_salt":null,"prompt_cache_key":null,"instructions":null,"prompt":null,"messages":[{"role":"user","content":"hi"}]}"#;
        let plain = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let e = extract(with_nulls.as_bytes(), 2048, 256).unwrap();
        assert_eq!(
            (e.model, e.cache_salt, e.prompt_cache_key),
            (None, None, None)
        );
        assert_eq!(key(with_nulls), key(plain));
        let resp = r#"{"instructions":null,"input":"q"}"#;
        assert_eq!(key(resp), key(r#"{"input":"q"}"#));
    }

    #[test]
    fn repeated_prompt_field_in_an_object_is_malformed() {
        for bad in [
            r#"{"messages":[{"role":"user","content":"a","content":"b"}]}"#,
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a","te\u0078t":"b"}]}]}"#,
            r#"{"prompt":"x","input":[{"content":"a","content":"b"}]}"#,
        ] {
            assert!(extract(bad.as_bytes(), 2048, 256).is_err(), "{bad}");
        }
        // Different prompt fields in one object are fine.
        assert!(extract(br#"{"input":[{"text":"a","content":"b"}]}"#, 2048, 256).is_ok());
    }

    /// The slow path as the reference: texts fed one character at a time
    /// (never a whole block at once, so never an in-place, ASCII or plain
    /// block), each message closing its block.
    fn char_by_char(texts: &[String], limit: usize) -> PrefixHashes {
        let mut h = PrefixHasher::new(limit, 256);
        for t in texts {
            for c in t.chars() {
                h.push_str(c.encode_utf8(&mut [0; 4]));
            }
            h.end_element(ELEMENT_END);
        }
        h.finish()
    }

    /// A xorshift64 generator: `rand(n)` is in `0..n` (0 for `n` = 0).
    fn xorshift(mut state: u64) -> impl FnMut(u32) -> u32 {
        move |n| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(n.max(1))) as u32
        }
    }

    /// JSON string contents for `text`: quotes, backslashes and controls
    /// escaped, and (when `rand` says so) non-ASCII characters as `\uXXXX`.
    fn json_text(text: &str, rand: &mut impl FnMut(u32) -> u32) -> String {
        let mut out = String::new();
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if !c.is_ascii() && (c as u32) < 0x10000 && rand(3) == 0 => {
                    out.push_str(&format!("\\u{:04x}", c as u32))
                }
                c => out.push(c),
            }
        }
        out
    }

    #[test]
    fn fast_paths_give_the_slow_paths_keys() {
        // Messages of ASCII runs whose lengths straddle the 256-character
        // block and the 16/64-byte vector steps, escapes, multi-byte
        // characters and controls at every kind of offset: the key of the
        // body (plain blocks straight from the JSON, ASCII blocks, SIMD
        // character counts) equals feeding the decoded texts one character
        // at a time; with the whole budget and with one that runs out
        // inside a plain run.
        let mut rand = xorshift(0x2545_f491_4f6c_dd1d);
        let runs = [0usize, 1, 15, 16, 17, 63, 64, 255, 256, 257, 511, 512, 700];
        let odd = ["\n", "\"", "\\", "é", "漢", "🦊", "\t", "\u{1}", "ü\n"];
        for round in 0..60 {
            let mut texts = Vec::new();
            for _ in 0..1 + rand(4) {
                let mut t = String::new();
                for _ in 0..rand(6) {
                    let n = runs[rand(runs.len() as u32) as usize];
                    t.extend((0..n).map(|i| char::from(b'a' + ((i * 7 + round) % 26) as u8)));
                    t.push_str(odd[rand(odd.len() as u32) as usize]);
                }
                texts.push(t);
            }
            let body = format!(
                r#"{{"model":"m","messages":[{}]}}"#,
                texts
                    .iter()
                    .map(|t| format!(
                        r#"{{"role":"user","content":"{}"}}"#,
                        json_text(t, &mut rand)
                    ))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            for limit in [65536, 300 + rand(900) as usize] {
                let got = extract(body.as_bytes(), limit, 256).unwrap().prefix;
                assert_eq!(
                    got,
                    char_by_char(&texts, limit),
                    "round {round} limit {limit}: {body}"
                );
            }
        }
    }

    /// [`extract`] by the reference path: the hasher takes no fast path
    /// (`hash::REFERENCE_PATH`: every piece of text decoded and fed one
    /// character at a time, each block hashed from its copy).
    fn reference_extract(
        body: &[u8],
        limit: usize,
        units: usize,
    ) -> Result<Extracted<'_>, Malformed> {
        crate::hash::REFERENCE_PATH.with(|r| r.set(true));
        let e = extract(body, limit, units);
        crate::hash::REFERENCE_PATH.with(|r| r.set(false));
        e
    }

    /// Raw JSON string contents (escapes and invalid bytes in it) of random
    /// text: ASCII runs whose lengths straddle the 16/64/256-byte steps,
    /// escapes (`\uXXXX` with surrogate pairs, lone surrogates), raw
    /// multi-byte characters, invalid UTF-8 and, rarely, a raw control byte
    /// (a malformed body: both paths must refuse it alike).
    fn random_text(rand: &mut impl FnMut(u32) -> u32) -> Vec<u8> {
        const RUNS: [usize; 16] = [
            0, 1, 15, 16, 17, 63, 64, 100, 255, 256, 257, 300, 511, 512, 513, 700,
        ];
        const ODD: [&[u8]; 22] = [
            b"\\n",
            b"\\\"",
            b"\\\\",
            b"\\/",
            b"\\t",
            b"\\b",
            b"\\u00e9",
            b"\\u6F22",
            b"\\u0000",
            b"\\ud83e\\udd8a",
            b"\\ud800",
            b"\\udc00",
            b"\\ud83ex",
            b"\\ud83e\\u0041",
            "é".as_bytes(),
            "漢".as_bytes(),
            "🦊".as_bytes(),
            b"\xff",
            b"\x80",
            b"\xc3",
            b"\xe6\xbc",
            b"\x01",
        ];
        let mut t = Vec::new();
        for _ in 0..rand(7) {
            let n = RUNS[rand(RUNS.len() as u32) as usize];
            let seed = rand(26) as usize;
            t.extend((0..n).map(|i| b"abcdefghijklmnopqrstuvwxyz ,.!?-"[(i * 7 + seed) % 32]));
            // The control byte stays rare (it makes the body malformed).
            let odd = ODD.len() - usize::from(rand(8) != 0);
            t.extend_from_slice(ODD[rand(odd as u32) as usize]);
        }
        t
    }

    /// A random request body of one of the shapes the walk knows (chat with
    /// string or multi-part contents and media, completions with a string,
    /// strings or token ids, Responses with `instructions` and a string or
    /// items `input`), sometimes truncated.
    fn random_body(rand: &mut impl FnMut(u32) -> u32) -> Vec<u8> {
        let mut b: Vec<u8> = Vec::new();
        let string = |b: &mut Vec<u8>, rand: &mut dyn FnMut(u32) -> u32| {
            b.push(b'"');
            b.extend(random_text(&mut |n| rand(n)));
            b.push(b'"');
        };
        let parts = |b: &mut Vec<u8>, rand: &mut dyn FnMut(u32) -> u32, kind: &[u8]| {
            b.push(b'[');
            for i in 0..1 + rand(3) {
                if i > 0 {
                    b.extend_from_slice(b" , ");
                }
                if rand(4) == 0 {
                    b.extend_from_slice(br#"{"type":"image_url","image_url":{"url":"#);
                    string(b, rand);
                    b.extend_from_slice(b"}}");
                } else {
                    b.extend_from_slice(br#"{"type":""#);
                    b.extend_from_slice(kind);
                    b.extend_from_slice(br#"","text":"#);
                    string(b, rand);
                    b.push(b'}');
                }
            }
            b.push(b']');
        };
        b.extend_from_slice(br#"{"model":"m","#);
        match rand(3) {
            0 => {
                b.extend_from_slice(br#""messages":["#);
                for i in 0..1 + rand(4) {
                    if i > 0 {
                        b.push(b',');
                    }
                    b.extend_from_slice(br#"{"role":"user","content":"#);
                    if rand(3) == 0 {
                        parts(&mut b, rand, b"text");
                    } else {
                        string(&mut b, rand);
                    }
                    b.push(b'}');
                }
                b.push(b']');
            }
            1 => {
                b.extend_from_slice(br#""prompt":"#);
                match rand(3) {
                    0 => string(&mut b, rand),
                    1 => {
                        b.push(b'[');
                        for i in 0..1 + rand(3) {
                            if i > 0 {
                                b.push(b',');
                            }
                            string(&mut b, rand);
                        }
                        b.push(b']');
                    }
                    _ => {
                        let ids: Vec<String> = (0..1 + rand(300))
                            .map(|_| rand(100_000).to_string())
                            .collect();
                        b.extend_from_slice(format!("[{}]", ids.join(",")).as_bytes());
                    }
                }
            }
            _ => {
                if rand(2) == 0 {
                    b.extend_from_slice(br#""instructions":"#);
                    string(&mut b, rand);
                    b.push(b',');
                }
                b.extend_from_slice(br#""input":"#);
                if rand(3) == 0 {
                    string(&mut b, rand);
                } else {
                    b.push(b'[');
                    for i in 0..1 + rand(3) {
                        if i > 0 {
                            b.push(b',');
                        }
                        match rand(3) {
                            0 => {
                                b.extend_from_slice(br#"{"role":"user","content":"#);
                                parts(&mut b, rand, b"input_text");
                            }
                            1 => {
                                b.extend_from_slice(br#"{"type":"message","content":"#);
                                string(&mut b, rand);
                            }
                            _ => {
                                b.extend_from_slice(br#"{"type":"function_call_output","output":"#);
                                string(&mut b, rand);
                            }
                        }
                        b.push(b'}');
                    }
                    b.push(b']');
                }
            }
        }
        b.extend_from_slice(br#","stream":false}"#);
        if rand(5) == 0 {
            let cut = rand(b.len() as u32) as usize;
            b.truncate(cut);
        }
        b
    }

    #[test]
    fn fast_key_equals_the_reference_key() {
        // Random bodies (escapes, surrogates, unicode, invalid UTF-8,
        // truncation, prompt arrays and token ids, Responses items,
        // multi-part contents, media): the key with every fast path (plain
        // blocks from the body, the 256-byte round, ASCII blocks, in-place
        // blocks) equals the reference path's, for the whole budget and for
        // budgets that run out anywhere; block sizes 256 (the key's, the
        // round path) and 64 (the general path). And the seeded blocks
        // (`Mixer`) equal the former per-block xxh3.
        let mut rand = xorshift(0x51f1_5e7a_c0ff_ee11);
        let (mut ok, mut bad) = (0, 0);
        for round in 0..400 {
            let body = random_body(&mut rand);
            for units in [256, 64] {
                for limit in [65536, 1 + rand(3000) as usize] {
                    let got = extract(&body, limit, units);
                    let want = reference_extract(&body, limit, units);
                    assert_eq!(
                        got,
                        want,
                        "round {round} units {units} limit {limit}: {}",
                        String::from_utf8_lossy(&body)
                    );
                    match got {
                        Ok(e) => {
                            ok += 1;
                            let seed = u64::from(rand(u32::MAX)) << 20 ^ round;
                            let m = crate::hash::Mixer::new(seed);
                            for &h in &e.prefix.blocks {
                                assert_eq!(
                                    m.mix(h),
                                    xxhash_rust::xxh3::xxh3_64_with_seed(&h.to_le_bytes(), seed)
                                );
                            }
                        }
                        Err(_) => bad += 1,
                    }
                }
            }
        }
        // Both outcomes were exercised.
        assert!(ok > 800 && bad > 100, "{ok} keys, {bad} malformed");
    }

    #[test]
    fn invalid_utf8_is_hashed_as_bytes_not_refused() {
        // The engine refuses such a body; routing it anywhere is fine, never a panic.
        let mut a = br#"{"messages":[{"role":"user","content":"ok "#.to_vec();
        a.extend_from_slice(&[0xff, 0xfe, 0xc3]);
        a.extend_from_slice(br#""}]}"#);
        let e = extract(&a, 2048, 256).unwrap();
        assert_eq!(e.kind, BodyKind::Chat);
        let mut b = a.clone();
        b[a.len() - 6] = 0xfd;
        assert_ne!(
            e.prefix.last(),
            extract(&b, 2048, 256).unwrap().prefix.last()
        );
        // Raw bodies of random bytes: hashed as they are.
        let raw: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        assert_eq!(extract(&raw, 2048, 256).unwrap().prefix.units, 2048);
    }

    #[test]
    fn media_key_ignores_json_spelling() {
        let a = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/a.png","detail":"low"}},{"type":"text","text":"x"}]}]}"#;
        let b = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\": { \"detail\" : \"low\",\n \"url\":\"http:\\/\\/x\\/a.png\" } },{\"type\":\"text\",\"text\":\"x\"}]}]}";
        assert_eq!(key(a), key(b));
        let c = r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/a.png","detail":"high"}},{"type":"text","text":"x"}]}]}"#;
        assert_ne!(key(a).1, key(c).1);
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
        let first: String = "é".repeat(2048);
        assert_eq!(text_key(&a), expected(&[Ok(&first)]));
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
