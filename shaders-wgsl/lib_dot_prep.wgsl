// x quantized for the packed-integer-dot matrix-vector units (lib_mv_dot.wgsl; RILL_WGPU_MV_DOT,
// caps.rs), per block of 32 elements: the format, defined once here for both writers (mv_dot_prep.wgsl,
// one invocation per block; a norm writing its output's planes, lib_norm_dot.wgsl, eight
// invocations per block, each with 4 elements). With s a power of two such that
// max|x| / s is in (63.5, 127] (so x / s is exact), three signed-byte planes
//   a = round(x / s), b = round((x / s - a) * 254), c = round(((x / s - a) * 254 - b) * 254)
// give x = s (a + b / 254 + c / 254^2) + e with |e| <= s (0.5 + 2^-17) / 254^2, below
// 1.3e-7 max|x| of the block (and 2^-126 * 7.8e-6 absolute for blocks below 2^-120): with
// integer sums of (quant x plane) products, exact in i32, a product keeps f32's precision.
// Each |plane value| <= 127 (a: by the choice of s; b, c: |remainder| <= 1/2), so all are int8.
// Output block (XQ_VEC4 = 7 vec4s): plane a (elements 0..15, 16..31), plane b, plane c, then
// (s, sum of elements 0..15, sum of 16..31, 0) as f32 bits, the sums taken in the order of
// mv_xsum (lib_mv_unit.wgsl) so the Q4_K min term is what the f32 unit computes.

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

// The block's scale word (what the products read as s) and 1 / s, from m = max|x| of the block.
struct XpScale {
    word: u32,
    inv: f32,
}

fn xp_scale(m: f32) -> XpScale {
    // s = 2^(E - 6) for m in [2^E, 2^(E + 1)), doubled where m / s > 127; at least 2^-126 (a
    // normal float, so 1 / s is one too). Built from exponent bits: exact, unlike exp2/log2.
    var se = max(i32((bitcast<u32>(m) >> 23u) & 0xffu) - 6, 1);
    if (m * bitcast<f32>(u32(254 - se) << 23u) > 127.0) {
        se += 1;
    }
    // An infinite or NaN element: the block's scale is m itself, so every product with it is
    // infinite or NaN as in f32 (its planes are meaningless).
    let bad = (bitcast<u32>(m) & 0x7f800000u) == 0x7f800000u;
    return XpScale(select(u32(se) << 23u, bitcast<u32>(m), bad), bitcast<f32>(u32(254 - se) << 23u));
}

// The largest |element| of 4.
fn xp_absmax(x: vec4<f32>) -> f32 {
    let a = abs(x);
    return max(max(a.x, a.y), max(a.z, a.w));
}

// The sum of a half block (elements 0..15 or 16..31, four vec4s in order), in mv_xsum's order:
// both writers call this, so their sums agree bit for bit.
fn xp_sum(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> f32 {
    return dot(x0 + x1 + x2 + x3, vec4<f32>(1.0));
}

// A half block's three plane words (elements 0..15 or 16..31 of the block as four vec4s, times
// 1 / s) and its sum.
struct XpHalf {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    sum: f32,
}

fn xp_half(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, inv: f32) -> XpHalf {
    let p0 = planes4(x0 * inv);
    let p1 = planes4(x1 * inv);
    let p2 = planes4(x2 * inv);
    let p3 = planes4(x3 * inv);
    return XpHalf(vec4<u32>(p0.x, p1.x, p2.x, p3.x), vec4<u32>(p0.y, p1.y, p2.y, p3.y),
                  vec4<u32>(p0.z, p1.z, p2.z, p3.z), xp_sum(x0, x1, x2, x3));
}

// A whole block's words in storage order (planes a, b, c of each half, then the scale word and
// the half sums): the writers that hold a whole block (mv_dot_prep.wgsl, lib_att_xq.wgsl) build
// them here, so their planes agree bit for bit. Plain values, no array: nothing spills.
struct XpBlock {
    lo: XpHalf,
    hi: XpHalf,
    scale: u32,
}

fn xp_block(x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>, x5: vec4<f32>,
            x6: vec4<f32>, x7: vec4<f32>) -> XpBlock {
    let m = max(max(max(xp_absmax(x0), xp_absmax(x1)), max(xp_absmax(x2), xp_absmax(x3))),
                max(max(xp_absmax(x4), xp_absmax(x5)), max(xp_absmax(x6), xp_absmax(x7))));
    let sc = xp_scale(m);
    return XpBlock(xp_half(x0, x1, x2, x3, sc.inv), xp_half(x4, x5, x6, x7, sc.inv), sc.word);
}

// Word k (0 .. XQ_VEC4 - 1) of a block in storage order.
fn xp_word(b: XpBlock, k: u32) -> vec4<u32> {
    switch (k) {
        case 0u: { return b.lo.a; }
        case 1u: { return b.hi.a; }
        case 2u: { return b.lo.b; }
        case 3u: { return b.hi.b; }
        case 4u: { return b.lo.c; }
        case 5u: { return b.hi.c; }
        default: { return vec4<u32>(b.scale, bitcast<u32>(b.lo.sum), bitcast<u32>(b.hi.sum), 0u); }
    }
}
