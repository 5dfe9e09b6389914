// The packed 6-bit scales and mins of Q4_K and Q5_K (ggml's get_scale_min_k4): 12 bytes in the
// words s.x, s.y, s.z (bytes 4..15 of the block). Returns (scale, min) of sub-block j < 8.
fn kq_byte(s: vec3<u32>, k: u32) -> u32 {
    return (s[k >> 2u] >> ((k & 3u) << 3u)) & 0xffu;
}

fn kq_scale_min(j: u32, s: vec3<u32>) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(kq_byte(s, j) & 63u, kq_byte(s, j + 4u) & 63u);
    }
    let b = kq_byte(s, j + 4u);
    return vec2<u32>((b & 0xfu) | ((kq_byte(s, j - 4u) >> 6u) << 4u), (b >> 4u) | ((kq_byte(s, j) >> 6u) << 4u));
}

// The scale words of the block at byte offset bb (16-byte aligned in Q4_K and Q5_K rows).
fn kq_scales(bb: u32) -> vec3<u32> {
    return wq(bb >> 4u).yzw;
}

// The scales (x) and mins (y) of a matrix-vector unit's four sub-blocks 2c, 2c + 1, 2c + 4, 2c + 5
// (mv_kquant.wgsl, mv_q4_k_dot.wgsl), one byte each; hd is the block's first vec4.
fn kq_unit_scales(hd: vec4<u32>, c: u32) -> vec2<u32> {
    // Scale bytes 2c, 2c + 1 (hd.y), 4 + 2c, 5 + 2c (hd.z), 8 + 2c, 9 + 2c (hd.w): half word c.
    let sh = 16u * c;
    let hx = (hd.y >> sh) & 0xffffu;
    let hy = (hd.z >> sh) & 0xffffu;
    let hz = (hd.w >> sh) & 0xffffu;
    // Bytes: sub-blocks 2c, 2c + 1 (j < 4: low 6 bits) then 2c + 4, 2c + 5 (j >= 4: a nibble of
    // bytes 8.. and the top 2 bits of bytes 0.. / 4..).
    let sc = (hx & 0x3f3fu) | (((hz & 0x0f0fu) | ((hx >> 2u) & 0x3030u)) << 16u);
    let mn = (hy & 0x3f3fu) | ((((hz >> 4u) & 0x0f0fu) | ((hy >> 2u) & 0x3030u)) << 16u);
    return vec2<u32>(sc, mn);
}
