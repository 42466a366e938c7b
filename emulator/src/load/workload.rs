//! Built-in workloads of `prefix-load`, deterministic for a seed.
//!
//! Text is made of random words (ASCII) and cut to `4 × tokens` characters, so at ~4 chars per
//! token a "2000-token" prompt is 8000 characters (the emulator's default tokenizer agrees).
//!
//! | name | requests |
//! |---|---|
//! | `shared-prefix` | each picks one of `groups` long system prompts (`prefix_tokens`) uniformly, plus a unique user suffix (`suffix_tokens`) |
//! | `sagemaker` | the same shape with SageMaker's benchmark sizes: 8,000-token prefixes |
//! | `multi-turn` | `conversations` chats of `turns` turns; turn k sends the system prompt and the whole history (user `turn_tokens`, synthetic assistant replies `reply_tokens`); turn k+1 starts only after turn k finished |
//! | `unique` | unique short prompts (`suffix_tokens`) |
//! | `mixed` | the demo mix: 50 % shared-prefix, 30 % multi-turn, 20 % unique, interleaved |
//!
//! Cost: O(total prompt characters) to generate, done once before the run.

use crate::load::rng::Rng;

const VOCAB: &[&str] = &[
    "the", "model", "prefix", "cache", "replica", "router", "token", "prompt", "system", "user",
    "answer", "question", "policy", "document", "section", "clause", "summary", "context", "data",
    "value", "table", "report", "customer", "order", "account", "support", "ticket", "invoice",
    "product", "service", "latency", "request", "response", "memory", "block", "hash", "ring",
    "load", "queue", "batch", "stream", "first", "second", "third", "alpha", "beta", "gamma",
    "delta", "omega", "north", "south", "east", "west", "river", "mountain", "forest", "city",
    "garden", "window", "bridge", "engine", "signal", "vector", "matrix",
];

/// Random words, exactly `4 * tokens` characters.
pub fn text(rng: &mut Rng, tokens: usize) -> String {
    let want = tokens * 4;
    let mut s = String::with_capacity(want + 16);
    while s.len() < want {
        s.push_str(VOCAB[rng.below(VOCAB.len())]);
        s.push(if rng.below(12) == 0 { '.' } else { ' ' });
    }
    s.truncate(want);
    s
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// One request of a workload.
#[derive(Debug, Clone)]
pub struct Item {
    /// Routing group (prefix group, conversation or unique id); used for `--session-header`.
    pub group: String,
    /// Workload part (`shared-prefix`, `multi-turn`, `unique`).
    pub kind: &'static str,
    pub messages: Vec<Message>,
    /// Index of the request that must finish before this one starts (previous turn).
    pub after: Option<usize>,
    /// Start time, seconds after the run starts (trace replay); `None` = the run's schedule.
    pub at_s: Option<f64>,
    /// `max_tokens` of this request (trace replay); `None` = `--max-tokens`.
    pub max_tokens: Option<usize>,
}

/// Sizes of the workloads (defaults depend on the workload, see [`Params::for_workload`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub requests: usize,
    pub groups: usize,
    pub prefix_tokens: usize,
    pub suffix_tokens: usize,
    pub conversations: usize,
    pub turns: usize,
    pub system_tokens: usize,
    pub turn_tokens: usize,
    pub reply_tokens: usize,
}

pub const WORKLOADS: &[&str] = &[
    "shared-prefix",
    "multi-turn",
    "unique",
    "mixed",
    "sagemaker",
];

impl Params {
    /// Default sizes for a workload.
    pub fn for_workload(name: &str) -> Params {
        let base = Params {
            requests: 400,
            groups: 8,
            prefix_tokens: 2000,
            suffix_tokens: 32,
            conversations: 32,
            turns: 6,
            system_tokens: 200,
            turn_tokens: 80,
            reply_tokens: 120,
        };
        match name {
            "sagemaker" => Params {
                groups: 16,
                prefix_tokens: 8000,
                suffix_tokens: 64,
                ..base
            },
            "unique" => Params {
                suffix_tokens: 128,
                ..base
            },
            "multi-turn" => Params {
                requests: 32 * 6,
                ..base
            },
            "mixed" => Params {
                groups: 4,
                conversations: 12,
                turns: 5,
                ..base
            },
            _ => base,
        }
    }
}

fn shared_prefix(rng: &mut Rng, p: &Params, n: usize, tag: &str) -> Vec<Item> {
    let groups = p.groups.max(1);
    let mut prefix_rng = rng.fork(1);
    let prefixes: Vec<String> = (0..groups)
        .map(|g| {
            format!(
                "[{tag} group {g}] {}",
                text(&mut prefix_rng, p.prefix_tokens)
            )
        })
        .collect();
    let mut pick = rng.fork(2);
    let mut suffix = rng.fork(3);
    (0..n)
        .map(|i| {
            let g = pick.below(groups);
            Item {
                group: format!("{tag}-g{g}"),
                kind: "shared-prefix",
                messages: vec![
                    Message {
                        role: "system",
                        content: prefixes[g].clone(),
                    },
                    Message {
                        role: "user",
                        content: format!("q{i}: {}", text(&mut suffix, p.suffix_tokens)),
                    },
                ],
                after: None,
                at_s: None,
                max_tokens: None,
            }
        })
        .collect()
}

