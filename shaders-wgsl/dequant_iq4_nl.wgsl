// IQ4_NL (18 bytes / 32): f16 d, 16 bytes of nibbles (layout as Q4_0) indexing the fixed
// non-linear codebook. y = d * kvalues[q].
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

// ggml's kvalues_iq4nl, four per column (lut16).
const KVALUES_IQ4NL = mat4x4<f32>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                   1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let b = wbyte(block_byte + 2u + (i & 15u));
    let q = select(b & 0xfu, b >> 4u, i >= 16u);
    return d * lut16(KVALUES_IQ4NL, q);
}
