// Q5_K (176 bytes / 256): f16 d, f16 dmin, 12 bytes of scales/mins (as Q4_K), 32 bytes qh,
// 128 bytes of nibbles. Element i = 64c + 32hi + l is nibble hi of qs[32c + l] plus bit j of
// qh[l] as its 5th bit, j = i / 32 its sub-block. y = (d * sc) * q - dmin * m.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

// 6-bit scale (x) and min (y) of sub-block j from the 12 bytes at byte offset `s`.
fn scale_min_k4(j: u32, s: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(wbyte(s + j) & 63u, wbyte(s + j + 4u) & 63u);
    }
    let b = wbyte(s + j + 4u);
    return vec2<u32>((b & 0xfu) | ((wbyte(s + j - 4u) >> 6u) << 4u), (b >> 4u) | ((wbyte(s + j) >> 6u) << 4u));
}

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let dmin = wf16(block_byte + 2u);
    let j = i >> 5u;
    let l = i & 31u;
    let sm = scale_min_k4(j, block_byte + 4u);
    let dl = d * f32(sm.x);
    let ml = dmin * f32(sm.y);
    let b = wbyte(block_byte + 48u + 32u * (j >> 1u) + l);
    let h = ((wbyte(block_byte + 16u + l) >> j) & 1u) << 4u;
    let q = select(b & 0xfu, b >> 4u, (j & 1u) != 0u) | h;
    return dl * f32(q) - ml;
}
