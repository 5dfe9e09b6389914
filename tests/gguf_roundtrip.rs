//! Writer → reader round trips and facts about the real fixture files.

use rill::gguf::{GgmlType, GgufFile, GgufWriter, Value};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Every value type, nested arrays, empty string and empty array.
fn all_kinds_of_metadata() -> Vec<(String, Value)> {
    let kvs = vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-3)),
        ("t.bool_t", Value::Bool(true)),
        ("t.bool_f", Value::Bool(false)),
        ("t.string", Value::String("héllo wörld ✓".into())),
        ("t.empty_string", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(-2.25e300)),
        ("t.empty_array", Value::Array(vec![].into())),
        (
            "t.arr_i32",
            Value::Array(vec![Value::I32(1), Value::I32(-2), Value::I32(3)].into()),
        ),
        (
            "t.arr_bool",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)].into()),
        ),
        (
            "t.arr_f64",
            Value::Array(vec![Value::F64(0.5), Value::F64(-0.25)].into()),
        ),
        (
            "t.arr_str",
            Value::Array(
                vec![
                    Value::String("a".into()),
                    Value::String(String::new()),
                    Value::String("Ġthe".into()),
                ]
                .into(),
            ),
        ),
        (
            "t.nested",
            Value::Array(
                vec![
                    Value::Array(vec![Value::U16(1), Value::U16(2)].into()),
                    Value::Array(vec![].into()),
                    Value::Array(vec![Value::U16(3)].into()),
                ]
                .into(),
            ),
        ),
        (
            "t.nested3",
            Value::Array(
                vec![Value::Array(
                    vec![Value::Array(vec![Value::String("deep".into())].into())].into(),
                )]
                .into(),
            ),
        ),
        ("general.alignment", Value::U32(64)),
    ];
    kvs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn tensor_specs() -> Vec<(&'static str, Vec<u64>, GgmlType)> {
    vec![
        ("w.f32", vec![7], GgmlType::F32),
        ("w.f16", vec![3, 5], GgmlType::F16),
        ("w.bf16", vec![2, 3, 4], GgmlType::Bf16),
        ("w.q8_0", vec![64, 3], GgmlType::Q8_0),
        ("w.q4_k", vec![256, 2, 1, 2], GgmlType::Q4K),
        ("w.q6_k", vec![512, 1], GgmlType::Q6K),
        ("w.iq4_xs", vec![256, 3], GgmlType::Iq4Xs),
    ]
}

/// Deterministic, tensor-specific bytes so misplaced data is detected.
fn pattern(index: usize, len: u64) -> Vec<u8> {
    (0..len).map(|i| (i as usize * 31 + index * 7 + 1) as u8).collect()
}

fn write_file(kvs: &[(String, Value)], specs: &[(&str, Vec<u64>, GgmlType)]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.add_kv(k.clone(), v.clone());
    }
    let idx: Vec<usize> = specs
        .iter()
        .map(|(n, ne, ty)| w.add_tensor(*n, ne.clone(), *ty).expect("valid tensor"))
        .collect();
    let mut out = Vec::new();
    w.write_header(&mut out).expect("header");
    for &i in &idx {
        let data = pattern(i, w.tensor_size(i));
        w.write_tensor_data(&mut out, i, &data).expect("data");
    }
    out
}

#[test]
fn roundtrip_all_value_types_and_tensors() {
    let kvs = all_kinds_of_metadata();
    let specs = tensor_specs();
    let bytes = write_file(&kvs, &specs);
    let len = bytes.len() as u64;
    let f = GgufFile::from_bytes(bytes).expect("parse");

    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 64);
    assert_eq!(f.data_start % 64, 0);
    assert_eq!(f.file_len(), len);
    assert_eq!(f.metadata(), &kvs[..]);
    for (k, v) in &kvs {
        assert_eq!(f.get(k), Some(v), "key {k}");
    }
    assert_eq!(f.get("missing"), None);

    assert_eq!(f.tensors.len(), specs.len());
    for (i, (name, ne, ty)) in specs.iter().enumerate() {
        let t = f.tensor(name).expect("tensor present");
        assert_eq!(&f.tensors[i], t, "file order");
        assert_eq!(&t.ne, ne);
        assert_eq!(t.ggml_type, *ty);
        assert_eq!(t.offset % 64, 0);
        assert_eq!(t.n_elements, ne.iter().product::<u64>());
        assert_eq!(
            t.n_bytes,
            ne[0] / ty.block_size() * ty.type_size() * ne[1..].iter().product::<u64>()
        );
        let shape: Vec<usize> = ne.iter().rev().map(|&d| d as usize).collect();
        assert_eq!(t.shape(), shape);
        let expect = pattern(i, t.n_bytes);
        assert_eq!(f.tensor_data(t), &expect[..], "data of {name}");
        assert_eq!(f.tensor_bytes(t).as_slice(), &expect[..]);
    }
    assert!(f.tensor("nope").is_none());
}

