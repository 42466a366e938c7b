use super::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// vLLM v1 (0.8+) with two engine cores (data parallel), one LoRA-enabled.
const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4321
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.61
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.4321
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7329e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="fr-lora"} 1.7329000125e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.73290001e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0
"#;

const SGLANG: &str = "# HELP sglang:num_running_reqs The number of running requests.\n\
# TYPE sglang:num_running_reqs gauge\n\
sglang:num_running_reqs{model_name=\"meta-llama/Llama-3.1-8B-Instruct\",tp_rank=\"0\"} 12.0\n\
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n\
# TYPE sglang:num_queue_reqs gauge\n\
sglang:num_queue_reqs{model_name=\"meta-llama/Llama-3.1-8B-Instruct\",tp_rank=\"0\"} 7.0\n\
# HELP sglang:token_usage The token usage.\n\
# TYPE sglang:token_usage gauge\n\
sglang:token_usage{model_name=\"meta-llama/Llama-3.1-8B-Instruct\",tp_rank=\"0\"} 0.28\n\
sglang:cache_hit_rate{model_name=\"meta-llama/Llama-3.1-8B-Instruct\",tp_rank=\"0\"} 0.5\n";

/// llama.cpp `--metrics`: no labels, CRLF, no trailing newline.
const LLAMACPP: &str =
    "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\r\n\
# TYPE llamacpp:kv_cache_usage_ratio gauge\r\n\
llamacpp:kv_cache_usage_ratio 0.125\r\n\
# HELP llamacpp:requests_processing Number of requests processing.\r\n\
# TYPE llamacpp:requests_processing gauge\r\n\
llamacpp:requests_processing 2\r\n\
# HELP llamacpp:requests_deferred Number of requests deferred.\r\n\
# TYPE llamacpp:requests_deferred gauge\r\n\
llamacpp:requests_deferred 1";

fn parse(s: &str) -> EngineSample {
    parse_metrics(s.as_bytes())
}

#[test]
fn vllm_sums_counts_maxes_usage_and_takes_the_latest_lora_series() {
    let s = parse(VLLM);
    assert_eq!(s.running, Some(5.0));
    assert_eq!(s.waiting, Some(5.0));
    assert_eq!(s.kv_usage, Some(0.61)); // kv_cache_usage_perc wins over gpu_cache_usage_perc
    assert_eq!(s.loras_running, vec!["sql-lora", "chat-lora"]);
    assert_eq!(s.loras_waiting, vec!["fr-lora"]);
    assert_eq!(s.max_lora, Some(4));
    assert_eq!(engine_load(&s), Some(10.0));
}

#[test]
fn older_vllm_gpu_cache_name_is_used_when_alone() {
    let s = parse("vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.9\n");
    assert_eq!(s.kv_usage, Some(0.9));
    assert_eq!((s.waiting, s.running), (None, None));
    assert_eq!(engine_load(&s), None);
}

#[test]
fn sglang_and_llamacpp() {
    let s = parse(SGLANG);
    assert_eq!(
        (s.waiting, s.running, s.kv_usage),
        (Some(7.0), Some(12.0), Some(0.28))
    );
    assert_eq!(s.max_lora, None);
    let l = parse(LLAMACPP);
    assert_eq!(
        (l.waiting, l.running, l.kv_usage),
        (Some(1.0), Some(2.0), Some(0.125))
    );
}

#[test]
fn families_do_not_add_up_across_engines() {
    let both = format!("{SGLANG}{VLLM}");
    let s = parse(&both);
    assert_eq!(s.waiting, Some(5.0)); // vLLM first, SGLang not added
    assert_eq!(s.kv_usage, Some(0.61));
}

#[test]
fn hostile_values_are_unknown_or_clamped() {
    let s = parse(
        "vllm:num_requests_waiting NaN\nvllm:num_requests_running +Inf\nvllm:kv_cache_usage_perc -0.5\n",
    );
    assert_eq!(s, EngineSample::default());
    let s = parse("vllm:num_requests_waiting 1e308\nvllm:num_requests_waiting 1e308\nvllm:kv_cache_usage_perc 95\n");
    assert_eq!(s.waiting, Some(MAX_COUNT));
    assert_eq!(s.kv_usage, Some(1.0));
    // a good series next to bad ones still counts
    let s = parse("vllm:num_requests_waiting{a=\"1\"} NaN\nvllm:num_requests_waiting{a=\"2\"} 3\n");
    assert_eq!(s.waiting, Some(3.0));
    // a name that merely starts like a known one is not it
    let s = parse("vllm:num_requests_waiting_total 9\nvllm:num_requests_waitingx{} 9\n");
    assert_eq!(s.waiting, None);
}

