//! The fused decode dispatches chosen for two real models' shapes in two quantizations, on an
//! H200-like adapter and a browser-like one, from `Caps::select` alone (no GPU).

use super::*;
use crate::backend::wgpu::caps::{coop_features, Caps};
use crate::backend::wgpu::options::WgpuOptions;
use crate::backend::Precision;
use GgmlType::{Q4K, Q6K, Q8_0};

/// The H200's Vulkan adapter as `Caps::select` sees it: subgroups, f16, cooperative matrices,
/// native `dot4I8Packed`, 48 KiB of workgroup memory, storage buffers without a practical limit.
fn h200(opts: WgpuOptions) -> Device {
    let limits = wgpu::Limits {
        max_compute_workgroup_storage_size: 48 << 10,
        max_storage_buffers_per_shader_stage: 1 << 20,
        ..wgpu::Limits::default()
    };
    let features = wgpu::Features::SUBGROUP | coop_features();
    Caps::select(features, &limits, Precision::Fast, true, true, &opts).device()
}

/// A browser's WebGPU adapter: no subgroups, no packed dot, WebGPU's default limits (8 storage
/// buffers per stage, 16 KiB of workgroup memory).
fn browser(opts: WgpuOptions) -> Device {
    let features = wgpu::Features::SHADER_F16;
    Caps::select(
        features,
        &wgpu::Limits::default(),
        Precision::Exact,
        false,
        false,
        &opts,
    )
    .device()
}

fn no_fusion() -> WgpuOptions {
    WgpuOptions {
        fusion: false,
        ..Default::default()
    }
}

/// The decode-relevant shape of a model. The heads are the 9B's in both (the 35B-A3B's differ
/// only in counts that no decision at one token depends on).
struct Model {
    n_embd: usize,
    /// The dense FFN's hidden width; None: a MoE FFN.
    n_ff: Option<usize>,
    q_heads: usize,
    /// Routed experts, their hidden width, experts per token, the shared expert's hidden width.
    moe: Option<(usize, usize, usize, usize)>,
}

/// Qwen3.5-9B: n_embd 4096, n_ff 12288, GDN 32 v-heads / 16 k-heads of 128, attention 16 q / 4 kv
/// heads of 256, vocab 248320.
const NINE_B: Model = Model {
    n_embd: 4096,
    n_ff: Some(12288),
    q_heads: 16,
    moe: None,
};

/// Qwen3.5-35B-A3B: n_embd 2048, 256 experts of n_ff 512, top 8, a shared expert of 512.
const MOE_35B: Model = Model {
    n_embd: 2048,
    n_ff: None,
    q_heads: 16,
    moe: Some((256, 512, 8, 512)),
};

/// The formats of the products of one input: a GDN layer's (qkv, z, alpha, beta) and an
/// attention layer's (q with its gate, k, v). Q4_K_M keeps v in Q6_K (llama.cpp's mix for
/// `attn_v`); Q8_0 is one format throughout.
#[derive(Clone, Copy)]
enum Quant {
    Q4KM,
    Q8,
}

impl Quant {
    fn gdn(self) -> [Option<GgmlType>; 4] {
        match self {
            Quant::Q4KM => [Some(Q4K); 4],
            Quant::Q8 => [Some(Q8_0); 4],
        }
    }
    fn attn(self) -> [Option<GgmlType>; 3] {
        match self {
            Quant::Q4KM => [Some(Q4K), Some(Q4K), Some(Q6K)],
            Quant::Q8 => [Some(Q8_0); 3],
        }
    }
}

/// What one decode step of `model` in `quant` fuses on `dev`.
#[derive(Debug, PartialEq, Eq)]
struct Fusions {
    gdn_groups: Vec<Vec<usize>>,
    attn_groups: Vec<Vec<usize>>,
    gates: Gates,
    prep: Prep,
    attn_gate: AttnGate,
    swiglu: Option<SwigluOut>,
    /// The block's input norm (n_embd values).
    norm: NormOut,
    moe: Option<MoeShared>,
}

fn decode(dev: Device, model: &Model, quant: Quant) -> Fusions {
    let groups = |f: &[Option<GgmlType>]| -> Vec<Vec<usize>> {
        product_groups(dev, f).iter().map(|g| g.members().to_vec()).collect()
    };
    Fusions {
        gdn_groups: groups(&quant.gdn()),
        attn_groups: groups(&quant.attn()),
        gates: gdn_gates(dev),
        prep: attn_prep(dev),
        attn_gate: attn_gate(dev, model.q_heads),
        swiglu: model.n_ff.map(|n| swiglu_out(dev, n)),
        norm: norm_out(dev, model.n_embd, model.n_embd),
        moe: model.moe.map(|(_, n_ff, k, n_ff_shared)| {
            moe_shared(
                dev,
                MoeShape {
                    n_tok: 1,
                    k,
                    n_embd: model.n_embd,
                    n_ff,
                    n_ff_shared,
                },
            )
        }),
    }
}

