// out[t][o] = sum over the valid slots j of weights[t][j] * y[t * k + j][o], added in increasing
// (expert id, slot) order like the CPU backend (which visits experts in id order). Slots with an
// id >= n_exp are skipped. One workgroup per (token, 256 outputs).
struct Params {
    n_tok: u32,
    d: u32,
    k: u32,
    n_exp: u32,
    chunks: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

var<workgroup> order: array<u32, MOE_MAX_K>;

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = linear_wg(wg, nwg);
    let t = g / P.chunks;
    let o = (g % P.chunks) * ELT_WG + li;
    let live = t < P.n_tok;
    // Rank of slot li by (id, slot): distinct keys, so the ranks are a permutation of 0..k.
    if (live && li < P.k) {
        let my = ids[t * P.k + li];
        var rank = 0u;
        for (var j = 0u; j < P.k; j++) {
            let other = ids[t * P.k + j];
            if (other < my || (other == my && j < li)) {
                rank++;
            }
        }
        order[rank] = li;
    }
    workgroupBarrier();
    if (live && o < P.d) {
        var acc = 0.0;
        for (var r = 0u; r < P.k; r++) {
            let s = t * P.k + order[r];
            if (ids[s] < P.n_exp) {
                acc += weights[s] * y[s * P.d + o];
            }
        }
        out[t * P.d + o] = acc;
    }
}
