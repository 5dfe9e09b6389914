// Q6_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x), for
// 4 rows at once so the unit's x is loaded once. Unit u of a row is part p = u % 8 of block
// u / 8: h = p / 4, l = 8(p % 4) + [0, 8), all four k (32 elements: 8 each at 128h + 32k + l).
// Blocks are 210 bytes, so a block starts on an even byte: words are read with wu32e.
const MV_UNIT: u32 = 32u;

// 8 elements of sub-row k: ql words at ql, ql + 4; their qh words qa, qb.
fn q6_dot8(ql: u32, qa: u32, qb: u32, k: u32, xa: vec4<f32>, xc: vec4<f32>) -> f32 {
    return dot(q6x4(wu32e(ql), qa, k), xa) + dot(q6x4(wu32e(ql + 4u), qb, k), xc);
}

// Unit u of the 4 rows at byte offsets rb; xb = the vec4 index of x[0].
fn mv_unit4(rb: vec4<u32>, u: u32, xb: u32) -> vec4<f32> {
    let b = u >> 3u;
    let p = u & 7u;
    let bb = rb + vec4<u32>(b * BLOCK_BYTES);
    let h = p >> 2u;
    let l = 8u * (p & 3u);
    let ql0 = bb + vec4<u32>(64u * h + l);
    let qh0 = bb + vec4<u32>(128u + 32u * h + l);
    // Sub-block scale of element 128h + 32k + l is byte 8h + 2k + l / 16.
    let sc0 = bb + vec4<u32>(192u + 8u * h + (l >> 4u));
    let x0 = xb + 64u * b + 32u * h + (l >> 2u);
    let qa = vec4<u32>(wu32e(qh0.x), wu32e(qh0.y), wu32e(qh0.z), wu32e(qh0.w));
    let qb = vec4<u32>(wu32e(qh0.x + 4u), wu32e(qh0.y + 4u), wu32e(qh0.z + 4u), wu32e(qh0.w + 4u));
    var s = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        let xa = xv(x0 + 8u * k);
        let xc = xv(x0 + 8u * k + 1u);
        let ql = ql0 + vec4<u32>(32u * (k & 1u));
        let sc = sc0 + vec4<u32>(2u * k);
        s += vec4<f32>(f32(wi8(sc.x)), f32(wi8(sc.y)), f32(wi8(sc.z)), f32(wi8(sc.w)))
           * vec4<f32>(q6_dot8(ql.x, qa.x, qb.x, k, xa, xc), q6_dot8(ql.y, qa.y, qb.y, k, xa, xc),
                       q6_dot8(ql.z, qa.z, qb.z, k, xa, xc), q6_dot8(ql.w, qa.w, qb.w, k, xa, xc));
    }
    return s * vec4<f32>(wf16(bb.x + 208u), wf16(bb.y + 208u), wf16(bb.z + 208u), wf16(bb.w + 208u));
}
