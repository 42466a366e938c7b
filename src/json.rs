//! A zero-copy JSON scanner for request bodies.
//!
//! Why not serde_json here: routing needs a handful of top-level fields and
//! the first `prefix_length` characters of the prompt text, not a parsed
//! document. serde_json would unescape every string (a second copy of the
//! text) and walk nested values once per nesting level. This scanner makes one
//! pass over the body to find the top-level fields (checking that the
//! document is structurally sound: balanced brackets, terminated strings,
//! colons and commas in place, nothing after the end), then streams only the
//! chosen fields' text, unescaping on the fly, and stops as soon as the prefix
//! budget is spent.
//!
//! Cost: one linear scan of the body plus O(prefix) for the text; no
//! allocation proportional to the body. Nesting is bounded by [`MAX_DEPTH`].
//!
//! Leniency: literals and numbers are checked by their character class only,
//! and invalid UTF-8 inside strings is passed through as bytes (validating it
//! would cost another pass over the body; the engine refuses such a body). A body this
//! scanner accepts but a strict parser would refuse still gets routed (the
//! engine answers it), which is the behaviour we want.

use crate::hash::PrefixHasher;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 128;

/// Why a body is not acceptable JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntaxError {
    /// Byte offset where scanning stopped.
    pub offset: usize,
    /// What was expected.
    pub expected: &'static str,
}

impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "malformed JSON at byte {}: expected {}",
            self.offset, self.expected
        )
    }
}

type Result<T> = std::result::Result<T, SyntaxError>;

/// Cursor over a JSON text.
pub struct Scanner<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    /// Scanner at the start of `b`.
    pub fn new(b: &'a [u8]) -> Scanner<'a> {
        Scanner { b, pos: 0 }
    }

    fn err<T>(&self, expected: &'static str) -> Result<T> {
        Err(SyntaxError {
            offset: self.pos,
            expected,
        })
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8, expected: &'static str) -> Result<()> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            self.err(expected)
        }
    }

    /// Raw contents of a string (escapes left in), cursor after the closing quote.
    fn string_raw(&mut self) -> Result<&'a [u8]> {
        self.eat(b'"', "a string")?;
        let start = self.pos;
        self.string_rest()?;
        Ok(&self.b[start..self.pos - 1])
    }

    /// Finish a string whose opening quote is consumed: cursor after the
    /// closing quote; escapes and control bytes checked.
    fn string_rest(&mut self) -> Result<()> {
        loop {
            let Some(i) = find_special(&self.b[self.pos..]) else {
                self.pos = self.b.len();
                return self.err("a closing quote");
            };
            self.pos += i;
            match self.b[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => match escape_len(&self.b[self.pos..]) {
                    Some(n) => self.pos += n.min(2),
                    None => {
                        self.pos += 1;
                        return self.err(BAD_ESCAPE);
                    }
                },
                _ => return self.err("no control character in a string"),
            }
        }
    }

    /// Skip one value of any kind, checking its structure. Iterative: nesting
    /// is tracked with a small stack of container kinds.
    pub fn skip_value(&mut self) -> Result<()> {
        let mut stack: Vec<u8> = Vec::new();
        loop {
            // A value.
            match self.peek() {
                Some(b'"') => {
                    self.string_raw()?;
                }
                Some(open @ (b'{' | b'[')) => {
                    self.pos += 1;
                    if stack.len() >= MAX_DEPTH {
                        return self.err("less nesting");
                    }
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.pos += 1;
                    } else {
                        stack.push(close);
                        if open == b'{' {
                            self.string_raw()?;
                            self.eat(b':', "':'")?;
                        }
                        continue;
                    }
                }
                Some(c) if c == b'-' || c.is_ascii_alphanumeric() => {
                    self.scalar_raw()?;
                }
                _ => return self.err("a value"),
            }
            // After a value: close containers or move to the next member.
            loop {
                let Some(&close) = stack.last() else {
                    return Ok(());
                };
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if close == b'}' {
                            self.string_raw()?;
                            self.eat(b':', "':'")?;
                        }
                        break;
                    }
                    Some(c) if c == close => {
                        self.pos += 1;
                        stack.pop();
                    }
                    _ => return self.err("',' or a closing bracket"),
                }
            }
        }
    }

    /// A number or literal: its raw text.
    fn scalar_raw(&mut self) -> Result<&'a [u8]> {
        self.ws();
        let start = self.pos;
        while let Some(&c) = self.b.get(self.pos) {
            if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.') {
                self.pos += 1;
            } else {
                break;
            }
        }
        let raw = &self.b[start..self.pos];
        let ok = matches!(raw, b"true" | b"false" | b"null")
            || (!raw.is_empty()
                && raw
                    .iter()
                    .all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E')));
        if ok {
            Ok(raw)
        } else {
            self.pos = start;
            self.err("a number or literal")
        }
    }

    /// Raw text of the next value, cursor after it.
    pub fn value_raw(&mut self) -> Result<&'a [u8]> {
        self.ws();
        let start = self.pos;
        self.skip_value()?;
        Ok(&self.b[start..self.pos])
    }

    /// Visit the members of a top-level object: `f(raw key, raw value)`.
    /// Checks that nothing but whitespace follows the object.
    pub fn object_members(&mut self, f: impl FnMut(&'a [u8], &'a [u8])) -> Result<()> {
        self.object_members_walking(None, f).map(|_| ())
    }

    /// [`Scanner::object_members`], except that a member named `walk.0` is
    /// hashed into `walk.1` while it is validated ([`walk_text`]'s rules, one
    /// pass instead of a skip and a walk). Duplicates follow Python's `json`
    /// (what vLLM and SGLang parse with): the last one wins, so a later member
    /// of that name restarts the hasher. Keys are compared unescaped
    /// (`"m\u0065ssages"` is `messages`). Returns whether that member was seen.
    pub fn object_members_walking(
        &mut self,
        mut walk: Option<(&[u8], &mut PrefixHasher)>,
        mut f: impl FnMut(&'a [u8], &'a [u8]),
    ) -> Result<bool> {
        let mut walked = false;
        self.eat(b'{', "'{'")?;
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                let key = self.string_raw()?;
                self.eat(b':', "':'")?;
                let value = match walk.as_mut() {
                    Some((name, h)) if key_position(key, &[*name]).is_some() => {
                        if walked {
                            h.restart();
                        }
                        walked = true;
                        self.ws();
                        let start = self.pos;
                        self::walk(self, h, ELEMENT_END, 0)?;
                        &self.b[start..self.pos]
                    }
                    _ => self.value_raw()?,
                };
                f(key, value);
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return self.err("',' or '}'"),
                }
            }
        }
        if self.peek().is_some() {
            return self.err("the end of the body");
        }
        Ok(walked)
    }
}

