// The down products of the MoE experts, the shared expert among them (lib_moe_sh.wgsl), summed
// per token in the same dispatch: out[t][o] = sum over the valid slots j < k of
// weights[t * k + j] * dot(D_e[o], h[t * (k + 1) + j]) + sigmoid(gate_logit[t]) *
// dot(Dsh[o], h[t * (k + 1) + k]) (W = routed down, W2 = shared down; one format). A row group's
// lanes stride over the (entry, unit) pairs of its rows, all k + 1 entries' units in one run (a
// hidden row is only a few units long: one entry per lane would leave most lanes idle), each
// unit's partial sums weighted as they are added; then one reduction. The terms of
// moe_combine.wgsl and sigmoid_scale_add.wgsl, rounded in another order (within the
// matrix-vector bound).
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> W2: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> ids: array<u32>;
@group(0) @binding(4) var<storage, read> weights: array<f32>;
@group(0) @binding(5) var<storage, read> gate_logit: array<f32>;
@group(0) @binding(6) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, lanes: MvLanes) {
    let lw = P.lanes;
    let g = linear_wg(wg, nwg);
    let t = g / P.row_groups;
    // Uniform per workgroup, so the reduction's barriers stay in uniform control flow.
    if (t >= P.n_tok) {
        return;
    }
    let flat = mv_flat(li, lanes);
    let r0 = sh_first_row(g, flat);
    let per = P.k + 1u;
    var acc = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var q = flat % lw; q < per * P.units; q += lw) {
        let j = q / P.units;
        let u = q % P.units;
        // The shared expert: expert 0 of W2, weighted by its gate.
        var e = 0u;
        var wt = 0.0;
        wsel = 1u;
        if (j < P.k) {
            e = ids[t * P.k + j];
            wt = weights[t * P.k + j];
            wsel = 0u;
        } else {
            wt = sigmoid(gate_logit[t]);
        }
        if (e < P.n_exp) {
            let eb = e * P.rows;
            let xb = (t * per + j) * (P.n_in / 4u);
            let z = MvAcc(vec4<f32>(0.0), vec4<f32>(0.0));
            let a = mv_add(z, sh_row_bytes(eb, r0), sh_row_bytes(eb, r0 + 4u), u, mv_x(u, xb));
            acc = MvAcc(fma(vec4<f32>(wt), a.lo, acc.lo), fma(vec4<f32>(wt), a.hi, acc.hi));
        }
    }
    let y = mv_sums(acc, flat, lw, lanes);
    if (flat % lw == 0u) {
        for (var r = 0u; r < MV_R; r++) {
            if (r0 + r < P.rows) {
                out[t * P.rows + r0 + r] = mv_row(y, r);
            }
        }
    }
}
