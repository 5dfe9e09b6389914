// The gate and up products of the MoE experts, the shared expert among them (lib_moe_sh.wgsl),
// and the SwiGLU: h[s][r] = silu(dot(G_e[r], x[t])) * dot(U_e[r], x[t]) for every entry s of token
// t (W = routed gate, W2 = routed up, W3 = shared gate, W4 = shared up; one format). Each
// invocation's MV_R gate and MV_R up rows share each unit's x, as in matvec_swiglu.wgsl. The
// arithmetic is moe_matvec.wgsl's gate and up passes': the routed experts' hidden rows are bit
// for bit theirs (the shared expert's are matvec_swiglu.wgsl's without packed dots). Slot j's
// expert comes from `sh_expert` (lib_moe_sh_ids.wgsl): read from ids.
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> W2: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> W3: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> W4: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> h: array<f32>;

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: MvLanes) {
    let lw = P.lanes;
    let per = P.k + 1u;
    let g = linear_wg(wg, nwg);
    let s = g / P.row_groups;
    let t = s / per;
    let j = s % per;
    let flat = mv_flat(li, lanes);
    let r0 = sh_first_row(g, flat);
    // In uniform control flow: the routing variant's barriers.
    let routed = sh_expert(g, t, j, li);
    // Workgroups past the last entry and invalid ids read nothing (e = n_exp); the shared
    // expert is expert 0 of W3 / W4.
    var e = P.n_exp;
    var base = 0u;
    if (t < P.n_tok) {
        if (j < P.k) {
            e = routed;
        } else {
            e = 0u;
            base = 2u;
        }
    }
    // Not a uniform early return (e is a storage or workgroup-memory read): inactive workgroups still reduce zeros.
    let ok = e < P.n_exp;
    let eb = e * P.rows;
    let rb_lo = sh_row_bytes(eb, r0);
    let rb_hi = sh_row_bytes(eb, r0 + 4u);
    let xb = t * (P.n_in / 4u);
    var ga = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
    var ua = ga;
    if (ok) {
        for (var u = flat % lw; u < P.units; u += lw) {
            let x = mv_x(u, xb);
            wsel = base;
            ga = mv_add(ga, rb_lo, rb_hi, u, x);
            wsel = base + 1u;
            ua = mv_add(ua, rb_lo, rb_hi, u, x);
        }
    }
    let sg = mv_sums(ga, flat, lw, lanes);
    let su = mv_sums(ua, flat, lw, lanes);
    if (ok && flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                h[s * P.rows + r0 + r] = silu(mv_row(sg, r)) * mv_row(su, r);
            }
        }
    }
}
