//! What the engine delivered: an incremental scanner over response chunks.
//!
//! Every OpenAI-compatible engine reports how many prompt tokens it served
//! from its prefix cache: `usage.prompt_tokens_details.cached_tokens` (vLLM
//! with `--enable-prompt-tokens-details`, SGLang, llama.cpp, the emulator;
//! Responses API: `usage.input_tokens_details.cached_tokens`), llama.cpp also
//! `timings.cache_n` / `timings.prompt_n`. In a non-streaming response it is
//! in the JSON body; in a server-sent-event stream it is in the last
//! `data: {...}` chunk when the client set `stream_options.include_usage`.
//!
//! [`UsageScanner`] reads the response **as it passes**: the filter hands it
//! each chunk (`get_http_response_body` of the current chunk, then
//! `Action::Continue`) and keeps nothing of the chunk. The state carried across
//! chunk boundaries is the window of the token being read: at most
//! [`MAX_KEY`] bytes of a key, [`MAX_ID`] bytes of the response id and the
//! digits of one number — about 100 bytes in all, so every split point of a
//! chunk gives the same result as the whole body (tested exhaustively).
//!
//! Algorithm: one pass over the bytes with a small JSON tokenizer that only
//! tracks what it needs: whether it is inside a string (with `\` escapes),
//! the object/array depth, the last string read (a key if a `:` follows) and,
//! after an interesting key and its `:`, the value. Recognised keys, at any
//! depth (last value wins, as the usage chunk comes last):
//! `cached_tokens`, `prompt_tokens`, `input_tokens`, `cache_n`, `prompt_n`;
//! and the first response id: a top-level (depth 1) `"id"`, or an `"id"`
//! directly inside a top-level `"response"` object (depth 2: the Responses
//! API's stream carries the response in every lifecycle event, `{"type":
//! "response.created", "response": {"id": …}}`), whose value is a plain
//! string of 1–[`MAX_ID`] bytes. Ids of nested items (`output[].id`,
//! `item.id`) never match. Key names inside string *values* (model output such as
//! `"\"cached_tokens\": 5"`) never match: the quotes of such text are escaped.
//! A raw newline ends any string (JSON strings cannot contain one; SSE events
//! are newline-separated), so a truncated event cannot desynchronise the rest.
//!
//! Cost: O(bytes), no allocation except the response id (once). Inside
//! strings that are not captured, the scan jumps to the next `"`, `\` or
//! newline.
//!
//! [`compare`] turns a prediction and a delivery into a [`Surprise`].

/// Longest key kept (longer keys are not interesting).
pub const MAX_KEY: usize = 16;
/// Longest response id kept; a longer id is ignored.
pub const MAX_ID: usize = 64;

/// Position of the first byte of `hay` equal to one of `needles` (SIMD,
/// sixteen bytes per step: [`crate::bytescan::find`]).
#[inline]
fn find_any<const N: usize>(hay: &[u8], needles: [u8; N]) -> Option<usize> {
    crate::bytescan::find(hay, needles, 0)
}

/// Can an SSE chunk hold a field the scanner wants, other than `id`? (Every
/// wanted numeric key ends in `_tokens"` or `_n"`.)
fn may_hold_usage(chunk: &[u8]) -> bool {
    let mut from = 0;
    while let Some(p) = chunk.get(from..).and_then(|h| find_any(h, [b'_'])) {
        let rest = &chunk[from + p + 1..];
        if rest.starts_with(b"tokens\"") || rest.starts_with(b"n\"") {
            return true;
        }
        from += p + 1;
    }
    false
}

/// Interesting keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    /// A top-level `"response"` (its object's `"id"` is the response id).
    Response,
    CachedTokens,
    PromptTokens,
    InputTokens,
    CacheN,
    PromptN,
}

impl Field {
    fn of(name: &[u8]) -> Option<Field> {
        Some(match name {
            b"id" => Field::Id,
            b"response" => Field::Response,
            b"cached_tokens" => Field::CachedTokens,
            b"prompt_tokens" => Field::PromptTokens,
            b"input_tokens" => Field::InputTokens,
            b"cache_n" => Field::CacheN,
            b"prompt_n" => Field::PromptN,
            _ => return None,
        })
    }
}

