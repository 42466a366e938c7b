//! Synthetic workloads and the preparation of requests (bodies → keys,
//! segments → KV block hashes).
//!
//! | name | shape | default size and load |
//! |---|---|---|
//! | `sagemaker` | 600 groups; prompt = the group's 8 000-token prefix + a unique 50–250-token question, one user message; output 64–256; group uniform; Poisson | 9 000 requests at 24 req/s |
//! | `chat` | multi-turn conversations, ShareGPT-like lengths: 1 shared 200-token system prompt, then turns (user lognormal median 70 tokens, assistant lognormal median 220); 1 + geometric(mean 4) turns; the next turn comes 1–60 s (exp., mean 20 s) after the answer; conversation starts Poisson | 12 000 conversations at 32 conv/s |
//! | `rag` | 3 000 documents (lognormal median 3 000 tokens), Zipf(0.9) popularity; prompt = shared 150-token system prompt + document + 20–150-token question; output 50–300; Poisson | 18 000 requests at 72 req/s |
//! | `unique` | unique prompts, lognormal median 400 tokens (50–4 000); output 50–400; Poisson | 18 000 requests at 150 req/s |
//!
//! Load levels are chosen so that a cache-blind policy (random) runs the
//! cluster at roughly 60–80 % of what it sustains (README, "Workloads").

use prefix_router::Body;
use xxhash_rust::xxh3::xxh3_64;

use crate::engine::{Arrival, Keys, SimRequest};
use crate::policies::{gie, KeyBook};
use crate::rng::{mix64, Rng, Zipf};
use crate::text::{
    chat_body, first_user_prefix, messages_json, prompt_tokens, KvHasher, Message, Role, Segment,
    CHARS_PER_TOKEN,
};

/// Model name written in every body (part of the hash seed).
pub const MODEL: &str = "llama-3.1-70b-instruct";

/// One request before preparation.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Arrival.
    pub arrival: Arrival,
    /// Prompt.
    pub messages: Vec<Message>,
    /// Output tokens.
    pub output_tokens: u32,
    /// The output's content when later prompts contain it (chat answers).
    pub output: Option<Segment>,
    /// Session id (affinity header), if the client has one.
    pub session: Option<u64>,
}

/// A workload ready to be prepared.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Name.
    pub name: String,
    /// One-line description with its load.
    pub description: String,
    /// Requests.
    pub specs: Vec<Spec>,
}

/// Knobs shared by the synthetic generators.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    /// Multiplier of the number of requests/conversations.
    pub scale: f64,
    /// Multiplier of the arrival rate.
    pub load: f64,
    /// Seed.
    pub seed: u64,
}

fn uid(ns: u64, a: u64, b: u64) -> u64 {
    mix64(ns ^ mix64(a ^ mix64(b)))
}

fn count(base: usize, k: &Knobs) -> usize {
    ((base as f64 * k.scale).round() as usize).max(1)
}

/// SageMaker-style long context: groups sharing an 8 000-token prefix.
pub fn sagemaker(k: &Knobs) -> Workload {
    const GROUPS: u64 = 600;
    let n = count(9000, k);
    let rate = 24.0 * k.load;
    let mut rng = Rng::new(k.seed ^ 0x5a6e);
    let mut t = 0.0;
    let specs = (0..n as u64)
        .map(|i| {
            t += rng.exp(1.0 / rate);
            let g = rng.below(GROUPS);
            let q = rng.range(50, 250);
            Spec {
                arrival: Arrival::At(t),
                messages: vec![Message {
                    role: Role::User,
                    segments: vec![
                        Segment {
                            id: uid(1, g, 0),
                            tokens: 8000,
                        },
                        Segment {
                            id: uid(2, i, 0),
                            tokens: q,
                        },
                    ],
                }],
                output_tokens: rng.range(64, 256),
                output: None,
                session: None,
            }
        })
        .collect();
    Workload {
        name: "sagemaker".into(),
        description: format!(
            "{n} requests, {GROUPS} groups × 8000-token shared prefix + 50-250-token question, Poisson {rate:.1} req/s"
        ),
        specs,
    }
}

