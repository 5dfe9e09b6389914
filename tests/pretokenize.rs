//! The Qwen pre-tokenizer scanner against reference splits from Hugging Face `tokenizers`
//! (`pre_tokenizers.Split` with the exact qwen35 and qwen2 regexes; see tests/fixtures/README.md).

use std::path::PathBuf;

use rill::tokenizer::{pretokenize, PreTokenizer};

fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .expect("pieces array")
        .iter()
        .map(|p| p.as_str().expect("piece"))
        .collect()
}

#[test]
fn matches_hf_split_regex() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pretokenize-qwen35.json");
    let text = std::fs::read_to_string(path).expect("read fixture");
    let cases: serde_json::Value = serde_json::from_str(&text).expect("parse fixture");
    let cases = cases.as_array().expect("list of cases");
    assert!(cases.len() > 1000, "fixture has {} cases", cases.len());

    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().expect("text");
        for (key, variant) in [("qwen35", PreTokenizer::Qwen35), ("qwen2", PreTokenizer::Qwen2)] {
            let want = strings(&c[key]);
            let got = pretokenize(text, variant);
            if got != want {
                failures.push(format!("{key} {text:?}\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} splits differ:\n{}",
        failures.len(),
        2 * cases.len(),
        failures.join("\n")
    );
}
