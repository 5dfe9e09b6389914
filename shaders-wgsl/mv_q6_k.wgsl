// Q6_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x): 64
// elements. Unit u of a row is quarter (h, t) = ((u % 4) / 2, u % 2) of block u / 4: elements
// 128h + 32k + 16t + l, k < 4, l < 16. Their low 4 bits are the 16 ql bytes at 64h + 16t (k = 0
// low nibbles, k = 2 high) and at 64h + 32 + 16t (k = 1, 3), their high 2 bits bits 2k of the 16
// qh bytes at 128 + 32h + 16t, their scale byte 192 + 8h + 2k + t. Blocks are 210 bytes, so a
// block starts on any even byte: the three 16-byte windows are realigned in registers (win16;
// q6_unit, dequant_q6_k.wgsl).
// Per row: d * sum_k sc_k * sum(q x), q = 6-bit quant - 32.
const MV_UNIT: u32 = 64u;

// The unit's x: the 16 elements of each k (segments a..d, lib_mv_unit.wgsl).
struct MvX {
    a: mat4x4<f32>,
    b: mat4x4<f32>,
    c: mat4x4<f32>,
    d: mat4x4<f32>,
}

fn mv_x(u: u32, xb: u32) -> MvX {
    let w = u & 3u;
    let x0 = xb + 64u * (u >> 2u) + 32u * (w >> 1u) + 4u * (w & 1u);
    return MvX(mv_xseg(x0), mv_xseg(x0 + 8u), mv_xseg(x0 + 16u), mv_xseg(x0 + 24u));
}

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let q = q6_unit(rb, u);
    let sq = vec4<f32>(mv_seg(q.a, 32.0, x.a), mv_seg(q.b, 32.0, x.b), mv_seg(q.c, 32.0, x.c), mv_seg(q.d, 32.0, x.d));
    return q.scale * dot(q.sc, sq);
}
