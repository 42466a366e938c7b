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
        loop {
            match find_special(&self.b[self.pos..]) {
                None => {
                    self.pos = self.b.len();
                    return self.err("a closing quote");
                }
                Some(i) => {
                    self.pos += i;
                    match self.b[self.pos] {
                        b'"' => {
                            self.pos += 1;
                            return Ok(&self.b[start..self.pos - 1]);
                        }
                        b'\\' => {
                            let ok = match self.b.get(self.pos + 1) {
                                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                                    true
                                }
                                Some(b'u') => self
                                    .b
                                    .get(self.pos + 2..self.pos + 6)
                                    .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)),
                                _ => false,
                            };
                            if !ok {
                                self.pos += 1;
                                return self.err(
                                    "a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)",
                                );
                            }
                            self.pos += 2;
                        }
                        _ => return self.err("no control character in a string"),
                    }
                }
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
    pub fn object_members(&mut self, mut f: impl FnMut(&'a [u8], &'a [u8])) -> Result<()> {
        self.eat(b'{', "'{'")?;
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                let key = self.string_raw()?;
                self.eat(b':', "':'")?;
                let value = self.value_raw()?;
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
        Ok(())
    }
}

/// Unescape a raw JSON string's contents into a `String` (short fields only).
pub fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    for_each_piece(raw, |piece| {
        out.extend_from_slice(piece);
        true
    });
    String::from_utf8_lossy(&out).into_owned()
}

/// Call `f` with the unescaped contents of a JSON string body, in pieces.
/// Runs to the first unescaped `"` (returns its index) or the end of `raw`, or
/// until `f` returns false (returns `None`).
///
/// Escapes split the text into short runs; to keep the per-call overhead of
/// `f` off the per-escape path, runs and decoded characters are gathered in a
/// 1 KiB stack buffer and handed over when it fills (long runs go straight
/// through). Pieces never split a character. Cost: O(bytes visited), SWAR scan.
fn for_each_piece(raw: &[u8], mut f: impl FnMut(&[u8]) -> bool) -> Option<usize> {
    const CAP: usize = 1024;
    let mut buf = [0u8; CAP];
    let mut len = 0usize;
    let mut i = 0;
    // Hand the buffer over; false = stop.
    let flush = |buf: &[u8], len: &mut usize, f: &mut dyn FnMut(&[u8]) -> bool| -> bool {
        let go = *len == 0 || f(&buf[..*len]);
        *len = 0;
        go
    };
    while i < raw.len() {
        let run = find_special(&raw[i..]).unwrap_or(raw.len() - i);
        if run > 0 {
            let piece = &raw[i..i + run];
            if len + run <= CAP {
                buf[len..len + run].copy_from_slice(piece);
                len += run;
            } else if !flush(&buf, &mut len, &mut f) || !f(piece) {
                return None;
            }
        }
        i += run;
        match raw.get(i) {
            Some(b'\\') => {}
            Some(b'"') => return flush(&buf, &mut len, &mut f).then_some(i),
            // A control byte (refused by validation) or the end.
            _ => {
                flush(&buf, &mut len, &mut f);
                return None;
            }
        }
        let Some(&kind) = raw.get(i + 1) else {
            flush(&buf, &mut len, &mut f);
            return None;
        };
        let (ch, used) = match kind {
            b'n' => ('\n', 2),
            b't' => ('\t', 2),
            b'r' => ('\r', 2),
            b'b' => ('\u{8}', 2),
            b'f' => ('\u{c}', 2),
            b'u' => decode_u(&raw[i..]),
            other => (char::from(other), 2),
        };
        if len + 4 > CAP && !flush(&buf, &mut len, &mut f) {
            return None;
        }
        len += ch.encode_utf8(&mut buf[len..]).len();
        i += used;
    }
    flush(&buf, &mut len, &mut f);
    None
}

