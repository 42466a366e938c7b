//! Bounded, allocation-light tokeniser of the Prometheus text exposition
//! format (one `name{labels} value [timestamp]` sample per line).
//!
//! Hostile-input rules: the caller caps the total bytes ([`MAX_TEXT`]); a line
//! longer than [`MAX_LINE`] is skipped whole; a line that does not tokenise
//! (unterminated label block, bad escape, missing value) is skipped; comments
//! (`#`), blank lines, `\r` before `\n` and a missing final newline are fine;
//! bytes need not be UTF-8 (label values are decoded lossily). Every function
//! here is O(line length) and never panics: all slicing goes through checked
//! `get`/`split_at` on positions found by scanning the same slice.

/// Bytes of one exposition read at most; the rest is ignored (vLLM's
/// `/metrics` with histograms is a few hundred KiB).
pub const MAX_TEXT: usize = 4 << 20;
/// Longest line considered; longer lines are skipped whole.
pub const MAX_LINE: usize = 16 << 10;

/// One tokenised sample line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line<'a> {
    /// Metric name (bytes before `{` or whitespace).
    pub name: &'a [u8],
    /// Raw label block, between the braces (empty when none).
    pub labels: &'a [u8],
    /// Parsed value (may be NaN/±Inf: the caller decides).
    pub value: f64,
}

/// The lines of `text` (at most [`MAX_TEXT`] bytes; a line cut by that cap is
/// dropped), without their `\n`.
pub fn lines(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let truncated = text.len() > MAX_TEXT;
    let text = text.get(..MAX_TEXT).unwrap_or(text);
    let mut it = text.split(|&b| b == b'\n').peekable();
    std::iter::from_fn(move || {
        let line = it.next()?;
        if truncated && it.peek().is_none() {
            return None; // incomplete last line
        }
        Some(line)
    })
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r')
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_space(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !is_space(*last) {
            break;
        }
        s = rest;
    }
    s
}

/// The metric name of a sample line, or `None` for a comment, blank or
/// over-long line. Cheap: lets the caller reject unknown metrics before the
/// label block is scanned.
pub fn name_of(line: &[u8]) -> Option<&[u8]> {
    if line.len() > MAX_LINE {
        return None;
    }
    let line = trim(line);
    if matches!(line.first(), None | Some(b'#')) {
        return None;
    }
    let end = line
        .iter()
        .position(|&b| b == b'{' || is_space(b))
        .unwrap_or(line.len());
    line.get(..end).filter(|n| !n.is_empty())
}

/// Tokenises one line; `None` when it is not a well-formed sample.
pub fn parse_line(line: &[u8]) -> Option<Line<'_>> {
    let name = name_of(line)?;
    let line = trim(line);
    let rest = line.get(name.len()..)?;
    let (labels, rest) = match rest.first() {
        Some(b'{') => split_labels(rest.get(1..)?)?,
        _ => (&rest[..0], rest),
    };
    let rest = trim(rest);
    let end = rest.iter().position(|&b| is_space(b)).unwrap_or(rest.len());
    let token = rest.get(..end)?;
    let value = std::str::from_utf8(token).ok()?.parse::<f64>().ok()?;
    Some(Line {
        name,
        labels,
        value,
    })
}

/// Splits `a="x",b="y"} 1` into the label block and what follows the closing
/// brace, honouring quotes and backslash escapes.
fn split_labels(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, &b) in s.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if in_quotes {
            match b {
                b'\\' => escaped = true,
                b'"' => in_quotes = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_quotes = true,
                b'}' => return Some((s.get(..i)?, s.get(i + 1..)?)),
                _ => {}
            }
        }
    }
    None
}

