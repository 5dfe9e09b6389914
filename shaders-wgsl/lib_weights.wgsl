// Byte access into a weight buffer read through `wq(i)` (16 bytes per index; lib_w1/lib_w2).
// GGUF blocks are not always word aligned (Q8_0 is 34 bytes, Q6_K 210), so offsets are bytes.
// Weight buffers are padded to whole vec4s, so a word past a row's last byte is still readable.

// The u32 word at word index i.
fn w32(i: u32) -> u32 {
    return wq(i >> 2u)[i & 3u];
}

fn wbyte(b: u32) -> u32 {
    return (w32(b >> 2u) >> ((b & 3u) << 3u)) & 0xffu;
}

// A signed byte.
fn wi8(b: u32) -> i32 {
    return (i32(wbyte(b)) << 24u) >> 24u;
}

// A little-endian u16 at an even byte offset.
fn wu16(b: u32) -> u32 {
    let w = w32(b >> 2u);
    return select(w & 0xffffu, w >> 16u, (b & 2u) != 0u);
}

// A little-endian f16 at an even byte offset.
fn wf16(b: u32) -> f32 {
    return f16_to_f32(wu16(b));
}

// A little-endian u32 at an even byte offset (two words spliced when it straddles them).
fn wu32e(b: u32) -> u32 {
    let i = b >> 2u;
    if ((b & 2u) == 0u) {
        return w32(i);
    }
    return (w32(i) >> 16u) | (w32(i + 1u) << 16u);
}

// Four nibbles (bits 4h..4h+3 of each byte of w) as floats, byte 0 first.
fn nib4(w: u32, h: u32) -> vec4<f32> {
    let s = w >> (4u * h);
    return vec4<f32>(f32(s & 0xfu), f32((s >> 8u) & 0xfu), f32((s >> 16u) & 0xfu), f32((s >> 24u) & 0xfu));
}

// Bit n of each byte of w as floats, byte 0 first.
fn bytes_bit(w: u32, n: u32) -> vec4<f32> {
    let b = (w >> n) & 0x01010101u;
    return vec4<f32>(f32(b & 1u), f32((b >> 8u) & 1u), f32((b >> 16u) & 1u), f32(b >> 24u));
}

// The four signed bytes of w as floats, byte 0 first.
fn i8x4(w: u32) -> vec4<f32> {
    return vec4<f32>(f32((i32(w) << 24u) >> 24u), f32((i32(w) << 16u) >> 24u), f32((i32(w) << 8u) >> 24u),
                     f32(i32(w) >> 24u));
}

// Eight consecutive dequantized weights (`deq8`).
struct Deq8 {
    a: vec4<f32>,
    b: vec4<f32>,
}
