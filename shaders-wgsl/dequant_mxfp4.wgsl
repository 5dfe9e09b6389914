// MXFP4 (17 bytes / 32): an E8M0 exponent byte e, then 16 bytes of e2m1 nibbles (layout as
// Q4_0). Values are the e2m1 table doubled times half the scale, 2^(e - 128) (ggml's
// GGML_E8M0_TO_FP32_HALF). Blocks are 17 bytes, so block_byte may be odd: bytes only.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 17u;

// e2m1 values doubled: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times two; bit 3 is the sign;
// four per column (lut16).
const MXFP4_VALUES = mat4x4<f32>(0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                                  0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);

fn e8m0_half(e: u32) -> f32 {
    // e = 0, 1 give f32 subnormals (2^-128, 2^-127). A GPU may flush those to zero; such
    // blocks hold values below 2^-125 that no real model uses.
    if (e < 2u) {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = e8m0_half(wbyte(block_byte));
    let b = wbyte(block_byte + 1u + (i & 15u));
    let q = select(b & 0xfu, b >> 4u, i >= 16u);
    return lut16(MXFP4_VALUES, q) * d;
}
