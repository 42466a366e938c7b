//! Integration test of the `prefix-load` binary against a real `replica-emulator` on loopback:
//! the JSON summary's hit rate must equal the replica's own counters and the usage it returned,
//! and `prefix-load table` must print the runs side by side.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

mod support;
use support::Emu;

fn start_emulator() -> (Emu, u16) {
    let emu = Emu::start(&[
        "--id",
        "solo",
        "--prefill-us-per-token",
        "20",
        "--decode-ms-per-token",
        "1",
    ]);
    let port = emu.port;
    (emu, port)
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("prefix-load-test-{}-{name}", std::process::id()))
}

fn load(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_prefix-load"))
        .args(args)
        .output()
        .expect("run prefix-load");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn summary_matches_replica_counters_and_table_compares_runs() {
    let (_emu, port) = start_emulator();
    let url = format!("http://127.0.0.1:{port}");
    let (a, b) = (tmp("a.json"), tmp("b.json"));
    let common = [
        "--url",
        &url,
        "--replica",
        &url,
        "--requests",
        "30",
        "--max-tokens",
        "3",
        "--timeout-s",
        "20",
        "--max-duration-s",
        "60",
    ];
    let mut args_a: Vec<&str> = common.to_vec();
    let a_s = a.to_str().unwrap();
    args_a.extend([
        "--workload",
        "shared-prefix",
        "--groups",
        "2",
        "--prefix-tokens",
        "300",
        "--concurrency",
        "1",
        "--label",
        "sp",
        "--json",
        a_s,
    ]);
    let (ok, out) = load(&args_a);
    assert!(ok, "{out}");
    assert!(out.contains("[sp] shared-prefix n=30 ok=30 err=0"), "{out}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&a).unwrap()).unwrap();
    assert_eq!(s["ok"], 30);
    assert_eq!(s["errors"], 0);
    // Sequential requests over 2 groups: only each group's first request misses its prefix.
    let hit = s["hit_rate"].as_f64().unwrap();
    let client_hit = s["client_hit_rate"].as_f64().unwrap();
    assert!(hit > 0.7 && hit < 1.0, "hit rate {hit}");
    assert!(
        (hit - client_hit).abs() < 1e-9,
        "server {hit} vs usage {client_hit}"
    );
    assert_eq!(s["replicas"][0]["id"], "solo");
    assert_eq!(s["replicas"][0]["requests"], 30);
    assert_eq!(s["share_source"], "x-replica-id");
    assert!(s["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);
    assert!(s["ttft_ms"]["p50"].as_f64() <= s["latency_ms"]["p50"].as_f64());

    // Multi-turn, concurrent: turns of a chat run in order, so later turns hit the history.
    let b_s = b.to_str().unwrap();
    let mut args_b: Vec<&str> = common.to_vec();
    args_b.extend([
        "--workload",
        "multi-turn",
        "--conversations",
        "6",
        "--turns",
        "5",
        "--concurrency",
        "8",
        "--label",
        "mt",
        "--json",
        b_s,
    ]);
    let (ok, out) = load(&args_b);
    assert!(ok, "{out}");
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&b).unwrap()).unwrap();
    assert_eq!(s["ok"], 30);
    assert!(s["hit_rate"].as_f64().unwrap() > 0.5, "{}", s["hit_rate"]);

    let (ok, table) = load(&["table", a_s, b_s]);
    assert!(ok, "{table}");
    let head = table.lines().next().unwrap();
    assert!(head.contains("sp") && head.contains("mt"), "{table}");
    assert!(table.contains("hit rate (server)"));
    // A missing file is an error, not an empty table.
    let (ok, _) = load(&["table", "/nonexistent/x.json"]);
    assert!(!ok);
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
}

#[test]
fn unreachable_target_reports_errors_and_fails() {
    // Port 1 on loopback: nothing listens there.
    let (ok, out) = load(&[
        "--url",
        "http://127.0.0.1:1",
        "--workload",
        "unique",
        "--requests",
        "3",
        "--timeout-s",
        "5",
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("err=3"), "{out}");
}

/// `--trace`: a Mooncake-style file (epoch-nanosecond strings, 32-token blocks) is replayed at
/// its own times: the requests that repeat an earlier prefix hit it, the time scale stretches
/// the run, and a malformed line is an error naming it.
#[test]
fn trace_replay_keeps_times_and_prefixes() {
    let (_emu, port) = start_emulator();
    let url = format!("http://127.0.0.1:{port}");
    let path = tmp("trace.jsonl");
    let base: u128 = 1_764_460_800_000_000_000;
    let mut text = String::new();
    for i in 0..6u128 {
        // Requests 0, 2, 4 share blocks 7, 8, 9; 1, 3, 5 are unique. 100 ms apart.
        let ids = if i % 2 == 0 {
            "[7, 8, 9]".to_string()
        } else {
            format!("[{}, {}, {}]", 100 + 3 * i, 101 + 3 * i, 102 + 3 * i)
        };
        text.push_str(&format!(
            "{{\"timestamp\": \"{}\", \"input_length\": 90, \"output_length\": 50, \"hash_ids\": {ids}}}\n",
            base + i * 100_000_000
        ));
    }
    std::fs::write(&path, &text).unwrap();
    let p = path.to_str().unwrap();
    let out_json = tmp("trace.json");
    let j = out_json.to_str().unwrap();
    let (ok, out) = load(&[
        "--url",
        &url,
        "--replica",
        &url,
        "--trace",
        p,
        "--time-scale",
        "4",
        "--max-tokens",
        "2",
        "--json",
        j,
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("block 32 tokens") && out.contains("time unit ns"),
        "{out}"
    );
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&out_json).unwrap()).unwrap();
    assert_eq!(s["ok"], 6);
    // Last arrival at 0.5 s × 4 = 2 s.
    assert!(
        s["duration_s"].as_f64().unwrap_or(0.0) >= 2.0,
        "{}",
        s["duration_s"]
    );
    // Two of the three shared-prefix requests reuse 80 of their 90+ prompt tokens.
    let hit = s["hit_rate"].as_f64().unwrap();
    assert!(hit > 0.2 && hit < 0.5, "hit rate {hit}");
    std::fs::write(&path, format!("{text}{{\"timestamp\": 1}}\n")).unwrap();
    let (ok, out) = load(&["--url", &url, "--trace", p]);
    assert!(!ok && out.contains("line 7"), "{out}");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&out_json);
}
