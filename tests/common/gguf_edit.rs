//! Copies of the fixture models with edited metadata and tensors, for tests of files that are
//! valid GGUF but wrong as models. Used with `#[path = "common/gguf_edit.rs"] mod gguf_edit;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rill::gguf::{GgmlType, GgufFile, GgufWriter, Value};

pub const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Rewrite fixture `src` into a temporary file named after `out_name`: `kv` maps (key, value) to
/// a replacement (None drops it), `extra` adds keys, `tensor` maps (name, ne, type) to a
/// replacement (None drops it). Tensors keep their bytes where the size is unchanged, else zeros.
pub fn rewrite_fixture(
    src: &str,
    out_name: &str,
    kv: impl Fn(&str, &Value) -> Option<Value>,
    extra: Vec<(String, Value)>,
    tensor: impl Fn(&str, &[u64], GgmlType) -> Option<(Vec<u64>, GgmlType)>,
) -> PathBuf {
    let src = GgufFile::open(Path::new(FIX).join(src)).expect("fixture");
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if let Some(v) = kv(k, v) {
            w.add_kv(k.clone(), v);
        }
    }
    for (k, v) in extra {
        w.add_kv(k, v);
    }
    let mut datas = Vec::new();
    for t in &src.tensors {
        if let Some((ne, ty)) = tensor(&t.name, &t.ne, t.ggml_type) {
            let idx = w.add_tensor(t.name.clone(), ne, ty).expect("add tensor");
            let size = w.tensor_size(idx) as usize;
            let data = if size == t.n_bytes as usize {
                src.tensor_data(t).to_vec()
            } else {
                vec![0u8; size]
            };
            datas.push((idx, data));
        }
    }
    let path = std::env::temp_dir().join(format!("rill-edit-{}-{out_name}", std::process::id()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    w.write_header(&mut f).expect("header");
    for (idx, data) in datas {
        w.write_tensor_data(&mut f, idx, &data).expect("data");
    }
    drop(f);
    path
}

pub fn keep_kv(_: &str, v: &Value) -> Option<Value> {
    Some(v.clone())
}

pub fn keep_t(_: &str, ne: &[u64], ty: GgmlType) -> Option<(Vec<u64>, GgmlType)> {
    Some((ne.to_vec(), ty))
}

/// `keep_kv` except that `key` gets `value`.
pub fn set_kv(key: &'static str, value: Value) -> impl Fn(&str, &Value) -> Option<Value> {
    move |k, v| Some(if k == key { value.clone() } else { v.clone() })
}