/// Index in `names` of a raw key (escapes left in). The raw bytes are
/// compared first (all real traffic: the names have no backslash, so a raw
/// match is the decoded match); only a key that matched none and holds a
/// backslash is decoded into a small stack buffer and compared again (a
/// decoded key longer than any name matches none). No allocation either way;
/// a plain key costs the comparisons alone (no search for a backslash first).
pub fn key_position(raw: &[u8], names: &[&[u8]]) -> Option<usize> {
    if let Some(i) = names.iter().position(|n| short_eq(n, raw)) {
        return Some(i);
    }
    if !raw.contains(&b'\\') {
        return None;
    }
    let mut buf = [0u8; 32];
    let mut len = 0;
    let ended = for_each_piece(raw, |piece| {
        let Some(dst) = buf.get_mut(len..len + piece.len()) else {
            return false;
        };
        dst.copy_from_slice(piece);
        len += piece.len();
        true
    });
    if matches!(ended, Pieces::Stopped(_)) {
        return None;
    }
    let key = buf.get(..len)?;
    names.iter().position(|n| *n == key)
}

/// `a == b` for field names: lengths first, then (up to 16 bytes, every
/// name here) two overlapping little-endian words of each, compared inline;
/// longer slices by the library's comparison. In wasm the library's
/// comparison is a call to a byte loop (~10 instructions a byte), and
/// every key of a body is compared with up to 11 names.
#[inline]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let half = |s: &[u8], at: usize| -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_le_bytes(w)
    };
    match n {
        0..=3 => a == b,
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}

/// Unescape a raw JSON string's contents into a `String` (short fields only).
pub fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let _ = for_each_piece(raw, |piece| {
        out.extend_from_slice(piece);
        true
    });
    String::from_utf8_lossy(&out).into_owned()
}

const BAD_ESCAPE: &str = "a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)";

/// Length of the valid escape starting at `s[0] == '\\'` (2, or 6 for `\\uXXXX`).
fn escape_len(s: &[u8]) -> Option<usize> {
    match s.get(1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(2),
        b'u' => s
            .get(2..6)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .map(|_| 6),
        _ => None,
    }
}

