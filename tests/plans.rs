//! Step plans: what the executor asks a backend to compute, and what each GPU backend's fusion
//! makes of it. The plans are built from the fixtures on the CPU backend and each GPU backend's
//! fusion choices (`fuse::FUSIONS`) are applied by the matcher they use (`backend::fusion`), so
//! these run on every machine; tests/device_plans.rs checks what the devices actually launch.
mod common;

use rill::backend::fusion::{self, FusionSet};
#[cfg(feature = "cuda")]
use rill::backend::{compose, DType, Op, Plan};
use rill::exec::{Head, Model};

fn model(name: &str) -> Model {
    Model::open(common::fixture(name), common::cpu()).expect("fixture loads")
}

/// What `set` makes of a step of `t` tokens with `head` from position 0.
fn launches(m: &Model, t: usize, head: Head, set: FusionSet) -> Vec<&'static str> {
    let s = m.new_session(64).expect("session");
    m.inspect_step(&s, t, head, |p| fusion::launches(p.ops(), set))
        .expect("plan")
}

#[cfg(feature = "cuda")]
fn cuda() -> FusionSet {
    FusionSet::of(&rill::backend::cuda::fuse::FUSIONS)
}

#[cfg(feature = "wgpu")]
fn wgpu() -> FusionSet {
    FusionSet::of(&rill::backend::wgpu::fuse::FUSIONS)
}

/// spec/MODEL.md §8 op by op: the embedding, per layer `h += mixer(rms_norm(h))` and
/// `h += ffn(rms_norm(h))`, then the head.
fn model_ops(m: &Model, t: usize, head: Head) -> Vec<&'static str> {
    let delta = if t == 1 {
        "delta_rule_recurrent"
    } else {
        "delta_rule_chunked"
    };
    let mut ops = vec!["embed"];
    for &linear in &m.config.is_linear {
        ops.push("rms_norm");
        if linear {
            // §5: projections, gates, conv, L2 norm, delta rule, gated norm, output projection.
            ops.extend(["matmul"; 4]);
            ops.extend([
                "gdn_gates",
                "conv1d_causal_silu",
                "l2_norm_qk",
                delta,
                "gated_rms_norm",
                "matmul",
            ]);
        } else {
            // §6: projections, split, q/k norms, RoPE, cache, attention, output gate, projection.
            ops.extend(["matmul"; 3]);
            ops.extend([
                "split_qgate",
                "rms_norm",
                "rms_norm",
                "rope_neox",
                "rope_neox",
                "kv_store",
            ]);
            ops.extend(["attention", "sigmoid_mul_assign", "matmul"]);
        }
        ops.extend(["add_assign", "rms_norm"]);
        if m.config.moe.is_some() {
            // §7.2: router, shared gate, routing, experts, shared expert, its gated sum.
            ops.extend([
                "matmul",
                "matmul",
                "moe_route",
                "moe_experts",
                "matmul",
                "matmul",
                "swiglu",
            ]);
            ops.extend(["matmul", "sigmoid_scale_add"]);
        } else {
            // §7.1
            ops.extend(["matmul", "matmul", "swiglu", "matmul"]);
        }
        ops.push("add_assign");
    }
    match head {
        Head::None => {}
        Head::AllLogits => ops.extend(["rms_norm", "matmul"]),
        Head::AllArgmax => ops.extend(["rms_norm", "matmul", "argmax"]),
        Head::LastLogits | Head::LastArgmax => {
            if t > 1 {
                ops.push("copy_rows");
            }
            ops.extend(["rms_norm", "matmul"]);
            if head == Head::LastArgmax {
                ops.push("argmax");
            }
        }
    }
    ops
}

const FIXTURES: [&str; 3] = ["tiny-dense.F16.gguf", "tiny-dense.Q4_K_M.gguf", "tiny-moe.F16.gguf"];
const SHAPES: [(usize, Head); 4] = [
    (1, Head::LastArgmax),
    (1, Head::LastLogits),
    (5, Head::LastLogits),
    (3, Head::None),
];

#[test]
fn the_plan_is_the_models_equations_in_order() {
    for name in FIXTURES {
        let m = model(name);
        for (t, head) in SHAPES.into_iter().chain([(4, Head::AllLogits)]) {
            let got = launches(&m, t, head, FusionSet::NONE);
            assert_eq!(got, model_ops(&m, t, head), "{name}, T = {t}, {head:?}");
        }
    }
}

#[cfg(feature = "cuda")]
/// CUDA: a block's last product adds itself into the residual and norms it, taking the next
/// block's first products of the normed rows; a MoE FFN takes its residual add, norm, router and
/// routing; one-token Gated DeltaNet layers run their middle in one launch.
fn cuda_expected(m: &Model, t: usize, head: Head) -> Vec<&'static str> {
    let moe = m.config.moe.is_some();
    let fuse_final = t == 1 && matches!(head, Head::LastLogits | Head::LastArgmax);
    let mut ops = vec!["embed", "rms_norm", "matmul_group"];
    let n = m.config.is_linear.len();
    for (i, &linear) in m.config.is_linear.iter().enumerate() {
        if linear {
            ops.extend(if t == 1 {
                &["gdn_step"][..]
            } else {
                &["gdn_conv_gates", "delta_rule_chunked", "gated_rms_norm"][..]
            });
        } else {
            ops.extend(["attn_qk_prep", "attention", "sigmoid_mul_assign"]);
        }
        let last = i + 1 == n;
        if moe {
            ops.extend(["matmul", "moe_ffn"]);
            if last && !fuse_final {
                ops.push("add_assign");
            }
        } else {
            ops.extend(["matmul_add_rms_norm", "matmul_swiglu"]);
            ops.extend(if last && !fuse_final {
                &["matmul", "add_assign"][..]
            } else {
                &["matmul_add_rms_norm"][..]
            });
        }
    }
    head_ops(&mut ops, t, head, fuse_final);
    ops
}

