// Row-wise argmax of logits [T, V] into out [T] (U32). One workgroup per row: each invocation
// scans a strided slice of the row, then a tree reduction in workgroup memory picks the winner.
// The CPU backend's rule (the sampler's): the first index wins ties, NaN and -inf are never
// chosen, and a row with nothing else gives NON_FINITE (0xffffffff).

struct Params {
    v: u32, // row length
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> best_val: array<f32, ROW_WG>;
var<workgroup> best_idx: array<u32, ROW_WG>;

// NaN test on the bits: `x != x` may be folded away by a compiler that assumes no NaNs.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// Does candidate (v, i) beat the current best (bv, bi)? Comparisons never see a NaN operand.
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    let vn = is_nan(v);
    let bn = is_nan(bv);
    if (vn != bn) {
        return bn; // a number beats NaN
    }
    if (!vn && v != bv) {
        return v > bv;
    }
    return i < bi; // equal values (or both NaN): the first index wins
}

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = linear_wg(wg, nwg);
    let base = row * P.v;
    // Strided scan; an invocation with no element keeps index 0xffffffff, which loses every tie.
    var bv = bitcast<f32>(0x7fc00000u); // NaN
    var bi = 0xffffffffu;
    for (var i = li; i < P.v; i += ROW_WG) {
        let x = logits[base + i];
        if (better(x, i, bv, bi)) {
            bv = x;
            bi = i;
        }
    }
    best_val[li] = bv;
    best_idx[li] = bi;
    workgroupBarrier();
    for (var stride = ROW_WG / 2u; stride > 0u; stride >>= 1u) {
        if (li < stride) {
            let v = best_val[li + stride];
            let i = best_idx[li + stride];
            if (better(v, i, best_val[li], best_idx[li])) {
                best_val[li] = v;
                best_idx[li] = i;
            }
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        // The winner is NaN or -inf only when the row has no allowed value.
        let b = best_val[0];
        if (is_nan(b) || b == bitcast<f32>(0xff800000u)) {
            out[row] = 0xffffffffu;
        } else {
            out[row] = best_idx[0];
        }
    }
}
