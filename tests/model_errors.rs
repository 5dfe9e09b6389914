//! Files that are valid GGUF but not a runnable Qwen3.5 model give a clear error naming the problem.

mod common;

use std::path::{Path, PathBuf};

use common::gguf::{keep_kv, keep_tensor, TensorEdit};
use rill::exec::Model;
use rill::gguf::{GgmlType, Value};
use rill::Error;

/// The tiny dense model rewritten with edits (see `common::gguf::rewrite`).
fn rewrite(
    tag: &str,
    kv: impl Fn(&str, &Value) -> Option<Value>,
    tensor: impl Fn(&str, TensorEdit) -> Option<TensorEdit>,
) -> PathBuf {
    common::gguf::rewrite("tiny-dense.F16.gguf", &format!("model-errors-{tag}"), kv, tensor)
}

fn load(path: &Path) -> Result<Model, Error> {
    Model::open(path, common::cpu())
}

#[test]
fn unchanged_rewrite_loads() {
    load(&rewrite("same", keep_kv, keep_tensor)).expect("an unchanged copy loads");
}

#[test]
fn missing_tensor_is_named() {
    let p = rewrite("missing", keep_kv, |n, t| (n != "blk.1.ssm_a").then_some(t));
    let e = load(&p).err().expect("must fail");
    assert!(matches!(&e, Error::Tensor { name, .. } if name == "blk.1.ssm_a"), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn wrong_shape_is_named() {
    let p = rewrite("shape", keep_kv, |n, t| {
        if n == "blk.3.attn_k.weight" {
            Some(TensorEdit { ne: vec![64, 512], ..t })
        } else {
            Some(t)
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
    let p = rewrite("type", keep_kv, |n, t| {
        if n == "blk.0.ffn_up.weight" {
            Some(TensorEdit {
                ty: GgmlType::Q8_1,
                ..t
            })
        } else {
            Some(t)
        }
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
            &format!("arch-{arch}"),
            |k, v| {
                Some(if k == "general.architecture" {
                    Value::String(arch.to_string())
                } else {
                    v.clone()
                })
            },
            keep_tensor,
        );
        let e = load(&p).err().expect("must fail");
        assert!(matches!(&e, Error::UnsupportedArch(a) if a == arch), "{e}");
    }
}

#[test]
fn missing_metadata_key_is_named() {
    let p = rewrite(
        "nokey",
        |k, v| (k != "qwen35.ssm.group_count").then(|| v.clone()),
        keep_tensor,
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
        "heads",
        |k, v| {
            Some(if k == "qwen35.ssm.time_step_rank" {
                Value::U32(3)
            } else {
                v.clone()
            })
        },
        keep_tensor,
    );
    assert!(matches!(load(&p), Err(Error::Metadata(_))));
}
