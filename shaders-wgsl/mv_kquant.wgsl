// The matrix-vector unit shared by Q4_K and Q5_K (mv_q4_k.wgsl, mv_q5_k.wgsl). Part p < 8 of the
// block whose header words are h (d, dmin, scales) covers qs bytes 16p..16p+15: their low
// nibbles are elements 64c + 16(p & 1) + [0, 16) of sub-block 2c, their high nibbles the same
// + 32 of sub-block 2c + 1, c = p / 2. For Q5_K (five) qh holds the 16 bytes of 5th bits of the
// same l; x0 is the vec4 index of the first element's x.
// Sum of (d * sc) * q * x - (dmin * m) * x over the 32 elements.
fn kq_mv(h: vec4<u32>, p: u32, qs: vec4<u32>, qh: vec4<u32>, five: bool, x0: u32) -> f32 {
    let c = p >> 1u;
    var q_lo = 0.0;
    var q_hi = 0.0;
    var x_lo = vec4<f32>(0.0);
    var x_hi = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        let xl = xv(x0 + k);
        let xh = xv(x0 + 8u + k);
        var ql = nib4(qs[k], 0u);
        var qu = nib4(qs[k], 1u);
        if (five) {
            ql += 16.0 * bytes_bit(qh[k], 2u * c);
            qu += 16.0 * bytes_bit(qh[k], 2u * c + 1u);
        }
        q_lo += dot(ql, xl);
        q_hi += dot(qu, xh);
        x_lo += xl;
        x_hi += xh;
    }
    let d = f16x2(h.x);
    let sm_lo = kq_scale_min(2u * c, h.yzw);
    let sm_hi = kq_scale_min(2u * c + 1u, h.yzw);
    let one = vec4<f32>(1.0);
    return d.x * (f32(sm_lo.x) * q_lo + f32(sm_hi.x) * q_hi)
         - d.y * (f32(sm_lo.y) * dot(x_lo, one) + f32(sm_hi.y) * dot(x_hi, one));
}
