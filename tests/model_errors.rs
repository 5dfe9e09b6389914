//! Files that are valid GGUF but not a runnable Qwen3.5 model give a clear error naming the problem.

use std::path::{Path, PathBuf};

use rill::backend;
use rill::exec::Model;
use rill::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use rill::Error;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Rewrite the tiny dense model with edits: `kv` maps (key, value) to a replacement (None drops it);
/// `tensor` maps (name, ne, type) to a replacement (None drops it).
fn rewrite(
    out_name: &str,
    kv: impl Fn(&str, &Value) -> Option<Value>,
    tensor: impl Fn(&str, &[u64], GgmlType) -> Option<(Vec<u64>, GgmlType)>,
) -> PathBuf {
    let src = GgufFile::open(Path::new(FIX).join("tiny-dense.F16.gguf")).expect("fixture");
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if let Some(v) = kv(k, v) {
            w.add_kv(k.clone(), v);
        }
    }
    let mut datas = Vec::new();
    for t in &src.tensors {
        if let Some((ne, ty)) = tensor(&t.name, &t.ne, t.ggml_type) {
            let idx = w.add_tensor(t.name.clone(), ne, ty).expect("add tensor");
            let size = w.tensor_size(idx) as usize;
            // Keep the original bytes where sizes agree, else zeros of the new size.
            let data = if size == t.n_bytes as usize {
                src.tensor_data(t).to_vec()
            } else {
                vec![0u8; size]
            };
            datas.push((idx, data));
        }
    }
    let path = std::env::temp_dir().join(format!("rill-model-errors-{}-{out_name}", std::process::id()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    w.write_header(&mut f).expect("header");
    for (idx, data) in datas {
        w.write_tensor_data(&mut f, idx, &data).expect("data");
    }
    drop(f);
    path
}

fn load(path: &Path) -> Result<Model, Error> {
    Model::open(path, backend::create("cpu").expect("cpu"))
}

fn keep_kv(_: &str, v: &Value) -> Option<Value> {
    Some(v.clone())
}

fn keep_t(_: &str, ne: &[u64], ty: GgmlType) -> Option<(Vec<u64>, GgmlType)> {
    Some((ne.to_vec(), ty))
}

#[test]
fn unchanged_rewrite_loads() {
    load(&rewrite("same.gguf", keep_kv, keep_t)).expect("an unchanged copy loads");
}

#[test]
fn missing_tensor_is_named() {
    let p = rewrite("missing.gguf", keep_kv, |n, ne, ty| {
        (n != "blk.1.ssm_a").then(|| (ne.to_vec(), ty))
    });
    let e = load(&p).err().expect("must fail");
    assert!(matches!(&e, Error::Tensor { name, .. } if name == "blk.1.ssm_a"), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn wrong_shape_is_named() {
    let p = rewrite("shape.gguf", keep_kv, |n, ne, ty| {
        if n == "blk.3.attn_k.weight" {
            Some((vec![64, 512], ty))
        } else {
            Some((ne.to_vec(), ty))
        }
    });
    let e = load(&p).err().expect("must fail");
    assert!(
        matches!(&e, Error::Tensor { name, .. } if name == "blk.3.attn_k.weight"),
        "{e}"
    );
}

#[test]
fn unsupported_tensor_type_is_named() {
    // Q8_1 is a valid ggml type (block 32) used only for activations; rill does not run it as a weight: a clear error naming the tensor.
    let p = rewrite("type.gguf", keep_kv, |n, ne, ty| {
        Some((
            ne.to_vec(),
            if n == "blk.0.ffn_up.weight" { GgmlType::Q8_1 } else { ty },
        ))
    });
    let e = load(&p).err().expect("must fail");
    assert!(
        matches!(&e, Error::UnsupportedType { tensor, type_name, .. } if tensor == "blk.0.ffn_up.weight" && type_name == "Q8_1"),
        "{e}"
    );
}

#[test]
fn other_architecture_is_rejected() {
    for arch in ["llama", "qwen3next", "qwen2"] {
        let p = rewrite(
            &format!("arch-{arch}.gguf"),
            |k, v| {
                Some(if k == "general.architecture" {
                    Value::String(arch.to_string())
                } else {
                    v.clone()
                })
            },
            keep_t,
        );
        let e = load(&p).err().expect("must fail");
        assert!(matches!(&e, Error::UnsupportedArch(a) if a == arch), "{e}");
    }
}

#[test]
fn missing_metadata_key_is_named() {
    let p = rewrite(
        "nokey.gguf",
        |k, v| (k != "qwen35.ssm.group_count").then(|| v.clone()),
        keep_t,
    );
    let e = load(&p).err().expect("must fail");
    assert!(
        matches!(&e, Error::Metadata(m) if m.contains("qwen35.ssm.group_count")),
        "{e}"
    );
}

#[test]
fn inconsistent_metadata_is_rejected() {
    // 3 value heads for 2 key heads: not a multiple.
    let p = rewrite(
        "heads.gguf",
        |k, v| {
            Some(if k == "qwen35.ssm.time_step_rank" {
                Value::U32(3)
            } else {
                v.clone()
            })
        },
        keep_t,
    );
    assert!(matches!(load(&p), Err(Error::Metadata(_))));
}