#[cfg(feature = "wgpu")]
/// wgpu: products of one input in one launch, the residual add with the next norm, the fused
/// Gated DeltaNet preparation, attention preparation and gate, and a MoE FFN's shared expert
/// with its routed experts.
fn wgpu_expected(m: &Model, t: usize, head: Head) -> Vec<&'static str> {
    let moe = m.config.moe.is_some();
    let fuse_final = t == 1 && matches!(head, Head::LastLogits | Head::LastArgmax);
    let delta = if t == 1 {
        "delta_rule_recurrent"
    } else {
        "delta_rule_chunked"
    };
    let mut ops = vec!["embed", "rms_norm"];
    let n = m.config.is_linear.len();
    for (i, &linear) in m.config.is_linear.iter().enumerate() {
        ops.push("matmul_group");
        if linear {
            ops.extend(["gdn_conv_gates", delta, "gated_rms_norm"]);
        } else {
            ops.extend(["attn_qk_prep", "attention_gated"]);
        }
        ops.extend(["matmul", "add_rms_norm"]);
        let last = i + 1 == n;
        if moe {
            ops.extend(["matmul_group", "moe_route", "moe_experts_shared"]);
        } else {
            ops.extend(["matmul_swiglu", "matmul"]);
        }
        ops.push(if last && !fuse_final {
            "add_assign"
        } else {
            "add_rms_norm"
        });
    }
    head_ops(&mut ops, t, head, fuse_final);
    ops
}

fn head_ops(ops: &mut Vec<&'static str>, t: usize, head: Head, fused_norm: bool) {
    match head {
        Head::None => {}
        Head::AllLogits => ops.extend(["rms_norm", "matmul"]),
        Head::AllArgmax => ops.extend(["rms_norm", "matmul", "argmax"]),
        Head::LastLogits | Head::LastArgmax => {
            if !fused_norm {
                if t > 1 {
                    ops.push("copy_rows");
                }
                ops.push("rms_norm");
            }
            ops.push("matmul");
            if head == Head::LastArgmax {
                ops.push("argmax");
            }
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_fuses_the_runs_its_kernels_cover() {
    for name in FIXTURES {
        let m = model(name);
        for (t, head) in SHAPES {
            assert_eq!(
                launches(&m, t, head, cuda()),
                cuda_expected(&m, t, head),
                "{name}, T = {t}, {head:?}"
            );
        }
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_fuses_the_runs_its_kernels_cover() {
    for name in FIXTURES {
        let m = model(name);
        for (t, head) in SHAPES {
            assert_eq!(
                launches(&m, t, head, wgpu()),
                wgpu_expected(&m, t, head),
                "{name}, T = {t}, {head:?}"
            );
        }
    }
}

#[cfg(feature = "cuda")]
/// A fused kernel may leave an intermediate unwritten only when nothing after it reads it: a
/// block's product `y` read again later keeps the product, the add and the norm apart.
#[test]
fn an_intermediate_read_later_is_not_fused_away() {
    let be = common::cpu();
    let t = |shape: &[usize]| be.alloc(DType::F32, shape).expect("alloc");
    let (w, x, y, acc, nw, out, w2, z) = (
        t(&[8, 8]),
        t(&[1, 8]),
        t(&[1, 8]),
        t(&[1, 8]),
        t(&[8]),
        t(&[1, 8]),
        t(&[8, 8]),
        t(&[1, 8]),
    );
    let head = [
        Op::Matmul { w: &w, x: &x, out: &y },
        Op::Add { acc: &acc, x: &y },
        Op::RmsNorm {
            x: &acc,
            w: &nw,
            eps: 1e-6,
            out: &out,
        },
    ];
    let dead: Plan = head.to_vec().into();
    assert_eq!(fusion::launches(dead.ops(), cuda()), ["matmul_add_rms_norm"]);
    let mut live = head.to_vec();
    live.push(Op::Matmul { w: &w2, x: &y, out: &z });
    assert_eq!(
        fusion::launches(&live, cuda()),
        ["matmul", "add_rms_norm", "matmul"],
        "y is read after the norm"
    );
    let mut overwritten = head.to_vec();
    overwritten.push(Op::Matmul { w: &w2, x: &x, out: &y });
    assert_eq!(
        fusion::launches(&overwritten, cuda()),
        ["matmul_add_rms_norm", "matmul"],
        "y is written again before any read"
    );
}

#[cfg(feature = "cuda")]
/// The fused runs given as plans (`compose`) are each one fused launch for a backend that takes
/// that fusion, and their ops one by one for the CPU: the op tests compare the two.
#[test]
fn the_cpu_runs_a_plan_op_by_op() {
    let be = common::cpu();
    let t = |shape: &[usize]| be.alloc(DType::F32, shape).expect("alloc");
    let (acc, x, w, out) = (t(&[2, 8]), t(&[2, 8]), t(&[8]), t(&[2, 8]));
    let plan: Plan = vec![
        Op::Add { acc: &acc, x: &x },
        Op::RmsNorm {
            x: &acc,
            w: &w,
            eps: 1e-6,
            out: &out,
        },
    ]
    .into();
    let mut launched = Vec::new();
    be.run_plan_listed(&plan, &mut launched).expect("runs");
    assert_eq!(launched, ["add_assign", "rms_norm"]);
    assert_eq!(fusion::launches(plan.ops(), cuda()), ["add_rms_norm"]);
    // The composed form checks its operands like the fused kernel: an aliased output is refused.
    assert!(compose::add_rms_norm(be.as_ref(), &acc, &x, &w, 1e-6, &acc).is_err());
}
