// F16 weights: one IEEE binary16 per "block" (subnormals decoded exactly).
const QK: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn deq(block_byte: u32, i: u32) -> f32 {
    return wf16(block_byte);
}

fn half8(q: vec4<u32>) -> Deq8 {
    return Deq8(vec4<f32>(f16x2(q.x), f16x2(q.y)), vec4<f32>(f16x2(q.z), f16x2(q.w)));
}

// Elements at bb .. bb + 16 (16-byte aligned: rows are a multiple of 8 elements).
fn deq8(bb: u32, i0: u32) -> Deq8 {
    return half8(wq(bb >> 4u));
}