fn unique(rng: &mut Rng, p: &Params, n: usize, tag: &str) -> Vec<Item> {
    let mut r = rng.fork(4);
    (0..n)
        .map(|i| {
            let id = r.next_u64();
            Item {
                group: format!("{tag}-u{i}"),
                kind: "unique",
                messages: vec![Message {
                    role: "user",
                    content: format!("{id:016x} {}", text(&mut r, p.suffix_tokens)),
                }],
                after: None,
                at_s: None,
                max_tokens: None,
            }
        })
        .collect()
}

/// Conversations interleaved round by round (shuffled within a round); `after` links turns.
fn multi_turn(rng: &mut Rng, p: &Params, n: usize, tag: &str) -> Vec<Item> {
    let convs = p.conversations.max(1);
    let mut r = rng.fork(5);
    let mut history: Vec<Vec<Message>> = (0..convs)
        .map(|c| {
            vec![Message {
                role: "system",
                content: format!("[{tag} chat {c}] {}", text(&mut r, p.system_tokens)),
            }]
        })
        .collect();
    let mut last: Vec<Option<usize>> = vec![None; convs];
    let mut out = Vec::new();
    'rounds: for _turn in 0..p.turns.max(1) {
        let mut order: Vec<usize> = (0..convs).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, r.below(i + 1));
        }
        for c in order {
            if out.len() >= n {
                break 'rounds;
            }
            let h = &mut history[c];
            h.push(Message {
                role: "user",
                content: text(&mut r, p.turn_tokens),
            });
            out.push(Item {
                group: format!("{tag}-c{c}"),
                kind: "multi-turn",
                messages: h.clone(),
                after: last[c],
                at_s: None,
                max_tokens: None,
            });
            last[c] = Some(out.len() - 1);
            h.push(Message {
                role: "assistant",
                content: text(&mut r, p.reply_tokens),
            });
        }
    }
    out
}

/// Merges lists keeping each list's order, picking the next list with probability proportional
/// to what it has left; remaps `after` indices.
fn interleave(rng: &mut Rng, lists: Vec<Vec<Item>>) -> Vec<Item> {
    let total: usize = lists.iter().map(Vec::len).sum();
    let mut pos = vec![0usize; lists.len()];
    let mut new_index: Vec<Vec<usize>> = lists.iter().map(|l| vec![0; l.len()]).collect();
    let mut out = Vec::with_capacity(total);
    for left in (1..=total).rev() {
        let mut x = rng.below(left);
        let mut k = 0;
        for (j, l) in lists.iter().enumerate() {
            let rem = l.len() - pos[j];
            if x < rem {
                k = j;
                break;
            }
            x -= rem;
        }
        let mut item = lists[k][pos[k]].clone();
        item.after = item.after.map(|a| new_index[k][a]);
        new_index[k][pos[k]] = out.len();
        pos[k] += 1;
        out.push(item);
    }
    out
}

/// Builds the named workload. `requests` caps the total (multi-turn: conversations × turns at
/// most).
pub fn build(name: &str, p: &Params, seed: u64) -> Result<Vec<Item>, String> {
    let mut rng = Rng::new(seed);
    let n = p.requests;
    Ok(match name {
        "shared-prefix" => shared_prefix(&mut rng, p, n, "sp"),
        "sagemaker" => shared_prefix(&mut rng, p, n, "sm"),
        "unique" => unique(&mut rng, p, n, "u"),
        "multi-turn" => multi_turn(&mut rng, p, n, "mt"),
        "mixed" => {
            let n_sp = n / 2;
            let n_mt = (n * 3 / 10).min(p.conversations * p.turns);
            let n_u = n - n_sp - n_mt;
            let lists = vec![
                shared_prefix(&mut rng.fork(11), p, n_sp, "mx"),
                multi_turn(&mut rng.fork(12), p, n_mt, "mx"),
                unique(&mut rng.fork(13), p, n_u, "mx"),
            ];
            interleave(&mut rng.fork(14), lists)
        }
        other => {
            return Err(format!(
                "unknown workload '{other}' (one of {})",
                WORKLOADS.join(", ")
            ))
        }
    })
}

