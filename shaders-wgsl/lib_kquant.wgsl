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
