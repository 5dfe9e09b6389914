// Q6_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x).
// Matrix-vector unit u of a row: block u / 8, part p = u % 8: h = p / 4, l = 8(p % 4) + [0, 8),
// all four k (32 elements: 8 each at 128h + 32k + l).
const MV_UNIT: u32 = 32u;

fn mv_unit(rb: u32, u: u32, xb: u32) -> f32 {
    let b = u >> 3u;
    let p = u & 7u;
    let bb = rb + b * BLOCK_BYTES;
    let h = p >> 2u;
    let l = 8u * (p & 3u);
    let ql0 = bb + 64u * h + l;
    let qh0 = bb + 128u + 32u * h + l;
    // Sub-block scale of element 128h + 32k + l is byte 8h + 2k + l / 16.
    let sc0 = bb + 192u + 8u * h + (l >> 4u);
    let x0 = xb + 64u * b + 32u * h + (l >> 2u);
    let qh_a = wu32e(qh0);
    let qh_b = wu32e(qh0 + 4u);
    var s = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let ql = ql0 + 32u * (k & 1u);
        let x = x0 + 8u * k;
        let dot8 = dot(q6x4(wu32e(ql), qh_a, k), xv(x)) + dot(q6x4(wu32e(ql + 4u), qh_b, k), xv(x + 1u));
        s += f32(wi8(sc0 + 2u * k)) * dot8;
    }
    return wf16(bb + 208u) * s;
}