/// Completions-API rendering of a chat: the contents joined by newlines.
pub fn as_prompt(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Requests of a trace (`--trace`): block id `b` becomes `block` tokens of words drawn from a
/// generator seeded by `b` (equal ids, equal text), the last block cut to the prompt length and
/// a unique tail when the ids do not cover it; the first block is the system message and the
/// rest one user message (as in the simulator). `max_tokens` = the trace's output length,
/// capped at `max_output`. Arrival times are the trace's (already time-scaled).
pub fn from_trace(
    reqs: &[crate::load::trace::TraceRequest],
    block: usize,
    max_output: usize,
) -> Vec<Item> {
    let mut blocks: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
    reqs.iter()
        .map(|r| {
            let mut parts: Vec<String> = Vec::with_capacity(r.ids.len() + 1);
            let mut left = r.input as usize;
            for &b in &r.ids {
                let t = left.min(block);
                let full = blocks
                    .entry(b)
                    .or_insert_with(|| text(&mut Rng::new(b ^ 0x7472_6163_6500_0000), block));
                parts.push(full[..(t * 4).min(full.len())].to_string());
                left -= t;
            }
            if left > 0 {
                parts.push(text(&mut Rng::new(0x7461_696c ^ r.line as u64), left));
            }
            let mut messages = Vec::with_capacity(2);
            let mut it = parts.into_iter();
            if let Some(first) = it.next() {
                messages.push(Message {
                    role: "system",
                    content: first,
                });
            }
            let rest: String = it.collect();
            if !rest.is_empty() {
                messages.push(Message {
                    role: "user",
                    content: rest,
                });
            }
            Item {
                group: format!("trace-l{}", r.line),
                kind: "trace",
                messages,
                after: None,
                at_s: Some(r.at_s),
                max_tokens: Some((r.output as usize).clamp(1, max_output.max(1))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(i: &Item) -> usize {
        i.messages.iter().map(|m| m.content.len()).sum()
    }

    #[test]
    fn deterministic_for_a_seed() {
        for w in WORKLOADS {
            let p = Params {
                requests: 50,
                ..Params::for_workload(w)
            };
            let a = build(w, &p, 3).unwrap();
            let b = build(w, &p, 3).unwrap();
            let c = build(w, &p, 4).unwrap();
            assert_eq!(a.len(), 50, "{w}");
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.messages == y.messages),
                "{w}"
            );
            assert!(
                a.iter().zip(&c).any(|(x, y)| x.messages != y.messages),
                "{w}"
            );
        }
        assert!(build("nope", &Params::for_workload("unique"), 1).is_err());
    }

    #[test]
    fn shared_prefix_groups_share_their_system_prompt() {
        let p = Params {
            requests: 100,
            ..Params::for_workload("sagemaker")
        };
        let items = build("sagemaker", &p, 1).unwrap();
        let mut groups = std::collections::BTreeMap::new();
        for i in &items {
            let sys = &i.messages[0].content;
            assert!(sys.len() >= 32_000);
            assert!(groups
                .insert(i.group.clone(), sys.clone())
                .is_none_or(|s| s == *sys));
        }
        assert!(groups.len() > 10);
        // User suffixes are unique.
        let users: std::collections::BTreeSet<_> = items
            .iter()
            .map(|i| i.messages[1].content.clone())
            .collect();
        assert_eq!(users.len(), items.len());
    }

    #[test]
    fn multi_turn_history_grows_and_turns_are_ordered() {
        let p = Params::for_workload("multi-turn");
        let items = build("multi-turn", &p, 2).unwrap();
        assert_eq!(items.len(), p.conversations * p.turns);
        for (idx, i) in items.iter().enumerate() {
            if let Some(a) = i.after {
                assert!(a < idx);
                let prev = &items[a];
                assert_eq!(prev.group, i.group);
                assert!(chars(i) > chars(prev));
                // The previous turn's messages are a prefix of this one's.
                assert_eq!(&i.messages[..prev.messages.len()], &prev.messages[..]);
            } else {
                assert_eq!(i.messages.len(), 2);
            }
        }
    }

    #[test]
    fn mixed_keeps_dependencies_and_proportions() {
        let p = Params {
            requests: 100,
            ..Params::for_workload("mixed")
        };
        let items = build("mixed", &p, 9).unwrap();
        assert_eq!(items.len(), 100);
        let count = |k| items.iter().filter(|i| i.kind == k).count();
        assert_eq!(count("shared-prefix"), 50);
        assert_eq!(count("multi-turn"), 30);
        assert_eq!(count("unique"), 20);
        for (idx, i) in items.iter().enumerate() {
            if let Some(a) = i.after {
                assert!(a < idx);
                assert_eq!(items[a].group, i.group);
            }
        }
    }

    #[test]
    fn text_has_exact_length() {
        let mut r = Rng::new(1);
        assert_eq!(text(&mut r, 0).len(), 0);
        assert_eq!(text(&mut r, 2000).len(), 8000);
    }
}