/// Multi-turn chats with ShareGPT-like lengths.
pub fn chat(k: &Knobs) -> Workload {
    let convs = count(12000, k);
    let rate = 32.0 * k.load;
    let mut rng = Rng::new(k.seed ^ 0xc4a7);
    let system = Segment {
        id: uid(10, 0, 0),
        tokens: 200,
    };
    let mut specs: Vec<Spec> = Vec::new();
    let mut t = 0.0;
    for c in 0..convs as u64 {
        t += rng.exp(1.0 / rate);
        // 1 + geometric with mean 3 extra turns (mean 4 turns), at most 16.
        let mut turns = 1;
        while turns < 16 && rng.f64() < 0.75 {
            turns += 1;
        }
        let mut history = vec![Message {
            role: Role::System,
            segments: vec![system],
        }];
        let mut prev: Option<u32> = None;
        for turn in 0..turns {
            let user = Segment {
                id: uid(11, c, turn),
                tokens: rng.lognormal(70.0, 1.0, 4, 2000),
            };
            history.push(Message {
                role: Role::User,
                segments: vec![user],
            });
            let out = Segment {
                id: uid(12, c, turn),
                tokens: rng.lognormal(220.0, 0.7, 8, 1500),
            };
            let arrival = match prev {
                None => Arrival::At(t),
                Some(p) => Arrival::After {
                    prev: p,
                    think: rng.exp(20.0).clamp(1.0, 60.0),
                },
            };
            specs.push(Spec {
                arrival,
                messages: history.clone(),
                output_tokens: out.tokens,
                output: Some(out),
                session: Some(c),
            });
            prev = Some((specs.len() - 1) as u32);
            history.push(Message {
                role: Role::Assistant,
                segments: vec![out],
            });
        }
    }
    Workload {
        name: "chat".into(),
        description: format!(
            "{convs} conversations ({} requests), 200-token system prompt, ShareGPT-like turns, think time exp(20 s), Poisson {rate:.1} conv/s",
            specs.len()
        ),
        specs,
    }
}

/// Retrieval-augmented generation over a document pool with Zipf popularity.
pub fn rag(k: &Knobs) -> Workload {
    const DOCS: usize = 3000;
    let n = count(18000, k);
    let rate = 72.0 * k.load;
    let mut rng = Rng::new(k.seed ^ 0x4a6);
    let zipf = Zipf::new(DOCS, 0.9);
    let doc_len: Vec<u32> = (0..DOCS)
        .map(|_| rng.lognormal(3000.0, 0.4, 800, 8000))
        .collect();
    let system = Segment {
        id: uid(20, 0, 0),
        tokens: 150,
    };
    let mut t = 0.0;
    let specs = (0..n as u64)
        .map(|i| {
            t += rng.exp(1.0 / rate);
            let d = zipf.sample(&mut rng);
            Spec {
                arrival: Arrival::At(t),
                messages: vec![
                    Message {
                        role: Role::System,
                        segments: vec![system],
                    },
                    Message {
                        role: Role::User,
                        segments: vec![
                            Segment {
                                id: uid(21, d as u64, 0),
                                tokens: doc_len[d],
                            },
                            Segment {
                                id: uid(22, i, 0),
                                tokens: rng.range(20, 150),
                            },
                        ],
                    },
                ],
                output_tokens: rng.range(50, 300),
                output: None,
                session: None,
            }
        })
        .collect();
    Workload {
        name: "rag".into(),
        description: format!(
            "{n} requests, {DOCS} documents (median 3000 tokens, Zipf 0.9: top doc {:.1} %) + question, Poisson {rate:.1} req/s",
            100.0 * zipf.top_share()
        ),
        specs,
    }
}