/// Where [`for_each_piece`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pieces {
    /// At the closing quote, at this index.
    Quote(usize),
    /// `f` asked to stop; everything before this index was handed over, and
    /// the index is at a character or escape boundary.
    Stopped(usize),
    /// A control byte, an invalid escape, or the end of the input.
    Bad,
}

/// Call `f` with the unescaped contents of a JSON string body, in pieces.
/// Runs to the first unescaped `"` (returns its index) or the end of `raw`, or
/// until `f` returns false (returns `None`).
///
/// Escapes split the text into short runs; to keep the per-call overhead of
/// `f` off the per-escape path, runs and decoded characters are gathered in a
/// 1 KiB stack buffer and handed over when it fills (long runs go straight
/// through). Pieces never split a character. Cost: O(bytes visited), SWAR scan.
fn for_each_piece(raw: &[u8], f: impl FnMut(&[u8]) -> bool) -> Pieces {
    for_each_piece_or_plain(raw, &mut Unescaped(f))
}

/// Where [`for_each_piece_or_plain`] hands the text of a string.
trait TextSink {
    /// Take a prefix of `raw`, the string's raw bytes from the current
    /// position, if it is plain (no `"`, `\\` or control byte: the text
    /// itself); how many bytes were taken (they count as handed over).
    fn plain(&mut self, raw: &[u8]) -> usize;
    /// Take one unescaped piece; false = stop.
    fn piece(&mut self, piece: &[u8]) -> bool;
}

/// A sink of unescaped pieces only.
struct Unescaped<F>(F);

impl<F: FnMut(&[u8]) -> bool> TextSink for Unescaped<F> {
    fn plain(&mut self, _raw: &[u8]) -> usize {
        0
    }
    fn piece(&mut self, piece: &[u8]) -> bool {
        (self.0)(piece)
    }
}

/// The prompt hasher as a sink: whole plain blocks straight from the body
/// ([`PrefixHasher::push_plain_blocks`]), the rest unescaped.
impl TextSink for PrefixHasher {
    fn plain(&mut self, raw: &[u8]) -> usize {
        self.push_plain_blocks(raw)
    }
    fn piece(&mut self, piece: &[u8]) -> bool {
        self.push_utf8(piece);
        !self.is_full()
    }
}

/// [`for_each_piece`], offering `sink` the raw bytes first wherever nothing
/// is buffered (at the start and after each hand-over) with
/// [`TextSink::plain`].
fn for_each_piece_or_plain<S: TextSink>(raw: &[u8], sink: &mut S) -> Pieces {
    let mut buf = Scratch::new();
    let mut i = 0;
    // Hand the buffer over; false = stop.
    let flush = |buf: &mut Scratch, sink: &mut S| -> bool {
        let go = buf.is_empty() || sink.piece(buf.bytes());
        buf.clear();
        go
    };
    while i < raw.len() {
        if buf.is_empty() {
            i += sink.plain(&raw[i..]);
        }
        let run = find_special(&raw[i..]).unwrap_or(raw.len() - i);
        if run > 0 {
            let piece = &raw[i..i + run];
            if buf.is_empty() && raw.get(i + run) == Some(&b'"') {
                // The rest of the string has no escape and nothing is
                // buffered: hand it over from the body, without the copy.
                return if sink.piece(piece) {
                    Pieces::Quote(i + run)
                } else {
                    Pieces::Stopped(i + run)
                };
            }
            if run <= buf.room() {
                buf.push(piece);
            } else if !flush(&mut buf, sink) {
                return Pieces::Stopped(i);
            } else if !sink.piece(piece) {
                return Pieces::Stopped(i + run);
            }
        }
        i += run;
        match raw.get(i) {
            Some(b'\\') => {}
            Some(b'"') => {
                return if flush(&mut buf, sink) {
                    Pieces::Quote(i)
                } else {
                    Pieces::Stopped(i)
                };
            }
            // The end (what was decoded is handed over) or a control byte.
            None => {
                flush(&mut buf, sink);
                return Pieces::Bad;
            }
            _ => return Pieces::Bad,
        }
        let Some(used) = escape_len(&raw[i..]) else {
            flush(&mut buf, sink);
            return Pieces::Bad;
        };
        let (ch, used) = match raw[i + 1] {
            b'n' => ('\n', used),
            b't' => ('\t', used),
            b'r' => ('\r', used),
            b'b' => ('\u{8}', used),
            b'f' => ('\u{c}', used),
            b'u' => decode_u(&raw[i..]),
            other => (char::from(other), used),
        };
        if buf.room() < 4 && !flush(&mut buf, sink) {
            return Pieces::Stopped(i);
        }
        buf.push(ch.encode_utf8(&mut [0u8; 4]).as_bytes());
        i += used;
    }
    // The end without a closing quote: hand over what was decoded.
    flush(&mut buf, sink);
    Pieces::Bad
}