/// What one response reported (each field as last seen; `None` if absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// `cached_tokens` (OpenAI `prompt_tokens_details` / `input_tokens_details`).
    pub cached_tokens: Option<u64>,
    /// `prompt_tokens` (chat, completions).
    pub prompt_tokens: Option<u64>,
    /// `input_tokens` (Responses API).
    pub input_tokens: Option<u64>,
    /// llama.cpp `timings.cache_n` (prompt tokens reused from the cache).
    pub cache_n: Option<u64>,
    /// llama.cpp `timings.prompt_n` (prompt tokens processed).
    pub prompt_n: Option<u64>,
    /// The response `id` (first top-level `"id"` or `"response": {"id": …}`,
    /// ≤ [`MAX_ID`] bytes).
    pub id: Option<String>,
}

impl Usage {
    /// Prompt tokens served from the cache, if the engine said.
    pub fn cached(&self) -> Option<u64> {
        self.cached_tokens.or(self.cache_n)
    }

    /// Prompt tokens in all, if the engine said.
    pub fn prompt(&self) -> Option<u64> {
        self.prompt_tokens
            .or(self.input_tokens)
            .or(match (self.prompt_n, self.cache_n) {
                (Some(p), Some(c)) => Some(p.saturating_add(c)),
                _ => None,
            })
    }
}

/// The incremental scanner (see the module docs).
#[derive(Debug, Clone)]
pub struct UsageScanner {
    usage: Usage,
    in_string: bool,
    escaped: bool,
    /// The current string is the value of a response id.
    capturing_id: bool,
    /// Inside the object of a top-level `"response"` key (depth ≥ 2).
    in_response: bool,
    /// Bytes of the current string (a key candidate or the id value).
    buf: [u8; MAX_ID],
    len: usize,
    /// The current string had an escape or was longer than kept.
    spoiled: bool,
    /// Depth of the current string's start.
    string_depth: u32,
    depth: u32,
    /// The last string closed was this interesting key (at this depth): a `:` makes it a key.
    pending: Option<(Field, u32)>,
    /// After `key:`: the value expected.
    expect: Option<(Field, u32)>,
    /// A number being read: (field, value so far, overflowed).
    number: Option<(Field, u64, bool)>,
    bytes: u64,
    /// The response is an event stream: whole events may be skipped.
    sse: bool,
}

impl Default for UsageScanner {
    fn default() -> Self {
        UsageScanner::new()
    }
}

impl UsageScanner {
    /// A scanner at the start of a response.
    pub fn new() -> UsageScanner {
        UsageScanner {
            usage: Usage::default(),
            in_string: false,
            escaped: false,
            capturing_id: false,
            in_response: false,
            buf: [0; MAX_ID],
            len: 0,
            spoiled: false,
            string_depth: 0,
            depth: 0,
            pending: None,
            expect: None,
            number: None,
            bytes: 0,
            sse: false,
        }
    }

    /// A scanner for a `text/event-stream` response: a chunk that starts
    /// between events, ends with a blank line (the end of an event) and holds
    /// no wanted key is skipped after one fast search, once the id is known
    /// (token events are most of a stream; the usage comes last). Same
    /// results as [`UsageScanner::new`] on well-formed streams.
    pub fn sse() -> UsageScanner {
        UsageScanner {
            sse: true,
            ..UsageScanner::new()
        }
    }

    /// Bytes scanned so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What was found so far (a number still being read at the very end of
    /// the data counts: the body may end right after it).
    pub fn usage(&self) -> Usage {
        self.clone().into_usage()
    }

    /// [`UsageScanner::usage`] at the end of the response, without copying
    /// the response id (no allocation).
    pub fn into_usage(self) -> Usage {
        let mut u = self.usage;
        if let Some((f, v, false)) = self.number {
            store(&mut u, f, v);
        }
        u
    }

