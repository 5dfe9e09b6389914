//! `rill synth`: synthesized files have exactly the layout of the converter's / quantizer's
//! fixtures, the expected type mix, a padded vocabulary, and are deterministic.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rill::gguf::{GgmlType, GgufFile, Value};
use rill::synth::{self, ShapeParams, SynthOptions};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A fresh path in the temp dir, unique per test and process.
fn temp_out(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rill-synth-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{tag}.gguf"))
}

fn opts(shape: &str, quant: &str, tokenizer: &str, tag: &str) -> SynthOptions {
    SynthOptions {
        shape: shape.into(),
        quant: quant.into(),
        layers: None,
        seed: 42,
        tokenizer_from: fixture(tokenizer),
        output: temp_out(tag),
        progress: false,
    }
}

/// Keys whose values legitimately differ between a synthesized file and a converted one.
fn cosmetic(key: &str) -> bool {
    matches!(key, "general.name" | "general.size_label")
}

/// Same tensor names, order, `ne` and (optionally) types; same metadata keys and values.
fn assert_same_layout(got: &GgufFile, want: &GgufFile, compare_types: bool) {
    let names = |f: &GgufFile| f.tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "tensor names / order");
    for w in &want.tensors {
        let g = got.tensor(&w.name).unwrap();
        assert_eq!(g.ne, w.ne, "{}: ne", w.name);
        if compare_types {
            assert_eq!(g.ggml_type, w.ggml_type, "{}: type", w.name);
        }
    }
    let keys = |f: &GgufFile| {
        f.metadata()
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| !cosmetic(k))
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(keys(got), keys(want), "metadata keys");
    for (k, v) in want.metadata() {
        if cosmetic(k) {
            continue;
        }
        assert_eq!(got.get(k), Some(v), "metadata {k}");
    }
}

#[test]
fn tiny_dense_f16_matches_converter_layout() {
    let o = opts("tiny-dense", "f16", "tiny-dense.F16.gguf", "dense-f16");
    let report = synth::synthesize(&o).unwrap();
    let got = GgufFile::open(&o.output).unwrap();
    let want = GgufFile::open(fixture("tiny-dense.F16.gguf")).unwrap();
    assert_same_layout(&got, &want, true);
    assert_eq!(report.tensor_count, want.tensors.len());
    assert_eq!(report.bytes_written, std::fs::metadata(&o.output).unwrap().len());
    // Same tensor sizes ⇒ same data section size as the converter's file.
    assert_eq!(got.file_len() - got.data_start, want.file_len() - want.data_start);
}

#[test]
fn tiny_moe_f16_matches_converter_layout() {
    let o = opts("tiny-moe", "f16", "tiny-moe.F16.gguf", "moe-f16");
    synth::synthesize(&o).unwrap();
    let got = GgufFile::open(&o.output).unwrap();
    let want = GgufFile::open(fixture("tiny-moe.F16.gguf")).unwrap();
    assert_same_layout(&got, &want, true);
}

/// The converter's `--outtype q8_0` file: same types (F32 vectors, Q8_0 matrices).
#[test]
fn tiny_dense_q8_0_matches_converter_types() {
    let o = opts("tiny-dense", "q8_0", "tiny-dense.F16.gguf", "dense-q8");
    synth::synthesize(&o).unwrap();
    let got = GgufFile::open(&o.output).unwrap();
    let want = GgufFile::open(fixture("tiny-dense.Q8_0.gguf")).unwrap();
    for w in &want.tensors {
        let g = got.tensor(&w.name).unwrap();
        assert_eq!((g.ggml_type, &g.ne), (w.ggml_type, &w.ne), "{}", w.name);
    }
    assert_eq!(got.get("general.file_type"), want.get("general.file_type"));
}

/// llama-quantize's Q4_K_M of tiny-dense (n_embd 64: Q5_0/Q8_0 fallbacks): same type per tensor.
#[test]
fn tiny_dense_q4_k_m_matches_quantizer_types() {
    let o = opts("tiny-dense", "q4_k_m", "tiny-dense.F16.gguf", "dense-q4km");
    synth::synthesize(&o).unwrap();
    let got = GgufFile::open(&o.output).unwrap();
    let want = GgufFile::open(fixture("tiny-dense.Q4_K_M.gguf")).unwrap();
    assert_eq!(got.tensors.len(), want.tensors.len());
    for w in &want.tensors {
        let g = got.tensor(&w.name).unwrap();
        assert_eq!((g.ggml_type, &g.ne), (w.ggml_type, &w.ne), "{}", w.name);
    }
    assert_eq!(got.get("general.file_type"), Some(&Value::U32(15)));
}