/// The 1 KiB stack buffer of [`for_each_piece_or_plain`], filled from the
/// front and never zeroed: only its first `len` bytes (all written by
/// [`Scratch::push`]) are ever read. Zeroing 1 KiB per string walked (the
/// former `[0u8; 1024]`) was a `memory.fill` per message: one wasm
/// instruction, but a 1 KiB memset in the engine every time.
struct Scratch {
    buf: [std::mem::MaybeUninit<u8>; Scratch::CAP],
    len: usize,
}

impl Scratch {
    const CAP: usize = 1024;

    #[inline(always)]
    fn new() -> Scratch {
        Scratch {
            buf: [std::mem::MaybeUninit::uninit(); Scratch::CAP],
            len: 0,
        }
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes that still fit.
    #[inline(always)]
    fn room(&self) -> usize {
        Scratch::CAP - self.len
    }

    /// Append `b`, which must fit ([`Scratch::room`]: the callers check).
    #[inline(always)]
    fn push(&mut self, b: &[u8]) {
        let dst = &mut self.buf[self.len..self.len + b.len()];
        // SAFETY: `dst` is `b.len()` bytes of this buffer (bounds checked
        // by the slice above), `b` is another object: the copy stays in
        // bounds and does not overlap. `MaybeUninit<u8>` has `u8`'s layout.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), dst.as_mut_ptr().cast::<u8>(), b.len());
        }
        self.len += b.len();
    }

    /// The bytes pushed since the last [`Scratch::clear`].
    #[inline(always)]
    fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were all written by `push` (and
        // `len ≤ CAP`), and `MaybeUninit<u8>` has `u8`'s layout.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.len) }
    }

    #[inline(always)]
    fn clear(&mut self) {
        self.len = 0;
    }
}

/// Index of the first `"`, `\` or control byte (< 0x20) in `b`: the first
/// sixteen bytes alone, then 64 per step with SIMD
/// ([`crate::bytescan::find_near`]).
#[inline]
fn find_special(b: &[u8]) -> Option<usize> {
    crate::bytescan::find_near(b, [b'"', b'\\'], 0x20)
}

/// Decode `\uXXXX` (and a following low surrogate); bad input → U+FFFD.
fn decode_u(s: &[u8]) -> (char, usize) {
    let hex = |b: &[u8]| -> Option<u32> {
        let t = std::str::from_utf8(b.get(..4)?).ok()?;
        u32::from_str_radix(t, 16).ok()
    };
    let Some(hi) = s.get(2..).and_then(hex) else {
        return ('\u{fffd}', s.len().min(6));
    };
    if (0xD800..0xDC00).contains(&hi) && s.get(6..8) == Some(b"\\u") {
        if let Some(lo) = s
            .get(8..)
            .and_then(hex)
            .filter(|lo| (0xDC00..0xE000).contains(lo))
        {
            let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
            return (char::from_u32(c).unwrap_or('\u{fffd}'), 12);
        }
    }
    (char::from_u32(hi).unwrap_or('\u{fffd}'), 6)
}

/// Separator after each element of a top-level array (messages, prompts,
/// items); it ends the element's last hash block ([`PrefixHasher::end_element`]).
pub const ELEMENT_END: &[u8] = b"\x1e";

/// Object fields walked inside prompt values: the first [`TEXT_FIELDS`] are
/// prompt text; the rest hold media references, hashed as uncounted markers
/// ([`media_digest`]). At most 32 (a bit mask tracks duplicates).
const PROMPT_FIELDS: &[&[u8]] = &[
    b"content",
    b"text",
    b"output",
    b"input",
    b"image_url",
    b"input_audio",
    b"file",
    b"image",
    b"audio",
    b"video_url",
    b"file_id",
];
/// How many of [`PROMPT_FIELDS`] are text.
const TEXT_FIELDS: usize = 4;

