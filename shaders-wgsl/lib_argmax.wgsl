// The argmax rule shared by argmax.wgsl (one pass) and argmax_split.wgsl + argmax_combine.wgsl
// (two passes for long rows), the CPU backend's (the sampler's): the first index wins ties, NaN
// and -inf are never chosen, and a row with nothing else gives NON_FINITE (0xffffffff).

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

// The workgroup's best of every invocation's (bv, bi), in best_val[0], best_idx[0]. An
// invocation that saw nothing passes (NaN, 0xffffffff), which loses to everything.
fn wg_best(bv: f32, bi: u32, li: u32) {
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
}

// The row's answer from its best (v, i): NON_FINITE when the winner is NaN or -inf (the row has
// no allowed value).
fn argmax_result(v: f32, i: u32) -> u32 {
    if (is_nan(v) || v == from_bits(0xff800000u)) {
        return 0xffffffffu;
    }
    return i;
}
