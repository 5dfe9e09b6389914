// moe_swiglu_route's experts: every workgroup routes its token from the router logits
// (lib_moe_route.wgsl, moe_route.wgsl's code: the same ids and weights bit for bit), which
// saves the routing's dispatch of a decode MoE layer; the token's first workgroup also stores
// its ids and weights for moe_down_sh, the next dispatch.
@group(0) @binding(5) var<storage, read_write> ids: array<u32>;

// The routing runs on the kernel's own workgroup (lib_moe_route.wgsl).
const RT_WG: u32 = MV_WG;
@group(0) @binding(8) var<storage, read> logits: array<f32>;
@group(0) @binding(9) var<storage, read_write> weights: array<f32>;

// The expert of slot j of token t (n_exp for a slot past the last token or the shared slot).
// Workgroup g is entry t * (k + 1) + j's row group g % row_groups. Every invocation calls it, in
// uniform control flow.
fn sh_expert(g: u32, t: u32, j: u32, li: u32) -> u32 {
    let live = t < P.n_tok;
    rt_route(t * P.n_exp, select(0u, P.n_exp, live), P.k, li);
    if (live && g % (P.row_groups * (P.k + 1u)) == 0u && li < P.k) {
        ids[t * P.k + li] = rt_id[li];
        weights[t * P.k + li] = rt_weight(li, P.k, P.scale);
    }
    if (live && j < P.k) {
        return rt_id[j];
    }
    return P.n_exp;
}
