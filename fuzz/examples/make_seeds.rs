//! Writes the committed seed corpus `fuzz/seeds/<target>/` from the fixtures:
//! `cargo run --example make_seeds` (in `fuzz/`). Seeds are kept small: minimised copies of
//! the fixture files, a few inputs per target.

use std::path::{Path, PathBuf};

use rill::gguf::{Array, GgufFile, GgufWriter, Value};
use rill_fuzz::{fixture, tiny_model, Choices};

fn seeds(target: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target);
    std::fs::create_dir_all(&d).expect("seed dir");
    d
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).expect("write seed");
    println!("{} ({} bytes)", dir.join(name).display(), bytes.len());
}

/// A fixture's metadata with every array cut to `keep` elements and its first `n_tensors`
/// tensors of at most 4 KiB: the same structure, a few KB.
fn minimised(name: &str, keep: usize, n_tensors: usize) -> Vec<u8> {
    let f = GgufFile::open(fixture(name)).expect("fixture");
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        let v = match v.as_array() {
            Some(a) => Value::Array(a.iter().take(keep).collect::<Array>()),
            None => v.clone(),
        };
        w.add_kv(k.clone(), v);
    }
    let mut datas = Vec::new();
    for t in f.tensors.iter().filter(|t| t.n_bytes <= 4096).take(n_tensors) {
        let i = w.add_tensor(t.name.clone(), t.ne.clone(), t.ggml_type).expect("tensor");
        datas.push((i, f.tensor_data(t).to_vec()));
    }
    let mut out = Vec::new();
    w.write_header(&mut out).expect("header");
    for (i, d) in datas {
        w.write_tensor_data(&mut out, i, &d).expect("data");
    }
    out
}

fn main() {
    // GGUF reader: minimised fixtures (a model's metadata and small tensors, quant blocks of
    // several types, a vocabulary) and a whole tiny model.
    let dir = seeds("gguf_reader");
    write(&dir, "tiny-dense-min.gguf", &minimised("tiny-dense.F16.gguf", 16, 3));
    write(&dir, "quants-min.gguf", &minimised("quants.gguf", 16, 6));
    write(&dir, "vocab-min.gguf", &minimised("qwen3-vocab.gguf", 32, 0));
    let tiny = tiny_model(&mut Choices::new(&[]));
    write(&dir, "tiny-model.gguf", &tiny);

    // Model: choices for a dense and a MoE model (any bytes describe a model), and a whole file.
    let dir = seeds("model");
    write(&dir, "dense", &[0; 48]);
    write(
        &dir,
        "moe",
        &[0, 0, 2, 255, 1, 0, 0, 1, 0, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 1],
    );
    write(&dir, "tiny-model.gguf", &tiny);

    // Tokenizer: selector byte, parse_special, show_special, then a fixture case's text.
    let cases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("tokenizer-cases.json")).expect("cases")).expect("json");
    let cases = cases["cases"].as_array().expect("cases");
    let dir = seeds("tokenizer");
    for (i, case) in cases.iter().step_by(cases.len() / 6).take(6).enumerate() {
        let text = case["text"].as_str().expect("text");
        let special = if case["parse_special"].as_bool() == Some(true) {
            255
        } else {
            0
        };
        let mut input = vec![i as u8, special, 0];
        input.extend_from_slice(text.as_bytes());
        write(&dir, &format!("case-{i}"), &input);
    }

    // Chat: flags, then messages (role byte + text) separated by 0xFF.
    let dir = seeds("chat");
    let conv = |flags: [u8; 2], msgs: &[(u8, &str)]| {
        let mut out = flags.to_vec();
        for (role, text) in msgs {
            out.push(*role);
            out.extend_from_slice(text.as_bytes());
            out.push(0xFF);
        }
        out
    };
    write(
        &dir,
        "system-user",
        &conv([255, 0], &[(2, "Be brief."), (0, "What is 2+2?")]),
    );
    write(
        &dir,
        "tools",
        &conv(
            [255, 255],
            &[
                (0, "weather?"),
                (1, "<think>\ncall it\n</think>\n\nchecking"),
                (3, "sunny"),
                (3, "22C"),
            ],
        ),
    );
}
