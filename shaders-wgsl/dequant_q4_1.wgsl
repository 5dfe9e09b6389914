// Q4_1 (20 bytes / 32): f16 d, f16 m, 16 bytes of nibbles (layout as Q4_0). y = q * d + m.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let m = wf16(block_byte + 2u);
    let b = wbyte(block_byte + 4u + (i & 15u));
    let q = select(b & 0xfu, b >> 4u, i >= 16u);
    return f32(q) * d + m;
}
