// Q5_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x):
// unit u of a row is part u % 8 of block u / 8 (mv_kquant.wgsl): a vec4 of quants and the vec4
// of qh bytes for the same l = 16(p & 1) + [0, 16).
const MV_UNIT: u32 = 32u;

fn mv_unit(rb: u32, u: u32, xb: u32) -> f32 {
    let b = u >> 3u;
    let p = u & 7u;
    let q0 = (rb >> 4u) + 11u * b;
    let x0 = xb + 64u * b + 16u * (p >> 1u) + 4u * (p & 1u);
    return kq_mv(wq(q0), p, wq(q0 + 3u + p), wq(q0 + 1u + (p & 1u)), true, x0);
}
