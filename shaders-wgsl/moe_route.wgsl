// MoE routing, one workgroup of ROW_WG invocations per token (lib_moe_route.wgsl: the routed
// experts' kernel that routes its token itself runs the same code, with the same 256-leaf sum, at
// its own workgroup size).
const RT_WG: u32 = ROW_WG;
struct Params {
    n_tok: u32,
    n_exp: u32,
    k: u32,
    scale: u32, // f32 bits
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;

@compute @workgroup_size(RT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let t = linear_wg(wg, nwg);
    // Uniform per workgroup, so the routing's barriers stay in uniform control flow.
    let live = t < P.n_tok;
    rt_route(t * P.n_exp, select(0u, P.n_exp, live), P.k, li);
    // k <= MOE_MAX_K <= RT_WG: one invocation per slot.
    if (live && li < P.k) {
        ids[t * P.k + li] = rt_id[li];
        weights[t * P.k + li] = rt_weight(li, P.k, P.scale);
    }
}