/// The unescaped value of label `key` in a raw label block (`\\`, `\"`, `\n`
/// escapes; an unknown escape keeps the escaped byte). `None` when the label
/// is absent or the block is malformed before it is reached.
pub fn label(labels: &[u8], key: &[u8]) -> Option<String> {
    let mut rest = labels;
    loop {
        rest = trim_commas(rest);
        if rest.is_empty() {
            return None;
        }
        let eq = rest.iter().position(|&b| b == b'=')?;
        let (k, after) = rest.split_at(eq);
        let after = trim(after.get(1..)?);
        let after = after.strip_prefix(b"\"")?;
        let (value, consumed) = unescape_until_quote(after)?;
        if trim(k) == key {
            return Some(String::from_utf8_lossy(&value).into_owned());
        }
        rest = after.get(consumed..)?;
    }
}

fn trim_commas(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if *first != b',' && !is_space(*first) {
            break;
        }
        s = rest;
    }
    s
}

/// Unescapes up to the closing quote; returns the value and the bytes
/// consumed including that quote.
fn unescape_until_quote(s: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut out = Vec::new();
    let mut it = s.iter().enumerate();
    while let Some((i, &b)) = it.next() {
        match b {
            b'\\' => {
                let (_, &n) = it.next()?;
                out.push(if n == b'n' { b'\n' } else { n });
            }
            b'"' => return Some((out, i + 1)),
            _ => out.push(b),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn tokenises_names_labels_values() {
        let l = parse_line(b"vllm:num_requests_waiting{model_name=\"m\"} 3.0").unwrap();
        assert_eq!(l.name, b"vllm:num_requests_waiting");
        assert_eq!(l.labels, b"model_name=\"m\"");
        assert_eq!(l.value, 3.0);
        let l = parse_line(b"  up 1 1700000000000\r").unwrap();
        assert_eq!((l.name, l.labels, l.value), (&b"up"[..], &b""[..], 1.0));
        assert!(parse_line(b"x +Inf").unwrap().value.is_infinite());
        assert!(parse_line(b"x NaN").unwrap().value.is_nan());
        assert_eq!(parse_line(b"x 1e+06").unwrap().value, 1e6);
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            &b"# HELP x y"[..],
            b"",
            b"   ",
            b"x",
            b"x{a=\"1\" 2",
            b"x{a=\"}\" ",
            b"x abc",
            b"x 0x10",
            b"{a=\"1\"} 2",
        ] {
            assert_eq!(parse_line(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let long = [b"x 1 ".as_slice(), &vec![b' '; MAX_LINE]].concat();
        assert_eq!(parse_line(&long), None);
    }

    #[test]
    fn braces_and_quotes_inside_label_values() {
        let l = parse_line(br#"m{a="x}y",b="q\"}"} 7"#).unwrap();
        assert_eq!(l.value, 7.0);
        assert_eq!(label(l.labels, b"a").as_deref(), Some("x}y"));
        assert_eq!(label(l.labels, b"b").as_deref(), Some("q\"}"));
    }

    #[test]
    fn label_lookup_unescapes_and_tolerates_spacing() {
        let labels = br#" a = "1\\2" , b="line\nnext",c="", "#;
        assert_eq!(label(labels, b"a").as_deref(), Some("1\\2"));
        assert_eq!(label(labels, b"b").as_deref(), Some("line\nnext"));
        assert_eq!(label(labels, b"c").as_deref(), Some(""));
        assert_eq!(label(labels, b"d"), None);
        assert_eq!(label(br#"a="unterminated"#, b"a"), None);
        assert_eq!(label(br#"a=1,b="2""#, b"b"), None);
    }

    #[test]
    fn lines_cap_drops_the_cut_line() {
        let mut text = b"a 1\n".repeat(MAX_TEXT / 4);
        text.extend_from_slice(b"b 2\n");
        let got: Vec<&[u8]> = lines(&text).collect();
        assert_eq!(got.len(), MAX_TEXT / 4);
        assert!(got.iter().all(|l| *l == b"a 1"));
        let small: Vec<&[u8]> = lines(b"a 1\r\nb 2").collect();
        assert_eq!(small, vec![&b"a 1\r"[..], b"b 2"]);
    }
}