/// Feed the prompt text of an already-validated raw value into `h`:
/// strings → text; integers → their digits (token ids); arrays → each element,
/// followed by `element_end`, which also closes the hash block after a string,
/// array or object element (a message, an item, a prompt: see
/// [`PrefixHasher::end_element`]) but not after a token id; objects → their text fields (media fields as
/// markers). Stops hashing as soon as the budget is spent.
///
/// # Errors
/// The value was validated by `skip_value` already; the only error left is a
/// prompt field repeated inside one object ([`walk`]).
pub fn walk_text(raw: &[u8], h: &mut PrefixHasher, element_end: &[u8]) -> Result<()> {
    walk(&mut Scanner::new(raw), h, element_end, 0)
}

/// Walk one value, feeding its text into `h` while the budget lasts, and
/// validating all of it either way (as [`Scanner::skip_value`] would): the
/// cursor ends after the value. Once the budget is spent the rest is skipped.
///
/// A prompt field ([`PROMPT_FIELDS`]) repeated inside one object is an error:
/// Python's `json` keeps the last one, but the first has been hashed already
/// and the walk is a single pass, so such a body routes as `bad_input` (still
/// served). A 32-bit mask per object frame tracks the fields seen.
fn walk(s: &mut Scanner<'_>, h: &mut PrefixHasher, element_end: &[u8], depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return s.err("less nesting");
    }
    if h.is_full() {
        return s.skip_value();
    }
    match s.peek() {
        Some(b'"') => {
            // Hash up to the budget; validate the rest without hashing.
            s.pos += 1;
            // Whole blocks of plain text are hashed straight from the body
            // (one pass); the rest is unescaped piece by piece.
            match for_each_piece_or_plain(&s.b[s.pos..], h) {
                Pieces::Quote(q) => s.pos += q + 1,
                Pieces::Stopped(at) => {
                    s.pos += at;
                    s.string_rest()?;
                }
                Pieces::Bad => return s.string_rest(),
            }
        }
        Some(open @ (b'[' | b'{')) => {
            s.pos += 1;
            let close = if open == b'[' { b']' } else { b'}' };
            if s.peek() == Some(close) {
                s.pos += 1;
                return Ok(());
            }
            let mut seen = 0u32;
            loop {
                if open == b'[' {
                    // A message, item or prompt closes its block with its
                    // end (`PrefixHasher::end_element`); a token id is one
                    // word of its prompt and only gets the marker.
                    let scalar = !matches!(s.peek(), Some(b'"' | b'[' | b'{'));
                    walk(s, h, b"", depth + 1)?;
                    if scalar || element_end.is_empty() {
                        h.push_marker(element_end);
                    } else {
                        h.end_element(element_end);
                    }
                } else {
                    let key = s.string_raw()?;
                    s.eat(b':', "':'")?;
                    match key_position(key, PROMPT_FIELDS) {
                        Some(i) if seen & (1 << i) != 0 => {
                            return s.err("no repeated prompt field in an object");
                        }
                        Some(i) => {
                            seen |= 1 << i;
                            if i < TEXT_FIELDS {
                                walk(s, h, b"", depth + 1)?;
                            } else {
                                let d = media_digest(s, depth + 1)?;
                                h.push_marker(&d.to_le_bytes());
                            }
                        }
                        None => s.skip_value()?,
                    }
                }
                match s.peek() {
                    Some(b',') => s.pos += 1,
                    Some(c) if c == close => {
                        s.pos += 1;
                        return Ok(());
                    }
                    _ => return s.err("',' or a closing bracket"),
                }
            }
        }
        Some(_) => {
            let raw = s.scalar_raw()?;
            if raw.iter().all(|c| c.is_ascii_digit() || *c == b'-') {
                h.push_utf8(raw);
                h.push_marker(b" ");
            }
        }
        None => return s.err("a value"),
    }
    Ok(())
}

