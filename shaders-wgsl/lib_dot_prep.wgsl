// x quantized for the packed-integer-dot matrix-vector units (lib_mv_dot.wgsl; RILL_WGPU_MV_DOT,
// caps.rs), one call per block of 32 elements (mv_dot_prep.wgsl,
// or a norm writing its output's planes, lib_norm_dot.wgsl). With s a power of two such that
// max|x| / s is in (63.5, 127] (so x / s is exact), three signed-byte planes
//   a = round(x / s), b = round((x / s - a) * 254), c = round(((x / s - a) * 254 - b) * 254)
// give x = s (a + b / 254 + c / 254^2) + e with |e| <= s (0.5 + 2^-17) / 254^2, below
// 1.3e-7 max|x| of the block (and 2^-126 * 7.8e-6 absolute for blocks below 2^-120): with
// integer sums of (quant x plane) products, exact in i32, a product keeps f32's precision.
// Each |plane value| <= 127 (a: by the choice of s; b, c: |remainder| <= 1/2), so all are int8.
// Output block (XQ_VEC4 = 7 vec4s): plane a (elements 0..15, 16..31), plane b, plane c, then
// (s, sum of elements 0..15, sum of 16..31, 0) as f32 bits, the sums taken in the order of
// mv_xsum (lib_mv_unit.wgsl) so the Q4_K min term is what the f32 unit computes.
// The including file defines `xp_load(v)`, vec4 v of x, and `xp_store(v, q)`, vec4 v of the planes.

// Four signed values (each in [-127, 127)) as the bytes of a word, element 0 in byte 0.
fn pack_i8(v: vec4<f32>) -> u32 {
    let b = vec4<u32>(bitcast<vec4<u32>>(vec4<i32>(v)) & vec4<u32>(0xffu)) << vec4<u32>(0u, 8u, 16u, 24u);
    return b.x | b.y | b.z | b.w;
}

// The three planes of 4 elements, t = x / s (exact).
fn planes4(t: vec4<f32>) -> vec3<u32> {
    let a = round(t);
    // t - a is exact (Sterbenz); the products by 254 round by at most 2^-24 of 127, which
    // moves the reconstruction by under 2^-17 / 254^2 of s.
    let r1 = (t - a) * 254.0;
    let b = round(r1);
    let c = round((r1 - b) * 254.0);
    return vec3<u32>(pack_i8(a), pack_i8(b), pack_i8(c));
}

// Block `blk` of x (elements 32 blk ..) into vec4s XQ_VEC4 blk .. of the planes.
fn dot_prep_block(blk: u32) {
    let i = 8u * blk;
    var m4 = vec4<f32>(0.0);
    for (var k = 0u; k < 8u; k++) {
        m4 = max(m4, abs(xp_load(i + k)));
    }
    let m = max(max(m4.x, m4.y), max(m4.z, m4.w));
    // s = 2^(E - 6) for m in [2^E, 2^(E + 1)), doubled where m / s > 127; at least 2^-126 (a
    // normal float, so 1 / s is one too). Built from exponent bits: exact, unlike exp2/log2.
    var se = max(i32((bitcast<u32>(m) >> 23u) & 0xffu) - 6, 1);
    if (m * bitcast<f32>(u32(254 - se) << 23u) > 127.0) {
        se += 1;
    }
    let s = bitcast<f32>(u32(se) << 23u);
    let inv = bitcast<f32>(u32(254 - se) << 23u);
    let o = XQ_VEC4 * blk;
    var sums = vec2<f32>(0.0);
    for (var h = 0u; h < 2u; h++) {
        let x0 = xp_load(i + 4u * h);
        let x1 = xp_load(i + 4u * h + 1u);
        let x2 = xp_load(i + 4u * h + 2u);
        let x3 = xp_load(i + 4u * h + 3u);
        let p0 = planes4(x0 * inv);
        let p1 = planes4(x1 * inv);
        let p2 = planes4(x2 * inv);
        let p3 = planes4(x3 * inv);
        xp_store(o + h, vec4<u32>(p0.x, p1.x, p2.x, p3.x));
        xp_store(o + 2u + h, vec4<u32>(p0.y, p1.y, p2.y, p3.y));
        xp_store(o + 4u + h, vec4<u32>(p0.z, p1.z, p2.z, p3.z));
        sums[h] = dot(x0 + x1 + x2 + x3, vec4<f32>(1.0));
    }
    // An infinite or NaN element: the block's scale is m itself, so every product with it is
    // infinite or NaN as in f32 (its planes are meaningless).
    let bad = (bitcast<u32>(m) & 0x7f800000u) == 0x7f800000u;
    xp_store(o + 6u, vec4<u32>(bitcast<u32>(select(s, m, bad)), bitcast<u32>(sums.x), bitcast<u32>(sums.y), 0u));
}
