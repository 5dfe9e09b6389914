// Q4_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x):
// unit u of a row is part u % 8 of block u / 8 (mv_kquant.wgsl), one vec4 of quants.
const MV_UNIT: u32 = 32u;

// Unit u of the 4 rows at byte offsets rb; xb = the vec4 index of x[0].
fn mv_unit4(rb: vec4<u32>, u: u32, xb: u32) -> vec4<f32> {
    let b = u >> 3u;
    let p = u & 7u;
    let q0 = (rb >> vec4<u32>(4u)) + vec4<u32>(9u * b);
    let x0 = xb + 64u * b + 16u * (p >> 1u) + 4u * (p & 1u);
    return kq_mv4(q0, p, 1u + p, 0u, false, x0);
}