#[test]
fn default_alignment_is_32_and_no_tensors_is_fine() {
    let bytes = write_file(&[("a".to_owned(), Value::U8(1))], &[]);
    assert_eq!(bytes.len() % 32, 0);
    let f = GgufFile::from_bytes(bytes).expect("parse");
    assert_eq!(f.alignment, 32);
    assert!(f.tensors.is_empty());
    assert_eq!(f.data_start, f.file_len());
}

#[test]
fn tensor_bytes_outlive_the_file() {
    let bytes = write_file(&[], &tensor_specs());
    let f = GgufFile::from_bytes(bytes).expect("parse");
    let t = f.tensor("w.q8_0").expect("tensor").clone();
    let view = f.tensor_bytes(&t);
    drop(f);
    assert_eq!(view.len() as u64, t.n_bytes);
    assert_eq!(view.as_slice(), &pattern(3, t.n_bytes)[..]);
}

#[test]
fn open_reads_written_file() {
    let bytes = write_file(&all_kinds_of_metadata(), &tensor_specs());
    let path = std::env::temp_dir().join(format!("rill-gguf-roundtrip-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).expect("write temp file");
    let f = GgufFile::open(&path).expect("open");
    let _ = std::fs::remove_file(&path);
    assert_eq!(f.file_len(), bytes.len() as u64);
    assert_eq!(f.tensors.len(), tensor_specs().len());
}

#[test]
fn open_missing_file_is_io_error_with_path() {
    let err = GgufFile::open("/nonexistent/rill/x.gguf").expect_err("must fail");
    assert!(
        matches!(err, rill::Error::Io { ref path, .. } if path.ends_with("x.gguf")),
        "{err:?}"
    );
}

#[test]
fn writer_rejects_bad_tensors_and_misuse() {
    use rill::error::GgufError as G;
    use rill::Error as E;
    let mut w = GgufWriter::new();
    assert!(matches!(
        w.add_tensor("a", vec![], GgmlType::F32),
        Err(E::Gguf(G::BadDims { .. }))
    ));
    assert!(matches!(
        w.add_tensor("a", vec![1; 5], GgmlType::F32),
        Err(E::Gguf(G::BadDims { .. }))
    ));
    assert!(matches!(
        w.add_tensor("a", vec![4, 0], GgmlType::F32),
        Err(E::Gguf(G::BadShape { dim: 1, .. }))
    ));
    assert!(matches!(
        w.add_tensor("a", vec![100], GgmlType::Q4K),
        Err(E::Gguf(G::RowNotBlockMultiple { .. }))
    ));
    assert!(matches!(
        w.add_tensor("a", vec![u64::MAX, 2], GgmlType::F32),
        Err(E::Gguf(G::BadShape { dim: 1, .. }))
    ));
    assert!(matches!(
        w.add_tensor("a", vec![1 << 62], GgmlType::F32),
        Err(E::Gguf(G::SizeOverflow { .. }))
    ));
    assert_eq!(w.add_tensor("a", vec![4], GgmlType::F32).ok(), Some(0));
    assert_eq!(w.add_tensor("b", vec![4], GgmlType::F32).ok(), Some(1));
    assert!(matches!(
        w.add_tensor("a", vec![4], GgmlType::F32),
        Err(E::Gguf(G::DuplicateTensor(_)))
    ));
    let mut out = Vec::new();
    w.write_header(&mut out).expect("header");
    assert!(matches!(
        w.write_tensor_data(&mut out, 1, &[0; 16]),
        Err(E::InvalidArgument(_))
    ));
    assert!(matches!(
        w.write_tensor_data(&mut out, 0, &[0; 15]),
        Err(E::InvalidArgument(_))
    ));
    w.write_tensor_data(&mut out, 0, &[1; 16]).expect("a");
    w.write_tensor_data(&mut out, 1, &[2; 16]).expect("b");
    assert!(matches!(
        w.write_tensor_data(&mut out, 2, &[]),
        Err(E::InvalidArgument(_))
    ));
    assert!(GgufFile::from_bytes(out).is_ok());

    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", Value::U32(3));
    assert!(matches!(
        w.write_header(&mut Vec::new()),
        Err(E::Gguf(G::BadAlignment(3)))
    ));
    w.add_kv("general.alignment", Value::U64(32));
    assert!(matches!(
        w.write_header(&mut Vec::new()),
        Err(E::Gguf(G::BadAlignmentType(_)))
    ));
    w.add_kv("general.alignment", Value::U32(16));
    w.add_kv("mixed", Value::Array(vec![Value::U8(1), Value::I8(1)].into()));
    assert!(matches!(w.write_header(&mut Vec::new()), Err(E::InvalidArgument(_))));
}

#[test]
fn add_kv_replaces_existing_key_in_place() {
    let mut w = GgufWriter::new();
    w.add_kv("a", Value::U8(1));
    w.add_kv("b", Value::U8(2));
    w.add_kv("a", Value::U8(3));
    let mut out = Vec::new();
    w.write_header(&mut out).expect("header");
    let f = GgufFile::from_bytes(out).expect("parse");
    assert_eq!(
        f.metadata(),
        &[("a".to_owned(), Value::U8(3)), ("b".to_owned(), Value::U8(2))][..]
    );
}

#[test]
fn large_string_array_roundtrip_is_fast() {
    // The real vocabulary has ~248k tokens; parsing must stay a single cheap pass.
    let n = 250_000;
    let tokens: Vec<Value> = (0..n).map(|i| Value::String(format!("tok{i}"))).collect();
    let mut w = GgufWriter::new();
    w.add_kv("tokenizer.ggml.tokens", Value::Array(tokens.into()));
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    w.write_header(&mut out).expect("header");
    let f = GgufFile::from_bytes(out).expect("parse");
    let elapsed = start.elapsed();
    let arr = f.get("tokenizer.ggml.tokens").and_then(Value::as_array).expect("array");
    assert_eq!(arr.len(), n);
    assert_eq!(arr.strs().nth(12345), Some(Some("tok12345")));
    assert!(elapsed.as_secs_f64() < 2.0, "write+parse took {elapsed:?}");
}

fn assert_all_tensors_within_file(f: &GgufFile) {
    for t in &f.tensors {
        assert_eq!(t.offset % f.alignment, 0, "{}", t.name);
        assert!(f.data_start + t.offset + t.n_bytes <= f.file_len(), "{}", t.name);
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
    }
}

#[test]
fn tiny_dense_f16_fixture() {
    let f = GgufFile::open(fixture("tiny-dense.F16.gguf")).expect("open fixture");
    assert_eq!(f.get("general.architecture").and_then(Value::as_str), Some("qwen35"));
    assert_eq!(f.get("qwen35.block_count").and_then(Value::as_u64), Some(8));
    assert_eq!(f.alignment, 32);
    let emb = f.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(emb.ne, vec![64, 8192]);
    assert_eq!(emb.ggml_type, GgmlType::F16);
    assert_eq!(emb.shape(), vec![8192, 64]);
    assert_eq!(emb.n_bytes, 64 * 8192 * 2);
    let tokens = f
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .expect("tokens");
    assert_eq!(tokens.len(), 8192);
    assert!(tokens.iter().all(|t| t.as_str().is_some()));
    assert_all_tensors_within_file(&f);
}

#[test]
fn quants_fixture() {
    let f = GgufFile::open(fixture("quants.gguf")).expect("open fixture");
    assert_eq!(f.tensors.len(), 14);
    for t in &f.tensors {
        assert_eq!(t.name, format!("q.{}", t.ggml_type.name()));
        assert_eq!(t.ne, vec![512, 8]);
    }
    assert_all_tensors_within_file(&f);
}

#[test]
fn other_fixtures_parse() {
    for name in [
        "tiny-dense.Q4_K_M.gguf",
        "tiny-dense.Q8_0.gguf",
        "tiny-moe.F16.gguf",
        "qwen3-vocab.gguf",
    ] {
        let f = GgufFile::open(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_all_tensors_within_file(&f);
    }
}