/// A tiny shape with 256-multiple rows, untied, and a vocabulary larger than the tokenizer's.
fn small_k_shape() -> ShapeParams {
    ShapeParams {
        n_embd: 256,
        n_ff: 512,
        n_vocab: 8200,
        tied: false,
        source: "test",
        ..synth::shape("tiny-dense").unwrap()
    }
}

#[test]
fn q4_k_m_type_mix_and_padded_vocab() {
    let p = small_k_shape();
    let o = opts("small-k", "q4_k_m", "tiny-dense.F16.gguf", "small-q4km");
    let report = synth::synthesize_params(&p, &o).unwrap();
    let f = GgufFile::open(&o.output).unwrap();
    let ty = |name: &str| f.tensor(name).unwrap().ggml_type;

    assert_eq!(ty("output.weight"), GgmlType::Q6K);
    assert_eq!(ty("token_embd.weight"), GgmlType::Q4K);
    // use_more_bits(i, 8) = {0, 3, 6, 7}; attn_qkv (linear) and attn_v (full) share the class.
    for i in 0..8 {
        let more = [0, 3, 6, 7].contains(&i);
        let hi = |b: bool| if b { GgmlType::Q6K } else { GgmlType::Q4K };
        assert_eq!(ty(&format!("blk.{i}.ffn_down.weight")), hi(more), "ffn_down {i}");
        assert_eq!(ty(&format!("blk.{i}.ffn_up.weight")), GgmlType::Q4K);
        if (i + 1) % 4 == 0 {
            assert_eq!(ty(&format!("blk.{i}.attn_v.weight")), hi(more), "attn_v {i}");
            assert_eq!(ty(&format!("blk.{i}.attn_k.weight")), GgmlType::Q4K);
            assert_eq!(ty(&format!("blk.{i}.attn_q_norm.weight")), GgmlType::F32);
        } else {
            assert_eq!(ty(&format!("blk.{i}.attn_qkv.weight")), hi(more), "attn_qkv {i}");
            assert_eq!(ty(&format!("blk.{i}.ssm_alpha.weight")), GgmlType::Q4K);
            assert_eq!(ty(&format!("blk.{i}.ssm_conv1d.weight")), GgmlType::F32);
            assert_eq!(ty(&format!("blk.{i}.ssm_a")), GgmlType::F32);
        }
    }
    // Every 1-D tensor is F32.
    for t in &f.tensors {
        if t.ne.len() == 1 {
            assert_eq!(t.ggml_type, GgmlType::F32, "{}", t.name);
        }
    }
    let q4 = &report.type_mix["Q4_K"];
    assert!(q4.tensors > report.type_mix["Q6_K"].tensors);

    // Vocabulary: 8192 real tokens, then [PAD<id>] UNUSED up to n_vocab.
    let array = |key: &str| -> Vec<Value> { f.get(key).and_then(Value::as_array).unwrap().iter().collect() };
    let (tokens, types) = (array("tokenizer.ggml.tokens"), array("tokenizer.ggml.token_type"));
    assert_eq!((tokens.len(), types.len()), (8200, 8200));
    assert_eq!(tokens[8199].as_str(), Some("[PAD8199]"));
    assert_eq!(tokens[8192].as_str(), Some("[PAD8192]"));
    assert_ne!(tokens[8191].as_str(), Some("[PAD8191]"));
    assert!(types[8192..].iter().all(|t| t.as_i64() == Some(5)));
    let src = GgufFile::open(fixture("tiny-dense.F16.gguf")).unwrap();
    assert_eq!(f.get("tokenizer.ggml.merges"), src.get("tokenizer.ggml.merges"));
    assert_eq!(f.get("tokenizer.chat_template"), src.get("tokenizer.chat_template"));
}

#[test]
fn same_seed_same_bytes() {
    let p = small_k_shape();
    let a = opts("small-k", "q4_k_m", "tiny-dense.F16.gguf", "det-a");
    let b = SynthOptions {
        output: temp_out("det-b"),
        ..a.clone()
    };
    let c = SynthOptions {
        output: temp_out("det-c"),
        seed: 43,
        ..a.clone()
    };
    for o in [&a, &b, &c] {
        synth::synthesize_params(&p, o).unwrap();
    }
    let read = |o: &SynthOptions| std::fs::read(&o.output).unwrap();
    assert!(read(&a) == read(&b), "same seed must give identical files");
    assert!(read(&a) != read(&c), "another seed must give other weights");
}