    /// Scan the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.bytes = self.bytes.saturating_add(chunk.len() as u64);
        if self.sse
            && self.usage.id.is_some()
            && self.between_events()
            && chunk.ends_with(b"\n\n")
            && !may_hold_usage(chunk)
        {
            return;
        }
        let mut i = 0;
        while i < chunk.len() {
            if self.in_string {
                i = self.string_bytes(chunk, i);
                continue;
            }
            let b = chunk[i];
            i += 1;
            if let Some((f, v, over)) = self.number {
                if b.is_ascii_digit() {
                    let d = u64::from(b - b'0');
                    self.number = Some(match v.checked_mul(10).and_then(|x| x.checked_add(d)) {
                        Some(x) => (f, x, over),
                        None => (f, 0, true),
                    });
                    continue;
                }
                self.number = None;
                if !over {
                    store(&mut self.usage, f, v);
                }
            }
            match b {
                b' ' | b'\t' | b'\r' | b'\n' => {}
                b'"' => {
                    self.in_string = true;
                    self.escaped = false;
                    self.len = 0;
                    self.spoiled = false;
                    self.string_depth = self.depth;
                    self.capturing_id = self.usage.id.is_none()
                        && match self.expect {
                            Some((Field::Id, 1)) => true,
                            Some((Field::Id, 2)) => self.in_response,
                            _ => false,
                        };
                    self.pending = None;
                    self.expect = None;
                }
                b':' => {
                    self.expect = self.pending.take();
                }
                b'0'..=b'9' => {
                    match self.expect.take() {
                        Some((f, _)) if !matches!(f, Field::Id | Field::Response) => {
                            self.number = Some((f, u64::from(b - b'0'), false))
                        }
                        _ => {}
                    }
                    self.pending = None;
                }
                b'{' | b'[' => {
                    if self.depth == 1 {
                        self.in_response =
                            b == b'{' && matches!(self.expect, Some((Field::Response, 1)));
                    }
                    self.depth = self.depth.saturating_add(1);
                    self.pending = None;
                    self.expect = None;
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth < 2 {
                        self.in_response = false;
                    }
                    self.pending = None;
                    self.expect = None;
                }
                _ => {
                    self.pending = None;
                    self.expect = None;
                }
            }
        }
    }

    fn between_events(&self) -> bool {
        !self.in_string
            && self.depth == 0
            && self.pending.is_none()
            && self.expect.is_none()
            && self.number.is_none()
    }

    /// Inside a string from `chunk[i]`; returns where to go on. The run up
    /// to the next `"`, `\` or newline is found by a SIMD search and kept
    /// (whole) only while it fits the key or id window.
    fn string_bytes(&mut self, chunk: &[u8], mut i: usize) -> usize {
        while let Some(rest) = chunk.get(i..).filter(|r| !r.is_empty()) {
            if self.escaped {
                self.escaped = false;
                i += 1;
                continue;
            }
            let run = find_any(rest, [b'"', b'\\', b'\n']).unwrap_or(rest.len());
            if !self.spoiled {
                let cap = if self.capturing_id { MAX_ID } else { MAX_KEY };
                match (self.buf.get_mut(self.len..self.len + run), rest.get(..run)) {
                    (Some(dst), Some(src)) if self.len + run <= cap => {
                        dst.copy_from_slice(src);
                        self.len += run;
                    }
                    _ => self.spoiled = true,
                }
            }
            i += run;
            match chunk.get(i) {
                None => break,
                Some(b'\\') => {
                    self.escaped = true;
                    self.spoiled = true;
                    i += 1;
                }
                Some(b'"') => {
                    self.in_string = false;
                    self.close_string();
                    return i + 1;
                }
                Some(_) => {
                    // A raw newline: JSON strings hold none, so the event was
                    // cut; start the next one afresh.
                    self.in_string = false;
                    self.capturing_id = false;
                    self.in_response = false;
                    self.depth = 0;
                    return i + 1;
                }
            }
        }
        i
    }

    fn close_string(&mut self) {
        let s = &self.buf[..self.len];
        if self.capturing_id {
            self.capturing_id = false;
            if !self.spoiled && !s.is_empty() {
                if let Ok(id) = std::str::from_utf8(s) {
                    self.usage.id = Some(id.to_string());
                }
            }
            return;
        }
        if !self.spoiled {
            self.pending = Field::of(s).map(|f| (f, self.string_depth));
        }
    }
}

