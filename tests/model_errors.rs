//! Files that are valid GGUF but not a runnable Qwen3.5 model give a clear error naming the problem.

mod common;

use std::path::{Path, PathBuf};

use common::gguf::{keep_kv, keep_t, rewrite_fixture, set_kv, TensorEdit};
use rill::exec::Model;
use rill::gguf::{GgmlType, Value};
use rill::Error;

/// Rewrite the tiny dense model with edits (see `rewrite_fixture`).
fn rewrite(
    out_name: &str,
    kv: impl Fn(&str, &Value) -> Option<Value>,
    tensor: impl Fn(&str, TensorEdit) -> Option<TensorEdit>,
) -> PathBuf {
    rewrite_fixture(
        "tiny-dense.F16.gguf",
        &format!("model-errors-{out_name}"),
        kv,
        Vec::new(),
        tensor,
    )
}

fn load(path: &Path) -> Result<Model, Error> {
    Model::open(path, common::cpu())
}

/// The metadata error of a model that must be refused.
fn metadata_error(path: &Path) -> String {
    match load(path) {
        Err(Error::Metadata(m)) => m,
        Err(e) => panic!("expected a metadata error, got {e}"),
        Ok(_) => panic!("{} must be refused", path.display()),
    }
}

#[test]
fn unchanged_rewrite_loads() {
    load(&rewrite("same.gguf", keep_kv, keep_t)).expect("an unchanged copy loads");
}

#[test]
fn missing_tensor_is_named() {
    let p = rewrite("missing.gguf", keep_kv, |n, t| (n != "blk.1.ssm_a").then_some(t));
    let e = load(&p).err().expect("must fail");
    assert!(matches!(&e, Error::Tensor { name, .. } if name == "blk.1.ssm_a"), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn wrong_shape_is_named() {
    let p = rewrite("shape.gguf", keep_kv, |n, t| {
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
    let p = rewrite("type.gguf", keep_kv, |n, t| {
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

/// Issue 12, finding 8: `block_count` smaller than the layers in the file ran a truncated model.
#[test]
fn block_count_smaller_than_the_layers_present_is_refused() {
    let kv = |k: &str, v: &Value| {
        Some(match k {
            "qwen35.block_count" => Value::U32(7),
            // Keep the per-block array consistent with block_count, so only the tensors disagree.
            "qwen35.attention.recurrent_layers" => Value::Array(v.as_array().expect("array").iter().take(7).collect()),
            _ => v.clone(),
        })
    };
    let m = metadata_error(&rewrite("blocks.gguf", kv, keep_t));
    assert!(m.contains("block_count is 7") && m.contains("blk.7."), "{m}");
}

/// Issue 12, finding 8: `recurrent_layers` must have one entry per block, no more.
#[test]
fn recurrent_layers_longer_than_block_count_is_refused() {
    let kv = |k: &str, v: &Value| {
        Some(if k == "qwen35.attention.recurrent_layers" {
            let a = v.as_array().expect("array");
            Value::Array(a.iter().chain([Value::Bool(true)]).collect())
        } else {
            v.clone()
        })
    };
    let m = metadata_error(&rewrite("recurrent.gguf", kv, keep_t));
    assert!(m.contains("9 entries") && m.contains("block_count is 8"), "{m}");
}

/// Issue 12, finding 4: float hyper-parameters are finite and in range, checked at load.
#[test]
fn non_finite_float_hyper_parameters_are_refused() {
    for (key, value, needle) in [
        (
            "qwen35.attention.layer_norm_rms_epsilon",
            f32::NAN,
            "layer_norm_rms_epsilon NaN",
        ),
        (
            "qwen35.attention.layer_norm_rms_epsilon",
            0.0,
            "layer_norm_rms_epsilon 0",
        ),
        ("qwen35.rope.freq_base", f32::INFINITY, "freq_base inf"),
        ("qwen35.rope.freq_base", f32::NAN, "freq_base NaN"),
    ] {
        let m = metadata_error(&rewrite("float.gguf", set_kv(key, Value::F32(value)), keep_t));
        assert!(m.contains(needle), "{key} = {value}: {m}");
    }
    for (value, needle) in [
        (f32::NAN, "expert_weights_scale NaN"),
        (f32::INFINITY, "expert_weights_scale inf"),
        (-1.0, "expert_weights_scale -1"),
    ] {
        let extra = vec![("qwen35moe.expert_weights_scale".to_string(), Value::F32(value))];
        let p = rewrite_fixture("tiny-moe.F16.gguf", "model-errors-scale.gguf", keep_kv, extra, keep_t);
        let m = metadata_error(&p);
        assert!(m.contains(needle), "scale {value}: {m}");
    }
    // A finite scale loads.
    let extra = vec![("qwen35moe.expert_weights_scale".to_string(), Value::F32(2.5))];
    let p = rewrite_fixture(
        "tiny-moe.F16.gguf",
        "model-errors-scale-ok.gguf",
        keep_kv,
        extra,
        keep_t,
    );
    let m = load(&p).expect("a finite scale loads");
    assert_eq!(m.config.moe.as_ref().map(|c| c.weights_scale), Some(2.5));
}

/// Issue 12, finding 7: wrong types and negative values are named as such.
#[test]
fn wrong_types_and_negative_values_are_named() {
    let m = metadata_error(&rewrite(
        "ctx.gguf",
        set_kv("qwen35.context_length", Value::I32(-5)),
        keep_t,
    ));
    assert!(m.contains("'qwen35.context_length' = -5 is negative"), "{m}");
    let m = metadata_error(&rewrite(
        "arch.gguf",
        set_kv("general.architecture", Value::U32(35)),
        keep_t,
    ));
    assert!(
        m.contains("'general.architecture' has type u32, expected a string"),
        "{m}"
    );
    let heads = Value::Array(vec![Value::I32(2), Value::I32(-2)].into());
    let m = metadata_error(&rewrite(
        "neg-heads.gguf",
        set_kv("qwen35.attention.head_count", heads),
        keep_t,
    ));
    assert!(m.contains("head_count[1]' = -2 is negative"), "{m}");
}
