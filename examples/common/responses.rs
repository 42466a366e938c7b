//! Engine responses for the usage-scanner measurements (`usage_scan`,
//! `cost_probe`): OpenAI-style chat completions as vLLM sends them.

/// A chat-completion event stream of `events` one-token events, each its own
/// chunk, then the usage event and `[DONE]`.
pub fn sse(events: usize) -> Vec<Vec<u8>> {
    let mut chunks: Vec<Vec<u8>> = (0..events)
        .map(|i| {
            format!(
                "data: {{\"id\":\"chatcmpl-0123456789abcdef\",\"object\":\"chat.completion.chunk\",\"created\":1732950000,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}},\"finish_reason\":null}}]}}\n\n"
            )
            .into_bytes()
        })
        .collect();
    chunks.push(
        b"data: {\"id\":\"chatcmpl-0123456789abcdef\",\"choices\":[],\"usage\":{\"prompt_tokens\":4096,\"completion_tokens\":1000,\"prompt_tokens_details\":{\"cached_tokens\":3840}}}\n\ndata: [DONE]\n\n".to_vec(),
    );
    chunks
}

/// A non-streaming chat completion with an answer of about `answer_bytes`
/// bytes and the usage at the end, in chunks of up to 16 KiB.
pub fn json(answer_bytes: usize) -> Vec<Vec<u8>> {
    let body = format!(
        "{{\"id\":\"chatcmpl-0123456789abcdef\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":4096,\"completion_tokens\":4000,\"prompt_tokens_details\":{{\"cached_tokens\":3840}}}}}}",
        "The quick brown fox. ".repeat(answer_bytes / 21)
    );
    // Envoy hands the body over in pieces of up to 16 KiB.
    body.as_bytes()
        .chunks(16 * 1024)
        .map(<[u8]>::to_vec)
        .collect()
}
