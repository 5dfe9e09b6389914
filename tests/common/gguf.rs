//! Copies of the fixture models with edited metadata and tensors, for tests of files that are
//! valid GGUF but wrong as models (or hostile).

use std::path::PathBuf;

use rill::gguf::{GgmlType, GgufFile, GgufWriter, Value};

use super::{fixture, temp_path};

/// One tensor of a rewritten file.
pub struct TensorEdit {
    /// ggml `ne` (innermost first).
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// The tensor's bytes; replaced by zeros of the right size when they do not fit `ne` and `ty`.
    pub data: Vec<u8>,
}

/// Rewrite fixture `src` into a temp file named after `out_name` (unique per test: tests run in
/// parallel, and a file mapped by one must not be rewritten by another): `kv` maps each metadata
/// (key, value) to its replacement (None drops it), `extra` adds keys, `tensor` maps each tensor
/// (name, as stored) to its replacement (None drops it).
pub fn rewrite_fixture(
    src: &str,
    out_name: &str,
    kv: impl Fn(&str, &Value) -> Option<Value>,
    extra: Vec<(String, Value)>,
    tensor: impl Fn(&str, TensorEdit) -> Option<TensorEdit>,
) -> PathBuf {
    let src = GgufFile::open(fixture(src)).expect("fixture");
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
        let stored = TensorEdit {
            ne: t.ne.clone(),
            ty: t.ggml_type,
            data: src.tensor_data(t).to_vec(),
        };
        if let Some(e) = tensor(&t.name, stored) {
            let idx = w.add_tensor(t.name.clone(), e.ne, e.ty).expect("add tensor");
            let size = w.tensor_size(idx) as usize;
            let data = if e.data.len() == size { e.data } else { vec![0u8; size] };
            datas.push((idx, data));
        }
    }
    let path = temp_path(out_name);
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    w.write_header(&mut f).expect("header");
    for (idx, data) in datas {
        w.write_tensor_data(&mut f, idx, &data).expect("data");
    }
    drop(f);
    path
}

/// Keep every metadata value.
pub fn keep_kv(_: &str, v: &Value) -> Option<Value> {
    Some(v.clone())
}

/// Keep every tensor.
pub fn keep_t(_: &str, t: TensorEdit) -> Option<TensorEdit> {
    Some(t)
}

/// `keep_kv` except that `key` gets `value`.
pub fn set_kv(key: &'static str, value: Value) -> impl Fn(&str, &Value) -> Option<Value> {
    move |k, v| Some(if k == key { value.clone() } else { v.clone() })
}
