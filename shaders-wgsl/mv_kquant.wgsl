// The matrix-vector unit shared by Q4_K and Q5_K (mv_q4_k.wgsl, mv_q5_k.wgsl), for 4 rows at
// once so the unit's x is loaded once. Part p < 8 of a block covers qs bytes 16p..16p+15: their
// low nibbles are elements 64c + 16(p & 1) + [0, 16) of sub-block 2c, their high nibbles the same
// + 32 of sub-block 2c + 1, c = p / 2. For Q5_K (five) the 16 qh bytes of the same l hold the
// 5th bits. q0 = the vec4 index of each row's block; qs_at, qh_at = the vec4 offsets of the
// part's quants and high bits in the block; x0 = the vec4 index of the first element's x.
// Per row: sum of (d * sc) * q * x - (dmin * m) * x over the 32 elements.

// Quants of four elements: nibbles `hi` of w, plus 16 * bit j of each qh byte for Q5_K.
fn kq_q4(w: u32, qh: u32, hi: u32, j: u32, five: bool) -> vec4<f32> {
    if (five) {
        return nib4(w, hi) + 16.0 * bytes_bit(qh, j);
    }
    return nib4(w, hi);
}

// One row's result from its header words h, the part's dot products and the sums of x.
fn kq_fin(h: vec4<u32>, c: u32, q_lo: f32, q_hi: f32, x_lo: f32, x_hi: f32) -> f32 {
    let d = f16x2(h.x);
    let lo = kq_scale_min(2u * c, h.yzw);
    let hi = kq_scale_min(2u * c + 1u, h.yzw);
    return d.x * (f32(lo.x) * q_lo + f32(hi.x) * q_hi) - d.y * (f32(lo.y) * x_lo + f32(hi.y) * x_hi);
}

fn kq_mv4(q0: vec4<u32>, p: u32, qs_at: u32, qh_at: u32, five: bool, x0: u32) -> vec4<f32> {
    let c = p >> 1u;
    let s0 = wq(q0.x + qs_at);
    let s1 = wq(q0.y + qs_at);
    let s2 = wq(q0.z + qs_at);
    let s3 = wq(q0.w + qs_at);
    var h0 = vec4<u32>(0u);
    var h1 = vec4<u32>(0u);
    var h2 = vec4<u32>(0u);
    var h3 = vec4<u32>(0u);
    if (five) {
        h0 = wq(q0.x + qh_at);
        h1 = wq(q0.y + qh_at);
        h2 = wq(q0.z + qh_at);
        h3 = wq(q0.w + qh_at);
    }
    let jl = 2u * c;
    var q_lo = vec4<f32>(0.0);
    var q_hi = vec4<f32>(0.0);
    var x_lo = vec4<f32>(0.0);
    var x_hi = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        let xl = xv(x0 + k);
        let xh = xv(x0 + 8u + k);
        q_lo += vec4<f32>(dot(kq_q4(s0[k], h0[k], 0u, jl, five), xl), dot(kq_q4(s1[k], h1[k], 0u, jl, five), xl),
                          dot(kq_q4(s2[k], h2[k], 0u, jl, five), xl), dot(kq_q4(s3[k], h3[k], 0u, jl, five), xl));
        q_hi += vec4<f32>(dot(kq_q4(s0[k], h0[k], 1u, jl + 1u, five), xh), dot(kq_q4(s1[k], h1[k], 1u, jl + 1u, five), xh),
                          dot(kq_q4(s2[k], h2[k], 1u, jl + 1u, five), xh), dot(kq_q4(s3[k], h3[k], 1u, jl + 1u, five), xh));
        x_lo += xl;
        x_hi += xh;
    }
    let one = vec4<f32>(1.0);
    let sl = dot(x_lo, one);
    let sh = dot(x_hi, one);
    return vec4<f32>(kq_fin(wq(q0.x), c, q_lo.x, q_hi.x, sl, sh), kq_fin(wq(q0.y), c, q_lo.y, q_hi.y, sl, sh),
                     kq_fin(wq(q0.z), c, q_lo.z, q_hi.z, sl, sh), kq_fin(wq(q0.w), c, q_lo.w, q_hi.w, sl, sh));
}