/// Unique short prompts: nothing to reuse ("do no harm").
pub fn unique(k: &Knobs) -> Workload {
    let n = count(18000, k);
    let rate = 150.0 * k.load;
    let mut rng = Rng::new(k.seed ^ 0x0417);
    let mut t = 0.0;
    let specs = (0..n as u64)
        .map(|i| {
            t += rng.exp(1.0 / rate);
            Spec {
                arrival: Arrival::At(t),
                messages: vec![Message {
                    role: Role::User,
                    segments: vec![Segment {
                        id: uid(30, i, 0),
                        tokens: rng.lognormal(400.0, 0.8, 50, 4000),
                    }],
                }],
                output_tokens: rng.range(50, 400),
                output: None,
                session: None,
            }
        })
        .collect();
    Workload {
        name: "unique".into(),
        description: format!("{n} unique prompts (median 400 tokens), Poisson {rate:.1} req/s"),
        specs,
    }
}

/// Turn one spec into a simulated request: build its (cut) body, run every
/// key extractor on it, hash its KV blocks.
pub fn prepare_one(spec: &Spec, book: &KeyBook, max_chars: usize) -> SimRequest {
    let msgs = messages_json(&spec.messages, max_chars);
    let body = chat_body(MODEL, &msgs, spec.output_tokens);
    let session = spec.session.map(|s| format!("conv-{s}"));
    let core = book
        .routers
        .iter()
        .map(|(_, r)| {
            if !r.needs_body() {
                // random / round_robin / least_request route on headers.
                return r.key(Body::None, None);
            }
            let header = if r.config().affinity_header.is_some() {
                session.as_deref().map(str::as_bytes)
            } else {
                None
            };
            r.key(Body::Complete(&body), header)
        })
        .collect();
    let kubeai = xxh3_64(&first_user_prefix(&spec.messages, 100));
    let gie = gie::hashes(&msgs, MODEL);
    let mut h = KvHasher::default();
    for m in &spec.messages {
        for s in &m.segments {
            h.push(*s);
        }
    }
    let prompt = prompt_tokens(&spec.messages);
    let n_prompt = h.blocks().len();
    let (blocks, out_blocks) = match spec.output {
        Some(o) => {
            h.push(o);
            let all = h.into_blocks();
            let out = all[n_prompt..].to_vec();
            let mut b = all;
            b.truncate(n_prompt);
            (b, out)
        }
        None => (h.into_blocks(), Vec::new()),
    };
    SimRequest {
        arrival: spec.arrival,
        prompt_tokens: prompt.max(1),
        output_tokens: spec.output_tokens.max(1),
        body_chars: prompt * CHARS_PER_TOKEN as u32,
        blocks,
        out_blocks,
        keys: Keys { core, kubeai, gie },
    }
}

/// Prepare every spec, on `threads` threads; order is preserved.
///
/// # Errors
/// When a worker thread died.
pub fn prepare(specs: &[Spec], book: &KeyBook, threads: usize) -> Result<Vec<SimRequest>, String> {
    let max_chars = book.max_chars();
    let threads = threads.max(1);
    let chunk = specs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = specs
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|sp| prepare_one(sp, book, max_chars))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(specs.len());
        for h in handles {
            out.extend(
                h.join()
                    .map_err(|_| "a preparation thread died".to_string())?,
            );
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::ours::OursParams;

    #[test]
    fn same_group_same_prefix_blocks() {
        let k = Knobs {
            scale: 0.05,
            load: 1.0,
            seed: 1,
        };
        let w = sagemaker(&k);
        let book = KeyBook::new(&["ours".to_string()], 7, &OursParams::default()).unwrap();
        let reqs: Vec<SimRequest> = w
            .specs
            .iter()
            .map(|s| prepare_one(s, &book, book.max_chars()))
            .collect();
        // Find two requests of the same group (same first segment).
        let mut found = false;
        for i in 0..w.specs.len() {
            for j in i + 1..w.specs.len() {
                if w.specs[i].messages[0].segments[0] == w.specs[j].messages[0].segments[0] {
                    let (a, b) = (&reqs[i].keys.core[0].blocks, &reqs[j].keys.core[0].blocks);
                    let same = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
                    assert!(same >= 124, "shared blocks {same}");
                    assert_eq!(reqs[i].blocks[..400], reqs[j].blocks[..400]);
                    found = true;
                }
            }
        }
        assert!(found);
    }
}