/// Index of the first `"`, `\` or control byte (< 0x20) in `b`.
///
/// SWAR, eight bytes per step: for a word `w`, `(v - 0x01…) & !v & 0x80…` flags
/// the zero bytes of `v` (only bytes above a true zero can be false positives,
/// so the lowest flag is exact); `v = w ^ 0x22…` finds quotes, `w ^ 0x5c…`
/// backslashes, and `(w - 0x20…) & !w & 0x80…` bytes below 0x20.
#[inline]
fn find_special(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut chunks = b.chunks_exact(8);
    let mut i = 0;
    for c in chunks.by_ref() {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        let m = zero(w ^ (ONES * 0x22))
            | zero(w ^ (ONES * 0x5c))
            | (w.wrapping_sub(ONES * 0x20) & !w & HIGH);
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|p| i + p)
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

/// Separator after each element of a top-level array (messages, prompts, items).
pub const ELEMENT_END: &[u8] = b"\x1e";

/// Object fields whose values are prompt text.
const TEXT_FIELDS: &[&[u8]] = &[b"content", b"text", b"output", b"input"];
/// Object fields holding media references, hashed raw as uncounted markers.
const MEDIA_FIELDS: &[&[u8]] = &[
    b"image_url",
    b"input_audio",
    b"file",
    b"image",
    b"audio",
    b"video_url",
    b"file_id",
];

/// Feed the prompt text of an already-validated raw value into `h`:
/// strings → text; integers → their digits (token ids); arrays → each element,
/// followed by `element_end`; objects → their text fields (media fields as
/// markers). Stops as soon as the budget is spent.
pub fn walk_text(raw: &[u8], h: &mut PrefixHasher, element_end: &[u8]) {
    let mut s = Scanner::new(raw);
    // The value was validated by `skip_value`; errors here only end the walk.
    let _ = walk(&mut s, h, element_end, 0);
}

fn walk(s: &mut Scanner<'_>, h: &mut PrefixHasher, element_end: &[u8], depth: usize) -> Result<()> {
    if h.is_full() || depth > MAX_DEPTH {
        return Ok(());
    }
    match s.peek() {
        Some(b'"') => {
            // Stream up to the budget, without scanning the rest of the string
            // (the whole body was validated before the walk).
            s.pos += 1;
            match for_each_piece(&s.b[s.pos..], |piece| {
                h.push_utf8(piece);
                !h.is_full()
            }) {
                Some(quote) => s.pos += quote + 1,
                None => return Ok(()),
            }
        }
        Some(b'[') => {
            s.pos += 1;
            if s.peek() == Some(b']') {
                s.pos += 1;
                return Ok(());
            }
            loop {
                walk(s, h, b"", depth + 1)?;
                h.push_marker(element_end);
                if h.is_full() {
                    return Ok(());
                }
                match s.peek() {
                    Some(b',') => s.pos += 1,
                    _ => {
                        s.pos += 1;
                        return Ok(());
                    }
                }
            }
        }
        Some(b'{') => {
            s.pos += 1;
            if s.peek() == Some(b'}') {
                s.pos += 1;
                return Ok(());
            }
            loop {
                let key = s.string_raw()?;
                s.eat(b':', "':'")?;
                if TEXT_FIELDS.contains(&key) {
                    walk(s, h, b"", depth + 1)?;
                } else if MEDIA_FIELDS.contains(&key) {
                    let v = s.value_raw()?;
                    h.push_marker(v);
                } else {
                    s.skip_value()?;
                }
                if h.is_full() {
                    return Ok(());
                }
                match s.peek() {
                    Some(b',') => s.pos += 1,
                    _ => {
                        s.pos += 1;
                        return Ok(());
                    }
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
        None => {}
    }
    Ok(())
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
    fn depth_is_bounded() {
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert!(!valid(&deep));
        let ok = format!("{{\"a\":{}1{}}}", "[".repeat(100), "]".repeat(100));
        assert!(valid(&ok));
    }

    #[test]
    fn unescapes() {
        assert_eq!(unescape(br#"a\nb\u00e9\"\\\/\ud83e\udd8a"#), "a\nbé\"\\/🦊");
        assert_eq!(unescape(br#"bad\u12"#), "bad\u{fffd}");
    }
}
