// BF16 weights: the high half of an f32.
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn deq(block_byte: u32, i: u32) -> f32 {
    return bitcast<f32>(wu16(block_byte) << 16u);
}

fn bf16x2(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

fn half8(q: vec4<u32>) -> Deq8 {
    return Deq8(vec4<f32>(bf16x2(q.x), bf16x2(q.y)), vec4<f32>(bf16x2(q.z), bf16x2(q.w)));
}

// Elements at bb .. bb + 16 (16-byte aligned: rows are a multiple of 8 elements).
fn deq8(bb: u32, i0: u32) -> Deq8 {
    return half8(wq(bb >> 4u));
}
