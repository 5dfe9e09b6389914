// IQ4_XS (136 bytes / 256): f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of nibbles.
// Sub-block ib (32 elements) has the 6-bit scale ls = (low nibble ib of scales_l) |
// (2 bits ib of scales_h) << 4; dl = d * (ls - 32); its 16 bytes hold elements j < 16 in the
// low nibbles and j + 16 in the high nibbles. y = dl * kvalues[q].
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 136u;

// ggml's kvalues_iq4nl, four per column (lut16).
const KVALUES_IQ4NL = mat4x4<f32>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                   1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let ib = i >> 5u;
    let lo = (wbyte(block_byte + 4u + (ib >> 1u)) >> (4u * (ib & 1u))) & 0xfu;
    let hi = (wu16(block_byte + 2u) >> (2u * ib)) & 3u;
    let dl = d * f32(i32(lo | (hi << 4u)) - 32);
    let j = i & 31u;
    let b = wbyte(block_byte + 8u + 16u * ib + (j & 15u));
    let q = select(b & 0xfu, b >> 4u, j >= 16u);
    return dl * lut16(KVALUES_IQ4NL, q);
}
