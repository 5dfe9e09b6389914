// Q4_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x):
// unit u of a row is part u % 8 of block u / 8 (mv_kquant.wgsl), one vec4 of quants.
const MV_UNIT: u32 = 32u;

fn mv_unit(rb: u32, u: u32, xb: u32) -> f32 {
    let b = u >> 3u;
    let p = u & 7u;
    let q0 = (rb >> 4u) + 9u * b;
    let x0 = xb + 64u * b + 16u * (p >> 1u) + 4u * (p & 1u);
    return kq_mv(wq(q0), p, wq(q0 + 1u + p), vec4<u32>(0u), false, x0);
}