#[test]
fn the_h200_fuses_everything() {
    let dev = h200(WgpuOptions::default());
    assert_eq!(group_size(dev), 4);
    for quant in [Quant::Q4KM, Quant::Q8] {
        let attn_groups = match quant {
            // v in Q6_K: q and k grouped, v alone.
            Quant::Q4KM => vec![vec![0, 1]],
            Quant::Q8 => vec![vec![0, 1, 2]],
        };
        assert_eq!(
            decode(dev, &NINE_B, quant),
            Fusions {
                gdn_groups: vec![vec![0, 1, 2, 3]],
                attn_groups: attn_groups.clone(),
                gates: Gates::Fused,
                prep: Prep::One,
                attn_gate: AttnGate::InMerge,
                swiglu: Some(SwigluOut::Planes),
                norm: NormOut::Planes,
                moe: None,
            }
        );
        assert_eq!(
            decode(dev, &MOE_35B, quant),
            Fusions {
                gdn_groups: vec![vec![0, 1, 2, 3]],
                attn_groups,
                gates: Gates::Fused,
                prep: Prep::One,
                attn_gate: AttnGate::InMerge,
                swiglu: None,
                norm: NormOut::Planes,
                moe: Some(MoeShared::InExperts),
            }
        );
    }
}

#[test]
fn a_browser_fuses_what_eight_storage_buffers_hold() {
    let dev = browser(WgpuOptions::default());
    assert_eq!((dev.max_storage, group_size(dev)), (8, 3));
    for quant in [Quant::Q4KM, Quant::Q8] {
        let attn_groups = match quant {
            Quant::Q4KM => vec![vec![0, 1]],
            Quant::Q8 => vec![vec![0, 1, 2]],
        };
        let want = |swiglu, moe| Fusions {
            // Groups of 3: beta alone.
            gdn_groups: vec![vec![0, 1, 2]],
            attn_groups: attn_groups.clone(),
            // 10 and 11 storage buffers do not fit; the halves' 7 do.
            gates: Gates::Separate,
            prep: Prep::Halves,
            attn_gate: AttnGate::InMerge,
            swiglu,
            norm: NormOut::Plain,
            moe,
        };
        // No packed-dot units: no planes to write.
        assert_eq!(decode(dev, &NINE_B, quant), want(Some(SwigluOut::Plain), None));
        assert_eq!(decode(dev, &MOE_35B, quant), want(None, Some(MoeShared::InExperts)));
    }
}

#[test]
fn fusion_off_fuses_nothing() {
    for dev in [h200(no_fusion()), browser(no_fusion())] {
        assert_eq!(group_size(dev), 1);
        for model in [&NINE_B, &MOE_35B] {
            for quant in [Quant::Q4KM, Quant::Q8] {
                assert_eq!(
                    decode(dev, model, quant),
                    Fusions {
                        gdn_groups: vec![],
                        attn_groups: vec![],
                        gates: Gates::Separate,
                        prep: Prep::Separate,
                        attn_gate: AttnGate::Separate,
                        swiglu: model.n_ff.map(|_| SwigluOut::Plain),
                        norm: NormOut::Plain,
                        moe: model.moe.map(|_| MoeShared::Composed),
                    }
                );
            }
        }
        assert_eq!(describe(dev), "no fused decode dispatches");
    }
}

/// Prompts take the unfused shapes: no merge of a split key range for more than `SPLIT_MAX_ROWS`
/// query rows, the composed MoE for more than `SHARED_MAX_T` tokens.
#[test]
fn prompts_take_the_unfused_shapes() {
    let dev = h200(WgpuOptions::default());
    assert_eq!(attn_gate(dev, 16 * 16), AttnGate::InMerge);
    assert_eq!(attn_gate(dev, 17 * 16), AttnGate::Separate);
    let moe = |n_tok, n_ff_shared| {
        moe_shared(
            dev,
            MoeShape {
                n_tok,
                k: 8,
                n_embd: 2048,
                n_ff: 512,
                n_ff_shared,
            },
        )
    };
    assert_eq!(moe(SHARED_MAX_T, 512), MoeShared::InExperts);
    assert_eq!(moe(SHARED_MAX_T + 1, 512), MoeShared::Composed);
    assert_eq!(
        moe(1, 1024),
        MoeShared::Composed,
        "a shared expert wider than the routed ones"
    );
    // Planes only for whole 256-element rows (of whole 32-element groups for a norm).
    assert_eq!(swiglu_out(dev, 12288 + 32), SwigluOut::Plain);
    assert_eq!(norm_out(dev, 256, 4096 + 32), NormOut::Plain);
    assert_eq!(norm_out(dev, 48, 4096 * 3), NormOut::Plain);
    assert_eq!(norm_out(dev, 128, 4096), NormOut::Planes);
}

/// The fused dispatches by the storage buffers per kernel: WebGPU's 8 (groups of 3, the attention
/// preparation in halves, the attention gate), 10 (groups of 4, the gates), 11 and more
/// (everything).
#[test]
fn fused_dispatches_follow_the_storage_buffer_limit() {
    let at = |max_storage| {
        let dev = Device {
            max_storage,
            fusion: true,
            dot: false,
        };
        (group_size(dev), gdn_gates(dev), attn_prep(dev), attn_gate(dev, 1))
    };
    assert_eq!(at(8), (3, Gates::Separate, Prep::Halves, AttnGate::InMerge));
    assert_eq!(at(10), (4, Gates::Fused, Prep::Halves, AttnGate::InMerge));
    assert_eq!(at(11), (4, Gates::Fused, Prep::One, AttnGate::InMerge));
    assert_eq!(
        describe(h200(WgpuOptions::default())),
        "fused: groups of 4, gates, attention gate, moe shared expert, swiglu planes, norm planes, prep in 1"
    );
}
