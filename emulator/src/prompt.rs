//! Request body -> prompt text -> token ids (the emulator's "chat template" and "tokenizer").
//!
//! Chat completions (`messages`): each message is rendered as `<|{role}|>\n{content}\n`, in order,
//! and the generation prompt `<|assistant|>\n` is appended (like `add_generation_prompt=True`).
//! `content` may be a string, `null`, or an array of parts; the `text` of every part with a
//! `text` field is joined with `\n` (so a string and a one-part array render the same); other
//! parts (images, audio) render as nothing.
//!
//! Completions (`prompt`): a string, a one-element array of strings, or an array of token ids
//! (used as the tokens directly). Several prompts in one request are rejected (400).
//!
//! Tokenizer: the text is cut into consecutive tokens of `chars_per_token` Unicode scalar values
//! (the last token may be shorter); a token's id is the xxh3 hash of its UTF-8 bytes. So
//! `num_tokens = ceil(chars / chars_per_token)`, deterministic, and equal text gives equal ids.
//! Cost: O(text length).

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// Which OpenAI endpoint the body belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

/// A parsed prompt: its token ids (and, for logging, its rendered length in chars).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub tokens: Vec<u64>,
    pub chars: usize,
}

/// Renders the prompt text of a chat request (see the module documentation).
pub fn render_chat(messages: &Value) -> Result<String, String> {
    let list = messages.as_array().ok_or("'messages' must be an array")?;
    if list.is_empty() {
        return Err("'messages' must not be empty".into());
    }
    let mut out = String::new();
    for (i, m) in list.iter().enumerate() {
        let obj = m
            .as_object()
            .ok_or_else(|| format!("messages[{i}] must be an object"))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("messages[{i}].role must be a string"))?;
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        match obj.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(parts)) => {
                let mut first = true;
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        if !first {
                            out.push('\n');
                        }
                        out.push_str(t);
                        first = false;
                    }
                }
            }
            Some(_) => {
                return Err(format!(
                    "messages[{i}].content must be a string or an array"
                ))
            }
        }
        out.push('\n');
    }
    out.push_str("<|assistant|>\n");
    Ok(out)
}

/// Cuts `text` into tokens of `chars_per_token` characters; returns their ids.
pub fn tokenize(text: &str, chars_per_token: usize) -> Vec<u64> {
    let cpt = chars_per_token.max(1);
    let mut tokens = Vec::with_capacity(text.len() / cpt + 1);
    let mut start = 0;
    let mut count = 0;
    for (i, _) in text.char_indices() {
        if count == cpt {
            tokens.push(xxh3_64(&text.as_bytes()[start..i]));
            start = i;
            count = 0;
        }
        count += 1;
    }
    if count > 0 {
        tokens.push(xxh3_64(&text.as_bytes()[start..]));
    }
    tokens
}

/// Extracts and tokenizes the prompt of a request body for `api`.
pub fn prompt_of(api: Api, body: &Value, chars_per_token: usize) -> Result<Prompt, String> {
    match api {
        Api::Chat => {
            let messages = body.get("messages").ok_or("'messages' is required")?;
            let text = render_chat(messages)?;
            Ok(Prompt {
                chars: text.chars().count(),
                tokens: tokenize(&text, chars_per_token),
            })
        }
        Api::Completions => match body.get("prompt").ok_or("'prompt' is required")? {
            Value::String(s) => Ok(Prompt {
                chars: s.chars().count(),
                tokens: tokenize(s, chars_per_token),
            }),
            Value::Array(items) if items.iter().all(Value::is_u64) && !items.is_empty() => {
                let tokens: Vec<u64> = items.iter().filter_map(Value::as_u64).collect();
                Ok(Prompt { chars: 0, tokens })
            }
            Value::Array(items) if items.len() == 1 => match &items[0] {
                Value::String(s) => Ok(Prompt {
                    chars: s.chars().count(),
                    tokens: tokenize(s, chars_per_token),
                }),
                _ => Err("'prompt' must be a string, [string] or an array of token ids".into()),
            },
            Value::Array(items) if items.len() > 1 => {
                Err("the emulator accepts one prompt per request".into())
            }
            _ => Err("'prompt' must be a string, [string] or an array of token ids".into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_template_and_content_forms() {
        let a = json!([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]);
        let b = json!([
            {"role":"system","content":[{"type":"text","text":"Be brief."}]},
            {"role":"user","content":[{"type":"text","text":"Hi"}]}
        ]);
        let text = render_chat(&a).unwrap();
        assert_eq!(text, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
        assert_eq!(render_chat(&b).unwrap(), text);
        assert!(render_chat(&json!([])).is_err());
        assert!(render_chat(&json!([{"content":"x"}])).is_err());
        assert!(render_chat(&json!("x")).is_err());
    }

    #[test]
    fn tokenizer_cuts_fixed_char_runs() {
        assert_eq!(tokenize("", 4).len(), 0);
        assert_eq!(tokenize("abcd", 4).len(), 1);
        assert_eq!(tokenize("abcde", 4).len(), 2);
        let t = tokenize("abcdabcd", 4);
        assert_eq!(t[0], t[1]);
        // Multi-byte characters count as one char each.
        assert_eq!(tokenize("ééééé", 4).len(), 2);
        assert_eq!(tokenize(&"x".repeat(400), 4).len(), 100);
    }

    #[test]
    fn completions_prompt_forms() {
        let p = prompt_of(Api::Completions, &json!({"prompt":"abcdefgh"}), 4).unwrap();
        assert_eq!(p.tokens.len(), 2);
        let q = prompt_of(Api::Completions, &json!({"prompt":["abcdefgh"]}), 4).unwrap();
        assert_eq!(p, q);
        let ids = prompt_of(Api::Completions, &json!({"prompt":[1,2,3]}), 4).unwrap();
        assert_eq!(ids.tokens, vec![1, 2, 3]);
        assert!(prompt_of(Api::Completions, &json!({"prompt":["a","b"]}), 4).is_err());
        assert!(prompt_of(Api::Completions, &json!({}), 4).is_err());
        assert!(prompt_of(Api::Chat, &json!({"prompt":"x"}), 4).is_err());
    }
}
