// Q5_0 (22 bytes / 32): f16 d, u32 qh (bit i = 5th bit of element i), 16 bytes of nibbles
// (layout as Q4_0). y = (q - 16) * d.
const QK: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte);
    // Bit i of the little-endian u32 is bit (i & 7) of byte i / 8.
    let h = ((wbyte(block_byte + 2u + (i >> 3u)) >> (i & 7u)) & 1u) << 4u;
    let b = wbyte(block_byte + 6u + (i & 15u));
    let q = select(b & 0xfu, b >> 4u, i >= 16u) | h;
    return f32(i32(q) - 16) * d;
}
