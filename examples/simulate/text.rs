//! Prompt content: segments of deterministic pseudo-words, the request bodies
//! the router parses, and the replica-side KV block hashes.
//!
//! Convention used everywhere: **one token = 4 characters** (a 3-letter
//! pseudo-word and a space). A [`Segment`] `{id, tokens}` is the first `tokens`
//! words of an endless word stream seeded by `id`, so equal ids give
//! byte-identical text, and a segment that is a prefix of another (same id,
//! fewer tokens) gives a text prefix. A prompt is a list of messages, each a
//! list of segments; its token stream is the concatenation of its segments.
//!
//! Two views of one prompt are built from the same segments:
//! - the **body** (OpenAI chat JSON) that goes through `Router::key`; it is
//!   cut after `max_chars` characters of message text, because no key
//!   extractor reads further (the core hashes at most `prefix_length` chars,
//!   GIE at most 16 384): the keys are identical to those of the full body,
//!   and the simulator does not build megabytes of text per request;
//! - the **KV block hashes** the replica model uses: one chained hash per full
//!   16-token block, computed from `(segment id, offset, length)` pieces
//!   instead of re-tokenizing text. Equal token streams give equal hashes.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::rng::mix64;

/// Characters per token (the router's char counts / 4 = tokens).
pub const CHARS_PER_TOKEN: usize = 4;
/// Tokens per KV block (vLLM default block size).
pub const KV_BLOCK_TOKENS: u32 = 16;
/// Seed of the replica-side block hash chain.
const KV_SEED: u64 = 0x6b76_2d62_6c6f_636b;

/// `tokens` words of the stream seeded by `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Content id.
    pub id: u64,
    /// Length in tokens.
    pub tokens: u32,
}

/// Chat role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `system`.
    System,
    /// `user`.
    User,
    /// `assistant`.
    Assistant,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One chat message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Role.
    pub role: Role,
    /// Content, in order.
    pub segments: Vec<Segment>,
}

/// The 4 characters of token `t` of the stream `id`.
fn word(id: u64, t: u32) -> [u8; 4] {
    let r = mix64(id.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ u64::from(t));
    [
        b'a' + (r % 26) as u8,
        b'a' + ((r >> 8) % 26) as u8,
        b'a' + ((r >> 16) % 26) as u8,
        b' ',
    ]
}

/// Append at most `max_chars` characters of `seg`'s text; returns chars written.
pub fn push_text(out: &mut Vec<u8>, seg: Segment, max_chars: usize) -> usize {
    let full = seg.tokens as usize * CHARS_PER_TOKEN;
    let n = full.min(max_chars);
    let whole = n / CHARS_PER_TOKEN;
    out.reserve(n);
    for t in 0..whole as u32 {
        out.extend_from_slice(&word(seg.id, t));
    }
    let rest = n % CHARS_PER_TOKEN;
    if rest > 0 {
        out.extend_from_slice(&word(seg.id, whole as u32)[..rest]);
    }
    n
}

/// Prompt length in tokens.
pub fn prompt_tokens(msgs: &[Message]) -> u32 {
    msgs.iter()
        .flat_map(|m| m.segments.iter())
        .map(|s| s.tokens)
        .sum()
}

/// The `messages` JSON array as Go's `json.Marshal` would write it for
/// `[]struct{Role, Content string}` (what GIE hashes), cut after `max_chars`
/// characters of content. Our text needs no escaping.
pub fn messages_json(msgs: &[Message], max_chars: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(max_chars.min(1 << 20) + 64 * msgs.len());
    out.push(b'[');
    let mut budget = max_chars;
    for (i, m) in msgs.iter().enumerate() {
        if budget == 0 {
            break;
        }
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"role\":\"");
        out.extend_from_slice(m.role.as_str().as_bytes());
        out.extend_from_slice(b"\",\"content\":\"");
        for s in &m.segments {
            if budget == 0 {
                break;
            }
            budget -= push_text(&mut out, *s, budget);
        }
        out.extend_from_slice(b"\"}");
    }
    out.push(b']');
    out
}

/// A complete OpenAI chat-completions body around a `messages` array.
pub fn chat_body(model: &str, messages: &[u8], max_tokens: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(messages.len() + 96);
    out.extend_from_slice(b"{\"model\":\"");
    out.extend_from_slice(model.as_bytes());
    out.extend_from_slice(b"\",\"messages\":");
    out.extend_from_slice(messages);
    out.extend_from_slice(format!(",\"max_tokens\":{max_tokens},\"stream\":true}}").as_bytes());
    out
}

/// The first `n` characters of the first user message (KubeAI's prefix).
pub fn first_user_prefix(msgs: &[Message], n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    if let Some(m) = msgs.iter().find(|m| m.role == Role::User) {
        let mut budget = n;
        for s in &m.segments {
            if budget == 0 {
                break;
            }
            budget -= push_text(&mut out, *s, budget);
        }
    }
    out
}

/// Chained hashes of full 16-token blocks of a token stream given as segments.
/// A block's hash covers its `(id, offset, len)` pieces and the previous hash.
#[derive(Debug, Clone)]
pub struct KvHasher {
    chain: u64,
    fill: u32,
    pieces: Vec<u8>,
    blocks: Vec<u64>,
}

impl Default for KvHasher {
    fn default() -> Self {
        KvHasher {
            chain: KV_SEED,
            fill: 0,
            pieces: Vec::with_capacity(64),
            blocks: Vec::new(),
        }
    }
}

impl KvHasher {
    /// Feed one segment.
    pub fn push(&mut self, seg: Segment) {
        let mut off = 0u32;
        while off < seg.tokens {
            let take = (KV_BLOCK_TOKENS - self.fill).min(seg.tokens - off);
            self.pieces.extend_from_slice(&seg.id.to_le_bytes());
            self.pieces.extend_from_slice(&off.to_le_bytes());
            self.pieces.extend_from_slice(&take.to_le_bytes());
            self.fill += take;
            off += take;
            if self.fill == KV_BLOCK_TOKENS {
                self.chain = xxh3_64_with_seed(&self.pieces, self.chain);
                self.blocks.push(self.chain);
                self.pieces.clear();
                self.fill = 0;
            }
        }
    }

    /// Full blocks so far.
    pub fn blocks(&self) -> &[u64] {
        &self.blocks
    }

    /// Take the full blocks hashed so far.
    pub fn into_blocks(self) -> Vec<u64> {
        self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_segments_give_prefix_text_and_blocks() {
        let a = Segment { id: 7, tokens: 100 };
        let b = Segment { id: 7, tokens: 40 };
        let (mut ta, mut tb) = (Vec::new(), Vec::new());
        push_text(&mut ta, a, usize::MAX);
        push_text(&mut tb, b, usize::MAX);
        assert_eq!(ta.len(), 400);
        assert_eq!(&ta[..160], &tb[..]);
        let mut ha = KvHasher::default();
        ha.push(Segment { id: 1, tokens: 20 });
        ha.push(a);
        let mut hb = KvHasher::default();
        hb.push(Segment { id: 1, tokens: 20 });
        hb.push(b);
        assert_eq!(ha.blocks().len(), 7);
        assert_eq!(hb.blocks().len(), 3);
        assert_eq!(ha.blocks()[..3], hb.blocks()[..]);
    }
}