fn store(u: &mut Usage, f: Field, v: u64) {
    match f {
        Field::CachedTokens => u.cached_tokens = Some(v),
        Field::PromptTokens => u.prompt_tokens = Some(v),
        Field::InputTokens => u.input_tokens = Some(v),
        Field::CacheN => u.cache_n = Some(v),
        Field::PromptN => u.prompt_n = Some(v),
        Field::Id | Field::Response => {}
    }
}

/// Scan a whole body at once (tests, the simulator, tools).
pub fn scan(body: &[u8]) -> Usage {
    let mut s = UsageScanner::new();
    s.feed(body);
    s.usage()
}

/// What the router expected of a request at routing time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Prompt tokens expected from the chosen replica's cache.
    pub cached_tokens: f64,
    /// Prompt tokens estimated from the prompt size.
    pub prompt_tokens: f64,
}

/// The cached tokens to predict for a choice: `expected_cached` is what the
/// index proves (`affinity`'s `expected_cached_tokens`: `depth` known blocks of
/// `block_tokens`); when the prompt goes on past them (`depth < blocks`) it
/// diverges somewhere inside the next block, half a block further on average.
/// Capped by the prompt; 0 stays 0.
pub fn predict(
    expected_cached: f64,
    depth: usize,
    blocks: usize,
    block_tokens: f64,
    prompt_tokens: f64,
) -> f64 {
    if expected_cached > 0.0 && depth < blocks {
        (expected_cached + block_tokens / 2.0).min(prompt_tokens.max(expected_cached))
    } else {
        expected_cached
    }
}

/// Outcome of [`compare`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surprise {
    /// As predicted (both hits or both misses).
    None,
    /// A hit was predicted, the engine served less than half of it from cache
    /// (it evicted the prefix, restarted, or the index was wrong).
    ExpectedHitGotMiss,
    /// A miss was predicted, the engine served a real hit (another gateway, a
    /// retry, or an earlier route put the prefix there).
    ExpectedMissGotHit,
}

impl Surprise {
    /// Label for stats and the access log.
    pub const fn as_str(self) -> &'static str {
        match self {
            Surprise::None => "none",
            Surprise::ExpectedHitGotMiss => "expected_hit_got_miss",
            Surprise::ExpectedMissGotHit => "expected_miss_got_hit",
        }
    }
}

