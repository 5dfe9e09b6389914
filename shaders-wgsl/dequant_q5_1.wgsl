// Q5_1 (24 bytes / 32): f16 d, f16 m, u32 qh, 16 bytes of nibbles (as Q5_0). y = q * d + m.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 24u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    let m = wf16(block_byte + 2u);
    let h = ((wbyte(block_byte + 4u + (i >> 3u)) >> (i & 7u)) & 1u) << 4u;
    let b = wbyte(block_byte + 8u + (i & 15u));
    let q = select(b & 0xfu, b >> 4u, i >= 16u) | h;
    return f32(q) * d + m;
}