#[test]
fn malformed_lines_are_skipped_not_fatal() {
    let text = "vllm:num_requests_waiting{model_name=\"unterminated} 9\n\
                garbage line without value\n\
                \u{0}\u{1}\u{2}\n\
                vllm:num_requests_running{model_name=\"a\\\"}b\"} 2\n\
                vllm:num_requests_waiting 0x10\n\
                vllm:num_requests_waiting 1";
    let s = parse(text);
    assert_eq!(s.running, Some(2.0));
    assert_eq!(s.waiting, Some(1.0));
}

#[test]
fn over_long_lines_and_text_are_bounded() {
    let long = format!(
        "vllm:num_requests_waiting{{x=\"{}\"}} 5\nvllm:num_requests_running 1\n",
        "a".repeat(prom::MAX_LINE)
    );
    let s = parse(&long);
    assert_eq!((s.waiting, s.running), (None, Some(1.0)));
    // a metric past the byte cap is not read
    let mut big = "# pad\n".repeat(prom::MAX_TEXT / 6 + 1);
    big.push_str("vllm:num_requests_waiting 5\n");
    assert_eq!(parse(&big).waiting, None);
    // invalid UTF-8 in a label value is decoded lossily
    let mut bytes =
        b"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a\xff\"} 1\n".to_vec();
    bytes.extend_from_slice(b"vllm:num_requests_waiting 2\n");
    let s = parse_metrics(&bytes);
    assert_eq!(s.loras_running, vec!["a\u{fffd}"]);
    assert_eq!(s.waiting, Some(2.0));
}

#[test]
fn lora_lists_are_trimmed_deduplicated_capped_and_escaped() {
    let names: Vec<String> = (0..MAX_ADAPTERS + 10).map(|i| format!("a{i}")).collect();
    let text = format!(
        "vllm:lora_requests_info{{running_lora_adapters=\" x , ,x,y\\\"z,{}\",waiting_lora_adapters=\"{}\",max_lora=\"8.0\"}} 1\n",
        "l".repeat(MAX_ADAPTER_NAME + 1),
        names.join(","),
    );
    let s = parse(&text);
    assert_eq!(s.loras_running, vec!["x", "y\"z"]);
    assert_eq!(s.loras_waiting.len(), MAX_ADAPTERS);
    assert_eq!(s.max_lora, Some(8));
    // missing labels: no lists, no slots
    let s = parse("vllm:lora_requests_info 1\n");
    assert_eq!(s, EngineSample::default());
    // a bad max_lora is unknown
    let s = parse("vllm:lora_requests_info{max_lora=\"-1\",running_lora_adapters=\"a\"} 1\n");
    assert_eq!((s.max_lora, s.loras_running.len()), (None, 1));
}

#[test]
fn lora_per_engine_groups_are_unioned() {
    let text = "vllm:lora_requests_info{engine=\"0\",max_lora=\"2\",running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} 10\n\
                vllm:lora_requests_info{engine=\"1\",max_lora=\"3\",running_lora_adapters=\"b\",waiting_lora_adapters=\"a\"} 5\n\
                vllm:lora_requests_info{engine=\"0\",max_lora=\"2\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 9\n";
    let s = parse(text);
    assert_eq!(s.loras_running, vec!["a", "b"]);
    assert_eq!(s.loras_waiting, vec!["a"]);
    assert_eq!(s.max_lora, Some(3));
}

#[test]
fn saturation_is_strictly_over_either_limit_and_unknown_never_saturates() {
    let l = EngineLimits {
        max_queue: 10.0,
        max_kv_usage: 0.9,
    };
    let mut s = EngineSample::default();
    assert!(!saturated(&s, &l));
    s.waiting = Some(10.0);
    s.kv_usage = Some(0.9);
    assert!(!saturated(&s, &l));
    s.waiting = Some(11.0);
    assert!(saturated(&s, &l));
    s.waiting = Some(0.0);
    s.kv_usage = Some(0.95);
    assert!(saturated(&s, &l));
    let nan = EngineLimits {
        max_queue: f64::NAN,
        max_kv_usage: f64::NAN,
    };
    assert!(!saturated(&s, &nan));
}