/// Compare a prediction with what was delivered.
///
/// A *predicted hit* is `predicted.cached_tokens ≥ hit_tokens`; it *got a
/// miss* when the engine served fewer than half of the predicted tokens from
/// its cache. A *delivered hit* is `cached ≥ max(hit_tokens, min_share ×
/// prompt)`, `prompt` being the engine's count if given, else the estimate
/// (engines report a few cached tokens for the chat template on any request,
/// so "cached > 0" is not a hit). `hit_tokens` is one index block in tokens
/// (256 characters / `chars_per_token`), `min_share` is `min_match`.
pub fn compare(
    predicted: &Prediction,
    cached: u64,
    prompt: Option<u64>,
    hit_tokens: f64,
    min_share: f64,
) -> Surprise {
    let cached = cached as f64;
    let prompt = prompt.map_or(predicted.prompt_tokens, |p| p as f64);
    if predicted.cached_tokens >= hit_tokens {
        if cached < predicted.cached_tokens / 2.0 {
            return Surprise::ExpectedHitGotMiss;
        }
    } else if cached >= hit_tokens.max(min_share * prompt) {
        return Surprise::ExpectedMissGotHit;
    }
    Surprise::None
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const VLLM_JSON: &str = r#"{"id":"chatcmpl-4f2a9c1e8b7d4e5f","object":"chat.completion","created":1732950000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"The \"cached_tokens\": 999 quick {\"id\":\"x\"}"},"finish_reason":"length"}],"usage":{"prompt_tokens":1028,"total_tokens":1044,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":1015}}}"#;

    const SSE: &str = concat!(
        "data: {\"id\":\"chatcmpl-emu-7\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\" The\"}}]}\n\n",
        "data: {\"id\":\"chatcmpl-emu-7\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" prompt_tokens\"}}]}\n\n",
        "data: {\"id\":\"chatcmpl-emu-7\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":4096,\"total_tokens\":4112,\"completion_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":3840}}}\n\n",
        "data: [DONE]\n\n",
    );

    const LLAMA: &str = r#"{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"Hi"}}],"created":1,"model":"q","object":"chat.completion","usage":{"completion_tokens":8,"prompt_tokens":1028,"total_tokens":1036},"id":"chatcmpl-Xy12","timings":{"cache_n":1015,"prompt_n":13,"prompt_ms":199.2,"predicted_n":8}}"#;

    const PRETTY: &str = "{\n  \"id\" : \"resp_0a1b\",\n  \"object\": \"response\",\n  \"output\": [{\"id\": \"msg_inner\", \"type\": \"message\"}],\n  \"usage\": {\n    \"input_tokens\" : 2000,\n    \"input_tokens_details\": { \"cached_tokens\" : 1792 },\n    \"output_tokens\": 5\n  }\n}\n";

    /// A streamed Responses API answer (OpenAI / vLLM / the emulator): the id is
    /// `response.id` of the lifecycle events, nested items have ids of their own,
    /// the usage comes in `response.completed`; no `[DONE]`.
    const RESPONSES_SSE: &str = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"output\":[],\"id\":\"resp_r1_42\",\"object\":\"response\",\"status\":\"in_progress\",\"previous_response_id\":\"resp_r1_41\",\"usage\":null}}\n\n",
        "event: response.output_item.added\n",
        "data: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"msg_r1_42\",\"type\":\"message\",\"status\":\"in_progress\",\"content\":[]}}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_r1_42\",\"output_index\":0,\"content_index\":0,\"delta\":\" {\\\"id\\\":\\\"evil\\\", \\\"cached_tokens\\\": 7}\",\"logprobs\":[]}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_r1_42\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"id\":\"msg_r1_42\",\"content\":[{\"type\":\"output_text\",\"text\":\" x\"}]}],\"usage\":{\"input_tokens\":2048,\"input_tokens_details\":{\"cached_tokens\":1536},\"output_tokens\":4,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":2052}}}\n\n",
    );

    fn vllm_expected() -> Usage {
        Usage {
            cached_tokens: Some(1015),
            prompt_tokens: Some(1028),
            id: Some("chatcmpl-4f2a9c1e8b7d4e5f".into()),
            ..Usage::default()
        }
    }

    #[test]
    fn non_streaming_json() {
        let u = scan(VLLM_JSON.as_bytes());
        assert_eq!(u, vllm_expected());
        assert_eq!((u.cached(), u.prompt()), (Some(1015), Some(1028)));
    }

    #[test]
    fn into_usage_equals_usage() {
        // Also when the body ends right after a number (it counts).
        let cut = &VLLM_JSON[..VLLM_JSON.find("1015").map_or(0, |i| i + 4)];
        for body in [VLLM_JSON, cut] {
            let mut s = UsageScanner::new();
            s.feed(body.as_bytes());
            let u = s.usage();
            assert_eq!(u.cached_tokens, Some(1015), "{body}");
            assert_eq!(s.into_usage(), u);
        }
    }

    #[test]
    fn sse_usage_in_the_last_chunk() {
        let u = scan(SSE.as_bytes());
        assert_eq!(u.cached(), Some(3840));
        assert_eq!(u.prompt(), Some(4096));
        assert_eq!(u.id.as_deref(), Some("chatcmpl-emu-7"));
    }

    #[test]
    fn llama_cpp_timings() {
        let u = scan(LLAMA.as_bytes());
        assert_eq!((u.cache_n, u.prompt_n), (Some(1015), Some(13)));
        assert_eq!((u.cached(), u.prompt()), (Some(1015), Some(1028)));
        assert_eq!(u.id.as_deref(), Some("chatcmpl-Xy12"));
        // Timings alone: prompt = processed + reused.
        let u = scan(br#"{"timings":{"cache_n":100,"prompt_n":28}}"#);
        assert_eq!((u.cached(), u.prompt()), (Some(100), Some(128)));
    }

    #[test]
    fn responses_api_pretty_printed() {
        let u = scan(PRETTY.as_bytes());
        assert_eq!(u.id.as_deref(), Some("resp_0a1b"), "top-level id only");
        assert_eq!((u.cached(), u.prompt()), (Some(1792), Some(2000)));
    }

    #[test]
    fn responses_api_stream() {
        let u = scan(RESPONSES_SSE.as_bytes());
        let want = Usage {
            cached_tokens: Some(1536),
            input_tokens: Some(2048),
            id: Some("resp_r1_42".into()),
            ..Usage::default()
        };
        assert_eq!(u, want, "response.id, not the item's or the delta's");
        assert_eq!((u.cached(), u.prompt()), (Some(1536), Some(2048)));
        // Event by event through the SSE fast path: the delta is skipped once the id is
        // known and the result is the same.
        let mut s = UsageScanner::sse();
        for e in RESPONSES_SSE.split_inclusive("\n\n") {
            s.feed(e.as_bytes());
        }
        assert_eq!(s.usage(), want);
        // Only a top-level "response" object's own id counts: not deeper, not elsewhere.
        for (body, id) in [
            (
                &br#"{"response":{"item":{"id":"deep"}},"x":{"id":"other"}}"#[..],
                None,
            ),
            (br#"{"x":{"response":{"id":"nested"}}}"#, None),
            (br#"{"response":"text","y":{"id":"n"}}"#, None),
            (br#"{"response":[{"id":"in_array"}]}"#, None),
            (
                br#"{"response":{"a":{"b":1},"id":"after_nested"}}"#,
                Some("after_nested"),
            ),
            (
                br#"{"response":{"id":"first"},"id":"second"}"#,
                Some("first"),
            ),
        ] {
            assert_eq!(
                scan(body).id.as_deref(),
                id,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn every_split_point_gives_the_same_result() {
        for sample in [VLLM_JSON, SSE, LLAMA, PRETTY, RESPONSES_SSE] {
            let b = sample.as_bytes();
            let whole = scan(b);
            assert!(whole.cached().is_some());
            for cut in 0..=b.len() {
                for mut s in [UsageScanner::new(), UsageScanner::sse()] {
                    s.feed(&b[..cut]);
                    s.feed(&b[cut..]);
                    assert_eq!(s.usage(), whole, "cut at {cut}");
                }
            }
            // Three pieces, and one byte at a time.
            for cut in (0..b.len()).step_by(7) {
                let mut s = UsageScanner::new();
                s.feed(&b[..cut / 2]);
                s.feed(&b[cut / 2..cut]);
                s.feed(&b[cut..]);
                assert_eq!(s.usage(), whole, "cuts at {} and {cut}", cut / 2);
            }
            let mut s = UsageScanner::new();
            for byte in b {
                s.feed(std::slice::from_ref(byte));
            }
            assert_eq!(s.usage(), whole);
            assert_eq!(s.bytes(), b.len() as u64);
        }
    }

    #[test]
    fn the_sse_fast_path_gives_the_same_result() {
        let events: Vec<&str> = SSE.split_inclusive("\n\n").collect();
        assert_eq!(events.len(), 4);
        let mut s = UsageScanner::sse();
        for e in &events {
            s.feed(e.as_bytes());
        }
        assert_eq!(s.usage(), scan(SSE.as_bytes()));
        // llama.cpp timings in an event are not skipped either.
        let mut s = UsageScanner::sse();
        s.feed(b"data: {\"id\":\"x\"}\n\n");
        s.feed(b"data: {\"timings\":{\"cache_n\":9,\"prompt_n\":1}}\n\n");
        assert_eq!(
            (s.usage().cached(), s.usage().prompt()),
            (Some(9), Some(10))
        );
        assert!(may_hold_usage(b"\"cached_tokens\":1") && !may_hold_usage(b"finish_reason"));
        for (hay, want) in [
            (&b"abcdefghijklmnop\"q"[..], Some(16)),
            (b"ab\\", Some(2)),
            (b"\n", Some(0)),
            (b"abcdefgh", None),
            (b"", None),
        ] {
            assert_eq!(find_any(hay, [b'"', b'\\', b'\n']), want);
        }
    }

    #[test]
    fn keys_inside_values_and_nested_ids_do_not_match() {
        let u = scan(br#"{"object":"x","choices":[{"id":"inner","text":"\"cached_tokens\":5, \"id\":\"evil\""}],"note":"cached_tokens","id":"outer"}"#);
        assert_eq!(u.cached_tokens, None);
        assert_eq!(u.id.as_deref(), Some("outer"));
        // A string value equal to a key name is not a key.
        let u = scan(br#"{"a":"prompt_tokens","b":7}"#);
        assert_eq!(u.prompt_tokens, None);
    }

    #[test]
    fn bounds_and_bad_values() {
        let long = format!(
            r#"{{"id":"{}","usage":{{"cached_tokens":5}}}}"#,
            "x".repeat(MAX_ID + 1)
        );
        let u = scan(long.as_bytes());
        assert_eq!((u.id, u.cached_tokens), (None, Some(5)));
        let exact = format!(r#"{{"id":"{}"}}"#, "y".repeat(MAX_ID));
        assert_eq!(scan(exact.as_bytes()).id.map(|s| s.len()), Some(MAX_ID));
        // Escaped ids are refused; overflowing, negative and non-numeric values ignored.
        let u = scan(br#"{"id":"a\"b","cached_tokens":99999999999999999999999,"prompt_tokens":-3,"cache_n":null,"prompt_n":"7"}"#);
        assert_eq!(u, Usage::default());
        // A number at the very end of the data counts; a fraction keeps its integer part.
        assert_eq!(scan(br#"{"cached_tokens":12"#).cached_tokens, Some(12));
        assert_eq!(scan(br#"{"cached_tokens":12.0}"#).cached_tokens, Some(12));
        // Last value wins (the usage chunk comes last).
        assert_eq!(
            scan(b"data: {\"cached_tokens\":1}\n\ndata: {\"cached_tokens\":2}\n\n").cached(),
            Some(2)
        );
        // An event cut inside a string does not spoil the next one.
        let u = scan(
            b"data: {\"id\":\"abc\n\ndata: {\"id\":\"def\",\"usage\":{\"cached_tokens\":3}}\n\n",
        );
        assert_eq!((u.id.as_deref(), u.cached_tokens), (Some("def"), Some(3)));
        assert_eq!(scan(b"").id, None);
    }

    #[test]
    fn surprises() {
        let hit = Prediction {
            cached_tokens: 1000.0,
            prompt_tokens: 1100.0,
        };
        let miss = Prediction {
            cached_tokens: 0.0,
            prompt_tokens: 1100.0,
        };
        assert_eq!(compare(&hit, 990, Some(1100), 64.0, 0.2), Surprise::None);
        assert_eq!(compare(&hit, 500, Some(1100), 64.0, 0.2), Surprise::None);
        assert_eq!(
            compare(&hit, 3, Some(1100), 64.0, 0.2),
            Surprise::ExpectedHitGotMiss
        );
        assert_eq!(compare(&miss, 3, Some(1100), 64.0, 0.2), Surprise::None);
        // Below min_share of the prompt: not a hit.
        assert_eq!(compare(&miss, 200, Some(1100), 64.0, 0.2), Surprise::None);
        assert_eq!(
            compare(&miss, 900, Some(1100), 64.0, 0.2),
            Surprise::ExpectedMissGotHit
        );
        // Without the engine's prompt count the estimate is used.
        assert_eq!(
            compare(&miss, 900, None, 64.0, 0.2),
            Surprise::ExpectedMissGotHit
        );
        assert_eq!(
            Surprise::ExpectedHitGotMiss.as_str(),
            "expected_hit_got_miss"
        );
    }

    #[test]
    fn prediction_adds_half_a_block_inside_the_prompt() {
        assert_eq!(predict(1472.0, 23, 24, 64.0, 1518.0), 1504.0);
        assert_eq!(
            predict(1472.0, 23, 23, 64.0, 1518.0),
            1472.0,
            "whole prompt known"
        );
        assert_eq!(predict(0.0, 0, 24, 64.0, 1518.0), 0.0);
        assert_eq!(
            predict(1500.0, 23, 24, 64.0, 1510.0),
            1510.0,
            "capped by the prompt"
        );
    }
}
