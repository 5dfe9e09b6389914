// Q5_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x):
// unit u of a row is part u % 8 of block u / 8 (mv_kquant.wgsl): a vec4 of quants and the vec4
// of qh bytes for the same l = 16(p & 1) + [0, 16).
const MV_UNIT: u32 = 32u;

// Unit u of the 4 rows at byte offsets rb; xb = the vec4 index of x[0].
fn mv_unit4(rb: vec4<u32>, u: u32, xb: u32) -> vec4<f32> {
    let b = u >> 3u;
    let p = u & 7u;
    let q0 = (rb >> vec4<u32>(4u)) + vec4<u32>(11u * b);
    let x0 = xb + 64u * b + 16u * (p >> 1u) + 4u * (p & 1u);
    return kq_mv4(q0, p, 3u + p, 1u + (p & 1u), true, x0);
}
