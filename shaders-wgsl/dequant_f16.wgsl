// F16 weights: one IEEE binary16 per "block" (subnormals decoded exactly).
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn deq(block_byte: u32, i: u32) -> f32 {
    return wf16(block_byte);
}