/// Digest of a media value (image URL or data URI, audio, file id…), the
/// same whatever its JSON spelling: strings are hashed unescaped, whitespace
/// is ignored and an object's members are combined in an order-independent
/// way (a commutative sum of per-member hashes), arrays in order. Validates
/// the value as [`Scanner::skip_value`] would. Cost: one pass over the value
/// (xxh3 streams the string bytes); nothing copied, the marker is 8 bytes.
fn media_digest(s: &mut Scanner<'_>, depth: usize) -> Result<u64> {
    if depth > MAX_DEPTH {
        return s.err("less nesting");
    }
    match s.peek() {
        Some(b'"') => {
            s.pos += 1;
            let mut x = Xxh3::new();
            match for_each_piece(&s.b[s.pos..], |piece| {
                x.update(piece);
                true
            }) {
                Pieces::Quote(q) => s.pos += q + 1,
                _ => s.string_rest()?,
            }
            Ok(x.digest())
        }
        Some(open @ (b'[' | b'{')) => {
            s.pos += 1;
            let close = if open == b'[' { b']' } else { b'}' };
            let mut acc = u64::from(open);
            if s.peek() == Some(close) {
                s.pos += 1;
                return Ok(acc);
            }
            loop {
                if open == b'[' {
                    let v = media_digest(s, depth + 1)?;
                    acc = xxh3_64_with_seed(&v.to_le_bytes(), acc);
                } else {
                    if s.peek() != Some(b'"') {
                        return s.err("a string");
                    }
                    let k = media_digest(s, depth + 1)?;
                    s.eat(b':', "':'")?;
                    let v = media_digest(s, depth + 1)?;
                    acc = acc.wrapping_add(xxh3_64_with_seed(&v.to_le_bytes(), k));
                }
                match s.peek() {
                    Some(b',') => s.pos += 1,
                    Some(c) if c == close => {
                        s.pos += 1;
                        return Ok(acc);
                    }
                    _ => return s.err("',' or a closing bracket"),
                }
            }
        }
        Some(_) => Ok(xxh3_64_with_seed(s.scalar_raw()?, 1)),
        None => s.err("a value"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn valid(s: &str) -> bool {
        Scanner::new(s.as_bytes()).object_members(|_, _| {}).is_ok()
    }

    #[test]
    fn find_special_finds_quotes_backslashes_and_controls() {
        // The search itself is tested exhaustively in `bytescan`.
        assert_eq!(find_special(b"0123456789abcdef\\"), Some(16));
        assert_eq!(find_special(b"0123456789abcdef0123\"x"), Some(20));
        assert_eq!(find_special(b"ab\tc"), Some(2));
        assert_eq!(find_special("h\u{e9}llo \u{1f98a}".as_bytes()), None);
    }

    #[test]
    fn agrees_with_serde_on_structure() {
        for doc in [
            r#"{}"#,
            r#"{"a":1}"#,
            r#" { "a" : [1, 2.5e3, -3, true, false, null, "x\"y\\"], "b": {"c": {}} , "d":[]} "#,
            r#"{"a":"\u00e9\ud83e\udd8a"}"#,
            r#"{"a":1,}"#,
            r#"{"a":1"#,
            r#"{"a" 1}"#,
            r#"{"a":[1,2}"#,
            r#"{"a":"unterminated}"#,
            r#"{"a":1} trailing"#,
            r#"{"a":tru}"#,
            r#"{"a":[,]}"#,
            "{\"a\":\"tab\tinside\"}",
            r#"[1,2]"#,
            r#"{"a":{"b":1,"c"}}"#,
            r#"{"a":"bad \q escape"}"#,
            r#"{"a":"short \u12"}"#,
            r#"{"a":"ok \u12aF \/ \b"}"#,
        ] {
            let strict =
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(doc).is_ok();
            assert_eq!(valid(doc), strict, "{doc}");
        }
    }

    #[test]
    fn short_eq_is_slice_equality() {
        // Every length 0–20 and a difference at every position (both words
        // of the overlapping reads), against `==`.
        for n in 0..=20usize {
            let a: Vec<u8> = (0..n).map(|i| b'a' + (i * 5 % 26) as u8).collect();
            assert!(short_eq(&a, &a.clone()), "{n}");
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x20;
                assert_eq!(short_eq(&a, &b), a == b, "{n} at {at}");
                assert!(!short_eq(&a, &b));
            }
            if n > 0 {
                assert!(!short_eq(&a, &a[..n - 1]));
            }
        }
        assert_eq!(key_position(b"content", PROMPT_FIELDS), Some(0));
        assert_eq!(key_position(b"video_url", PROMPT_FIELDS), Some(9));
        assert_eq!(key_position(br"c\u006fntent", PROMPT_FIELDS), Some(0));
        assert_eq!(key_position(b"contents", PROMPT_FIELDS), None);
    }

    #[test]
    fn depth_is_bounded() {
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert!(!valid(&deep));
        let ok = format!("{{\"a\":{}1{}}}", "[".repeat(100), "]".repeat(100));
        assert!(valid(&ok));
    }

    #[test]
    fn unescapes() {
        assert_eq!(unescape(br#"a\nb\u00e9\"\\\/\ud83e\udd8a"#), "a\nbé\"\\/🦊");
        // Invalid escapes never reach `unescape` (the scanner refuses them
        // first); it keeps what precedes one.
        assert_eq!(unescape(br#"bad\u12"#), "bad");
    }
}