#[test]
fn lora_tiers() {
    let s = parse(VLLM); // running sql-lora, chat-lora; waiting fr-lora; max 4
    assert_eq!(lora_tier(&s, "sql-lora"), 0);
    assert_eq!(lora_tier(&s, "fr-lora"), 0);
    assert_eq!(lora_tier(&s, "new"), 1); // 3 of 4 slots used
    let full = EngineSample {
        loras_running: vec!["a".into(), "b".into()],
        loras_waiting: vec!["b".into()],
        max_lora: Some(2),
        ..EngineSample::default()
    };
    assert_eq!(lora_tier(&full, "b"), 0);
    assert_eq!(lora_tier(&full, "c"), 2);
    let roomy = EngineSample {
        max_lora: Some(3),
        ..full.clone()
    };
    assert_eq!(lora_tier(&roomy, "c"), 1); // "b" counted once
    assert_eq!(lora_tier(&EngineSample::default(), "c"), 2); // unknown slots
}

#[test]
fn encode_decode_round_trip_and_strictness() {
    for text in [VLLM, SGLANG, LLAMACPP, ""] {
        let s = parse(text);
        let b = s.encode();
        assert_eq!(EngineSample::decode(&b), Some(s.clone()));
        // every strict prefix and any trailing byte is refused
        for n in 0..b.len() {
            assert_eq!(
                EngineSample::decode(&b[..n]),
                None,
                "prefix {n} of {text:.20}"
            );
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(EngineSample::decode(&longer), None);
    }
    assert_eq!(parse("").encode(), vec![1, 0, 0, 0]);
    // unknown version / flag bits, non-finite numbers, bad UTF-8
    assert_eq!(EngineSample::decode(&[2, 0, 0, 0]), None);
    assert_eq!(EngineSample::decode(&[1, 16, 0, 0]), None);
    let mut nan = vec![1, 1];
    nan.extend_from_slice(&f64::NAN.to_le_bytes());
    nan.extend_from_slice(&[0, 0]);
    assert_eq!(EngineSample::decode(&nan), None);
    assert_eq!(EngineSample::decode(&[1, 0, 1, 1, 0, 0xff, 0]), None);
    // encode sanitises what decode would refuse
    let odd = EngineSample {
        waiting: Some(f64::INFINITY),
        running: Some(-1.0),
        ..EngineSample::default()
    };
    assert_eq!(
        EngineSample::decode(&odd.encode()),
        Some(EngineSample::default())
    );
}

/// xorshift64*: deterministic pseudo-random bytes for the hostile mix below.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn random_splices_of_real_expositions_keep_every_invariant() {
    let pieces: Vec<&[u8]> = [VLLM, SGLANG, LLAMACPP]
        .iter()
        .flat_map(|t| t.as_bytes().split_inclusive(|&b| b == b'\n'))
        .chain([
            &b"{"[..],
            b"\"",
            b"\\",
            b" NaN",
            b" -1e400",
            b" 1e400",
            b"\xff\xfe",
            b",max_lora=\"99999999999\"",
        ])
        .collect();
    let mut state = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..2000 {
        let mut text = Vec::new();
        for _ in 0..rng(&mut state) % 24 {
            let p = pieces[(rng(&mut state) % pieces.len() as u64) as usize];
            let cut = (rng(&mut state) % (p.len() as u64 + 1)) as usize;
            text.extend_from_slice(if rng(&mut state) % 3 == 0 {
                &p[..cut]
            } else {
                p
            });
        }
        let s = parse_metrics(&text);
        for v in [s.waiting, s.running].into_iter().flatten() {
            assert!(v.is_finite() && (0.0..=MAX_COUNT).contains(&v));
        }
        assert!(s.kv_usage.map_or(true, |k| (0.0..=1.0).contains(&k)));
        assert!(s.loras_running.len() <= MAX_ADAPTERS && s.loras_waiting.len() <= MAX_ADAPTERS);
        assert_eq!(EngineSample::decode(&s.encode()), Some(s));
    }
}
