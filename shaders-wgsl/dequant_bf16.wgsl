// BF16 weights: the high half of an f32.
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn deq(block_byte: u32, i: u32) -> f32 {
    return bitcast<f32>(wu16(block_byte) << 16u);
}
