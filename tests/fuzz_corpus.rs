//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/*`) through the same property
//! functions the libFuzzer targets run (`tests/support/fuzz_props.rs`), on stable Rust without
//! libFuzzer: every input found interesting while fuzzing stays a regression test.

#[path = "support/fuzz_props.rs"]
mod props;

use std::path::Path;

use prefix_router::extract::BodyKind;

#[test]
fn every_corpus_file_keeps_every_property() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut total = 0;
    for (target, prop) in props::TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        assert!(!files.is_empty(), "empty corpus {}", dir.display());
        // The two JSON targets read the same kind of input: each also replays the other's.
        if let Some(other) = match *target {
            "json_scanner" => Some("extract"),
            "extract" => Some("json_scanner"),
            _ => None,
        } {
            let dir = root.join(other);
            files.extend(
                std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
        files.sort();
        for f in &files {
            let data = std::fs::read(f).expect("read corpus file");
            if std::panic::catch_unwind(|| prop(&data)).is_err() {
                panic!("{target}: property failed on {}", f.display());
            }
        }
        total += files.len();
    }
    println!("replayed {total} corpus files");
}

/// The properties can fail: a body the oracle and `extract` disagree on is caught, and the
/// scanner's leniencies are recognised as such.
#[test]
fn properties_hold_on_handwritten_cases() {
    assert!(props::lenient_only(br#"{"a":01}"#));
    assert!(props::lenient_only(b"{\"a\":\"\\ud800\"}"));
    assert!(!props::lenient_only(
        b"{\"a\":\"\\ud83e\\udd8a\",\"b\":[-0.5e+3]}"
    ));
    // valid JSON the scanner must accept; invalid JSON without leniency it must refuse
    props::json_scanner(br#"{"a":[1,{"b":null}]}"#);
    props::json_scanner(br#"{"a":[1,]}"#);
    assert!(std::panic::catch_unwind(|| props::prometheus(&[1, 1, 0, 0])).is_ok());
    // the peers seeds are accepted batches (the decode side of the property runs on them)
    let seed =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/peers/seed-04"))
            .expect("seed");
    let (slots, lay) = (1 << 16, prefix_router::peers::layout(1 << 16, &[]));
    let batch = prefix_router::peers::decode(&seed[1..], lay, 4096, slots, 5).expect("a batch");
    assert_eq!(batch.entries.len(), 7);
    props::peer_batch(&seed);
    // the oracle builds the text itself: "You are helpful." + "Hi" = 18 characters
    let chat = br#"{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":[{"type":"text","text":"Hi"}]}]}"#;
    assert_eq!(props::oracle(chat), Some((BodyKind::Chat, 18)));
    props::extract_text(chat);
    let tokens = br#"{"prompt":[1,22,-3,4.5]}"#; // ids: their digits ("1" "22" "-3"), floats: nothing
    assert_eq!(props::oracle(tokens), Some((BodyKind::Completions, 5)));
    props::extract_text(tokens);
    assert_eq!(props::oracle(br#"{"model":1,"prompt":"x"}"#), None); // Malformed
                                                                     // Python's reading: null is absent, the last duplicate wins, keys are unescaped
    assert_eq!(
        props::oracle(br#"{"model":null,"prompt":"xy"}"#),
        Some((BodyKind::Completions, 2))
    );
    let dup = br#"{"m\u0065ssages":[{"content":"first"}],"messages":[{"content":"second!"}]}"#;
    assert_eq!(props::oracle(dup), Some((BodyKind::Chat, 7)));
    // a prompt field twice in one message is refused; media are digests, not text
    assert_eq!(
        props::oracle(br#"{"messages":[{"content":"a","content":"b"}]}"#),
        None
    );
    let media =
        br#"{"messages":[{"content":[{"image_url":{"url":"A","detail":"low"}},{"text":"x"}]}]}"#;
    assert_eq!(props::oracle(media), Some((BodyKind::Chat, 1)));
    for body in [&br#"{"model":null,"prompt":"xy"}"#[..], dup, media] {
        props::extract_text(body);
    }
}
