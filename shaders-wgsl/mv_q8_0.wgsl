// Q8_0 matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x): one
// whole block per unit, for 4 rows at once so the block's x is loaded once. Blocks start on even
// bytes (34 per block): the quant words are read with wu32e.
const MV_UNIT: u32 = 32u;

// Unit u of the 4 rows at byte offsets rb; xb = the vec4 index of x[0].
fn mv_unit4(rb: vec4<u32>, u: u32, xb: u32) -> vec4<f32> {
    let bb = rb + vec4<u32>(u * BLOCK_BYTES);
    let q = bb + vec4<u32>(2u);
    let x = xb + 8u * u;
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < 8u; k++) {
        let xk = xv(x + k);
        let o = 4u * k;
        s += vec4<f32>(dot(i8x4(wu32e(q.x + o)), xk), dot(i8x4(wu32e(q.y + o)), xk), dot(i8x4(wu32e(q.z + o)), xk),
                       dot(i8x4(wu32e(q.w + o)), xk));
    }
    return s * vec4<f32>(wf16(bb.x), wf16(bb.y), wf16(bb.z), wf16(bb.w));
}
