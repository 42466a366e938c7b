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
//! **Skipping** (after the response id is known): the id is the first key of
//! an OpenAI-style answer, and what is left to find are the numeric keys,
//! which all end in `_tokens"` or `_n"` (`cached_tokens`, `prompt_tokens`,
//! `input_tokens`, `cache_n`, `prompt_n`). So whenever the tokenizer is
//! between tokens (not in a string, no key or value pending) it stops
//! tokenizing and searches ([`crate::bytescan::find`], 64 bytes per step) for
//! the next `_` that ends one of those names, preceded by a `"` that is not
//! escaped (an even number of `\` before it); it resumes the tokenizer at
//! that `"`, which reads the key, its `:` and its value as before, then skips
//! again. On JSON text (and SSE events of JSON, cut events included) this
//! finds exactly what tokenizing finds: outside strings JSON has no `\`,
//! an unescaped `"` followed by a name and `"` opens a string (closing one
//! there would leave a bare name after a string: not JSON), and the
//! tokenizer still decides whether that string is a key (a `:` follows) and
//! reads the number. Depth, which only the id needs, is not tracked while
//! skipping. A name cut by a chunk boundary is found with the last
//! [`TAIL`] bytes of the previous chunk (a quote whose run of `\` reaches
//! past them counts as escaped; none are kept after a chunk that ends with
//! a newline). While
//! skipping with nothing kept, the SSE whole-event pass-over still applies.
//! The bench's 230-byte chat answer: 4.6k native instructions tokenized,
//! 2.1k skipping; the filter's response-body callback 11.4k → 7.1k wasm
//! instructions (`scripts/cost-adapter.sh`).
//!
//! [`compare`] turns a prediction and a delivery into a [`Surprise`].

/// Longest key kept (longer keys are not interesting).
pub const MAX_KEY: usize = 16;
/// Longest response id kept; a longer id is ignored.
pub const MAX_ID: usize = 64;
/// Bytes of the previous chunk kept while skipping (a key name cut by the
/// chunk boundary: `"` + 6 letters + `_tokens"`, and the `\` before it).
pub const TAIL: usize = 32;