/// Values follow the recipe: norms around 1, ssm_a negative, matrices finite and centred.
#[test]
fn weight_ranges() {
    let o = opts("tiny-moe", "f16", "tiny-moe.F16.gguf", "moe-ranges");
    synth::synthesize(&o).unwrap();
    let f = GgufFile::open(&o.output).unwrap();
    let values = |name: &str| {
        let t = f.tensor(name).unwrap();
        let mut v = vec![0f32; t.n_elements as usize];
        rill::quant::dequantize(t.ggml_type, f.tensor_data(t), &mut v).unwrap();
        v
    };
    assert!(values("blk.0.attn_norm.weight")
        .iter()
        .all(|x| (0.75..=1.25).contains(x)));
    assert!(values("blk.0.ssm_norm.weight")
        .iter()
        .all(|x| (0.75..=1.25).contains(x)));
    assert!(values("blk.0.ssm_a").iter().all(|x| (-4.0..=-0.02).contains(x)));
    let router = values("blk.0.ffn_gate_inp.weight");
    let std = (router.iter().map(|x| x * x).sum::<f32>() / router.len() as f32).sqrt();
    assert!((std - 0.25).abs() < 0.03, "router std {std}");
    let qkv = values("blk.0.attn_qkv.weight");
    let std = (qkv.iter().map(|x| x * x).sum::<f32>() / qkv.len() as f32).sqrt();
    assert!((std - 0.125).abs() < 0.005, "attn_qkv std {std}");
}

/// Pooled tensors (large K-quant ones: here the 1024 × 8192 embedding and LM head) keep the
/// init distribution and distinct rows, and are deterministic too.
#[test]
fn pooled_tensors_look_random() {
    let p = ShapeParams {
        n_embd: 1024,
        n_layer: 4,
        ..small_k_shape()
    };
    let o = opts("pooled", "q4_k_m", "tiny-dense.F16.gguf", "pooled");
    synth::synthesize_params(&p, &o).unwrap();
    let again = SynthOptions {
        output: temp_out("pooled-again"),
        ..o.clone()
    };
    synth::synthesize_params(&p, &again).unwrap();
    assert!(std::fs::read(&o.output).unwrap() == std::fs::read(&again.output).unwrap());
    let f = GgufFile::open(&o.output).unwrap();
    for (name, want_std) in [("token_embd.weight", 1.0f32), ("output.weight", 0.5)] {
        let t = f.tensor(name).unwrap();
        let mut v = vec![0f32; t.n_elements as usize];
        rill::quant::dequantize(t.ggml_type, f.tensor_data(t), &mut v).unwrap();
        let n = v.len() as f32;
        let mean = v.iter().sum::<f32>() / n;
        let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n).sqrt();
        assert!(mean.abs() < 0.01, "{name}: mean {mean}");
        assert!((std - want_std).abs() < 0.03 * want_std, "{name}: std {std}");
        let rows: BTreeSet<Vec<u32>> = v
            .chunks(1024)
            .take(2000)
            .map(|r| r.iter().map(|x| x.to_bits()).collect())
            .collect();
        assert_eq!(rows.len(), 2000, "{name}: rows must be distinct");
    }
}

#[test]
fn layers_option_keeps_the_attention_pattern() {
    let mut o = opts("tiny-dense", "f16", "tiny-dense.F16.gguf", "dense-4l");
    o.layers = Some(4);
    synth::synthesize(&o).unwrap();
    let f = GgufFile::open(&o.output).unwrap();
    assert_eq!(f.get("qwen35.block_count"), Some(&Value::U32(4)));
    let rec = f
        .get("qwen35.attention.recurrent_layers")
        .and_then(Value::as_array)
        .unwrap();
    let rec: Vec<bool> = rec.iter().filter_map(|v| v.as_bool()).collect();
    assert_eq!(rec, [true, true, true, false]);
    assert!(f.tensor("blk.3.attn_q.weight").is_some());
    assert!(f.tensor("blk.4.attn_norm.weight").is_none());
    o.layers = Some(9);
    assert!(synth::synthesize(&o).is_err());
}

#[test]
fn oversized_tokenizer_is_refused() {
    // The real Qwen3 vocabulary (151,936 ids) does not fit the tiny shapes' 8,192.
    let o = opts("tiny-dense", "f16", "qwen3-vocab.gguf", "too-big");
    assert!(synth::synthesize(&o).is_err());
}
