//! The GGUF reader on arbitrary bytes: whatever parses is internally consistent, every
//! accessor works on it, and its metadata re-encodes to a file that parses to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rill::gguf::{GgufFile, GgufWriter, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (k, v) in f.metadata() {
        assert!(f.get(k).is_some(), "key '{k}' not found by get");
        visit(v);
    }
    for t in &f.tensors {
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes, "{}", t.name);
        assert_eq!(f.tensor_bytes(t).len() as u64, t.n_bytes, "{}", t.name);
        assert_eq!(f.tensor(&t.name), Some(t));
        assert_eq!(t.shape().len(), t.ne.len());
    }
    let once = encode_metadata(f.metadata());
    let again = GgufFile::from_bytes(once.clone()).expect("re-encoded metadata parses");
    assert_eq!(encode_metadata(again.metadata()), once, "re-encoding is not stable");
    // Reading a model's hyper-parameters from any parsed file never panics.
    let _ = rill::model::Config::from_gguf(&f);
});

/// Walk a value: arrays iterate to exactly their length, as values and as strings.
fn visit(v: &Value) {
    let Some(a) = v.as_array() else {
        return;
    };
    let mut n = 0;
    for item in a.iter() {
        visit(&item);
        n += 1;
    }
    assert_eq!(n, a.len());
    assert_eq!(a.strs().count(), a.len());
    let _ = format!("{a:?}");
}

fn encode_metadata(kvs: &[(String, Value)]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.add_kv(k.clone(), v.clone());
    }
    let mut out = Vec::new();
    w.write_header(&mut out).expect("metadata that parsed can be written");
    out
}
