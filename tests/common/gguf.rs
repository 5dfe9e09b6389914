//! Rewriting a fixture model with edits, for the tests of broken or hostile models.

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

/// Keep every metadata value.
pub fn keep_kv(_: &str, v: &Value) -> Option<Value> {
    Some(v.clone())
}

/// Keep every tensor.
pub fn keep_tensor(_: &str, t: TensorEdit) -> Option<TensorEdit> {
    Some(t)
}

/// Write the fixture `src` again with edits, to a temp file named by `tag` (unique per test):
/// `kv` maps each metadata (key, value) to its replacement (None drops it); `tensor` maps each
/// tensor (name, as stored) to its replacement (None drops it).
pub fn rewrite(
    src: &str,
    tag: &str,
    kv: impl Fn(&str, &Value) -> Option<Value>,
    tensor: impl Fn(&str, TensorEdit) -> Option<TensorEdit>,
) -> PathBuf {
    let src = GgufFile::open(fixture(src)).expect("fixture");
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if let Some(v) = kv(k, v) {
            w.add_kv(k.clone(), v);
        }
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
    let path = temp_path(&format!("{tag}.gguf"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    w.write_header(&mut f).expect("header");
    for (idx, data) in datas {
        w.write_tensor_data(&mut f, idx, &data).expect("data");
    }
    drop(f);
    path
}