/// What a `_` found while skipping is.
enum Candidate {
    /// Not the end of a wanted key name.
    No,
    /// A wanted key whose opening `"` is at this position.
    Key(isize),
    /// Maybe: the name goes on past the data (decided with the next chunk).
    Later,
}

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
    /// Skipping is allowed (see the module docs; off only in tests, as the
    /// reference the skipping scanner is checked against).
    fast: bool,
    /// The last bytes of the previous chunk, kept while skipping.
    tail: [u8; TAIL],
    tail_len: usize,
    /// The kept tail starts where skipping started (between tokens), not
    /// cut to [`TAIL`] bytes.
    tail_whole: bool,
    /// Tokenizer loop steps (tests: skipping must skip).
    #[cfg(test)]
    steps: u64,
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
            fast: true,
            tail: [0; TAIL],
            tail_len: 0,
            tail_whole: true,
            #[cfg(test)]
            steps: 0,
        }
    }

    /// A scanner that never skips (the reference of the tests).
    #[cfg(test)]
    fn tokenizing(sse: bool) -> UsageScanner {
        UsageScanner {
            sse,
            fast: false,
            ..UsageScanner::new()
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
        // (Skipping with nothing kept starts between tokens too.)
        if self.sse
            && self.usage.id.is_some()
            && chunk.ends_with(b"\n\n")
            && (self.between_events() || (self.skipping() && self.tail_len == 0))
            && !may_hold_usage(chunk)
        {
            return;
        }
        self.run(chunk);
    }

    /// The scan of one chunk (tokenizing, and skipping when allowed).
    fn run(&mut self, chunk: &[u8]) {
        let mut i = 0;
        let mut start = true;
        loop {
            if self.skipping() {
                match self.skip(chunk, i, start) {
                    Some(next) => i = next,
                    None => return,
                }
            }
            start = false;
            if i >= chunk.len() {
                break;
            }
            #[cfg(test)]
            {
                self.steps += 1;
            }
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

    /// May the scanner skip now? (The id is known and nothing is pending.)
    fn skipping(&self) -> bool {
        self.fast
            && self.usage.id.is_some()
            && !self.in_string
            && self.pending.is_none()
            && self.expect.is_none()
            && self.number.is_none()
    }

    /// Skip from `chunk[from]` to the opening `"` of the next wanted key
    /// (see the module docs); `start`: `from` is the chunk's start, so the
    /// kept tail of the previous chunk is searched first. Returns where the
    /// tokenizer resumes (the tail's part of a cut key is fed to it first),
    /// or `None` if the chunk holds no wanted key (its last bytes are kept).
    fn skip(&mut self, chunk: &[u8], from: usize, start: bool) -> Option<usize> {
        // Positions are relative to the chunk; the tail is at −tail_len..0.
        let lo = if start {
            -(self.tail_len as isize)
        } else {
            from as isize
        };
        // Is the byte before `lo` between tokens (a run of `\` ends there)?
        let clean = !start || self.tail_whole;
        let mut c = lo;
        let found = loop {
            let next = if c < 0 {
                let t = (c + self.tail_len as isize) as usize;
                match self
                    .tail
                    .get(t..self.tail_len)
                    .and_then(|r| r.iter().position(|&b| b == b'_'))
                {
                    Some(p) => Some(c + p as isize),
                    None => chunk
                        .get(from..)
                        .and_then(|r| find_any(r, [b'_']))
                        .map(|p| (from + p) as isize),
                }
            } else {
                let at = (c as usize).max(from);
                chunk
                    .get(at..)
                    .and_then(|r| find_any(r, [b'_']))
                    .map(|p| (at + p) as isize)
            };
            let Some(u) = next else { break None };
            match self.candidate(chunk, u, lo, clean) {
                Candidate::Key(q) => break Some(q),
                Candidate::No => c = u + 1,
                Candidate::Later => break None,
            }
        };
        match found {
            Some(q) if q < 0 => {
                // The key began in the previous chunk: feed its part, then go on.
                let t = (q + self.tail_len as isize) as usize;
                let (tail, n) = (self.tail, self.tail_len);
                self.tail_len = 0;
                self.tail_whole = true;
                if let Some(part) = tail.get(t..n) {
                    self.feed_tokens(part);
                }
                Some(0)
            }
            Some(q) => {
                self.tail_len = 0;
                self.tail_whole = true;
                Some(q as usize)
            }
            None => {
                self.keep_tail(chunk, if start { 0 } else { from }, start);
                None
            }
        }
    }

    /// Keep the last [`TAIL`] bytes of (the kept tail, if `start`, then)
    /// `chunk[from..]`; nothing if the chunk ends with a newline: a key name
    /// and the `\` before its quote never span a raw newline (JSON strings
    /// hold none), and after one the scan is between tokens (an SSE event
    /// ends with one).
    fn keep_tail(&mut self, chunk: &[u8], from: usize, start: bool) {
        let new = chunk.get(from..).unwrap_or(&[]);
        if new.last() == Some(&b'\n') {
            self.tail_len = 0;
            self.tail_whole = true;
            return;
        }
        let old = if start { self.tail_len } else { 0 };
        let keep_old = TAIL.saturating_sub(new.len()).min(old);
        let whole_before = !start || (self.tail_whole && keep_old == old);
        let new_kept = new.get(new.len().saturating_sub(TAIL)..).unwrap_or(&[]);
        if keep_old > 0 {
            self.tail.copy_within(old - keep_old..old, 0);
        }
        let n = keep_old + new_kept.len();
        if let Some(dst) = self.tail.get_mut(keep_old..n) {
            dst.copy_from_slice(new_kept);
        }
        self.tail_len = n.min(TAIL);
        self.tail_whole = whole_before && keep_old + new.len() <= TAIL;
    }

    /// Is the `_` at `u` the end of a wanted key name? Bytes below `lo` are
    /// unknown; `clean`: the byte before `lo` is between tokens (so a run
    /// of `\` that reaches `lo` ends there).
    fn candidate(&self, chunk: &[u8], u: isize, lo: isize, clean: bool) -> Candidate {
        let at = |i: isize| -> Option<u8> {
            if i < lo {
                None
            } else if i >= 0 {
                chunk.get(i as usize).copied()
            } else {
                self.tail
                    .get((i + self.tail_len as isize) as usize)
                    .copied()
            }
        };
        // The names by the bytes around the `_` (most `_` fail here).
        const TOKENS: [&[u8]; 3] = [b"cached", b"prompt", b"input"];
        const N: [&[u8]; 2] = [b"cache", b"prompt"];
        let (names, suffix): (&[&[u8]], &[u8]) = match (at(u - 1), at(u + 1)) {
            (Some(b'd' | b't'), Some(b't') | None) => (&TOKENS, b"tokens\""),
            (Some(b'e' | b't'), Some(b'n') | None) => (&N, b"n\""),
            _ => return Candidate::No,
        };
        let mut later = false;
        for &name in names {
            let n = name.len() as isize;
            let named = (0..n).all(|j| at(u - n + j) == name.get(j as usize).copied());
            if !named || at(u - n - 1) != Some(b'"') {
                continue;
            }
            let mut cut = false;
            let mut ends = true;
            for (j, &x) in suffix.iter().enumerate() {
                match at(u + 1 + j as isize) {
                    Some(y) if y == x => {}
                    Some(_) => {
                        ends = false;
                        break;
                    }
                    None => {
                        cut = true;
                        break;
                    }
                }
            }
            if cut {
                later = true;
                continue;
            }
            if !ends {
                continue;
            }
            // An even run of `\` before the quote (unknown bytes: escaped).
            let q = u - n - 1;
            let mut k = q - 1;
            let escaped = loop {
                match at(k) {
                    Some(b'\\') => k -= 1,
                    Some(_) => break (q - 1 - k) % 2 == 1,
                    None => break !clean || (q - 1 - k) % 2 == 1,
                }
            };
            if !escaped {
                return Candidate::Key(q);
            }
        }
        if later {
            Candidate::Later
        } else {
            Candidate::No
        }
    }

    /// Tokenize `bytes` (a key's first part kept from the previous chunk),
    /// never skipping.
    fn feed_tokens(&mut self, bytes: &[u8]) {
        let fast = self.fast;
        self.fast = false;
        self.run(bytes);
        self.fast = fast;
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

    /// Bodies where skipping could go wrong: names cut anywhere, in string
    /// values (escaped quotes, runs of `\\` before a quote), nested, in SSE.
    const TRICKY: [&str; 9] = [
        r#"{"id":"a","x":"say \"cached_tokens\": 9","usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":8}}}"#,
        r#"{"id":"a","x":"\\","cached_tokens":4,"y":"\\\"cached_tokens\":5","prompt_n":2}"#,
        r#"{"id":"a","x":"\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\","cached_tokens":6}"#,
        r#"{"id":"a","x":"\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"cached_tokens\":7"}"#,
        r#"{"id":"a","usage":{"a":{"b":[{"cached_tokens":1}]},"cached_tokens":2,"cache_n":3,"note":"prompt_tokens","prompt_tokens":[4],"input_tokens":"5"}}"#,
        r#"{"id":"a","cached_tokens" : 10 ,"prompt_tokens":11,"xcached_tokens":12,"cached_tokensx":13,"_n":1,"prompt_":2}"#,
        "data: {\"id\":\"s\",\"choices\":[{\"delta\":{\"content\":\"a_b\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"cut \\\"prompt_tokens\n\ndata: {\"usage\":{\"prompt_tokens\":21,\"cached_tokens\":20}}\n\ndata: [DONE]\n\n",
        "data: {\"id\":\"s\"}\n\ndata: {\"x\":\"unterminated cached_tokens\":3\n\ndata: {\"cached_tokens\":30}\n\n",
        r#"{"id":"a","choices":[{"message":{"content":"{\"usage\":{\"cached_tokens\":99}}"}}],"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}"#,
    ];

    #[test]
    fn skipping_finds_what_tokenizing_finds_at_every_split_point() {
        let samples = [VLLM_JSON, SSE, LLAMA, PRETTY, RESPONSES_SSE]
            .into_iter()
            .chain(TRICKY);
        for sample in samples {
            let b = sample.as_bytes();
            let mut reference = UsageScanner::tokenizing(false);
            reference.feed(b);
            let want = reference.usage();
            for sse in [false, true] {
                let mut whole = if sse {
                    UsageScanner::sse()
                } else {
                    UsageScanner::new()
                };
                whole.feed(b);
                assert_eq!(whole.usage(), want, "{sample}");
                for cut in 0..=b.len() {
                    for cut2 in [cut, (cut + 5).min(b.len()), (cut + 40).min(b.len())] {
                        let mut s = if sse {
                            UsageScanner::sse()
                        } else {
                            UsageScanner::new()
                        };
                        s.feed(&b[..cut]);
                        s.feed(&b[cut..cut2]);
                        s.feed(&b[cut2..]);
                        assert_eq!(s.usage(), want, "cuts at {cut}, {cut2}: {sample}");
                    }
                }
                let mut s = UsageScanner::new();
                for byte in b {
                    s.feed(std::slice::from_ref(byte));
                }
                assert_eq!(s.usage(), want, "byte by byte: {sample}");
            }
        }
        // What the tricky bodies hold (the reference is right, not only equal).
        let got: Vec<_> = TRICKY.iter().map(|t| scan(t.as_bytes())).collect();
        let cached: Vec<_> = got.iter().map(|u| u.cached_tokens).collect();
        assert_eq!(
            cached,
            [8, 4, 6, 0, 2, 10, 20, 30, 32].map(|c| (c > 0).then_some(c))
        );
        assert_eq!(got[0].prompt_tokens, Some(12));
        assert_eq!((got[1].prompt_n, got[4].cache_n), (Some(2), Some(3)));
        assert_eq!((got[4].prompt_tokens, got[4].input_tokens), (None, None));
        assert_eq!(
            (got[5].prompt_tokens, got[6].prompt_tokens),
            (Some(11), Some(21))
        );
    }

    #[test]
    fn skipping_tokenizes_only_the_wanted_keys() {
        // The bench upstream's answer: after the id, only the usage keys
        // are tokenized (the rest is searched), and the result is the same.
        let body = br#"{"id":"bench","object":"chat.completion","model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
        let (mut fast, mut slow) = (UsageScanner::new(), UsageScanner::tokenizing(false));
        fast.feed(body);
        slow.feed(body);
        assert_eq!(fast.usage(), slow.usage());
        assert_eq!(fast.usage().prompt_tokens, Some(1));
        assert!(
            fast.steps * 4 < slow.steps,
            "tokenizer steps: {} skipping, {} not",
            fast.steps,
            slow.steps
        );
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
