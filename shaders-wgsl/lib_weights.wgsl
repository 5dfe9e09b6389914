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

// Entry q < 16 of a codebook held as the columns of a matrix: the column picked by selects of
// literal columns, then one vector component. A run-time index into an array or a matrix (naga
// copies it into a function variable first) is local memory on some drivers.
fn lut16(t: mat4x4<f32>, q: u32) -> f32 {
    let c4 = (q & 4u) != 0u;
    let col = select(select(t[0], t[1], c4), select(t[2], t[3], c4), (q & 8u) != 0u);
    return col[q & 3u];
}

// Eight consecutive dequantized weights (`deq8`).
struct Deq8 {
    a: vec4<f32>,
    b: vec4<f32>,
}

// ---- whole-word decoding for the matrix-vector kernels (mv_*.wgsl) ----

// 2^23: a byte b placed in the mantissa of this float (bits 0x4b000000 | b) is the float 2^23 + b
// exactly, so subtracting 2^23 turns bytes into floats without an integer-to-float conversion
// (which GPUs issue at a fraction of the rate of a multiply-add).
const MAGIC: f32 = 8388608.0;

// The four bytes of w (each < 256) as floats minus `bias`, byte 0 first; exact.
fn bytes_f4(w: u32, bias: f32) -> vec4<f32> {
    let b = (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4b000000u)) - vec4<f32>(MAGIC + bias);
}

// The four signed bytes of w as floats, byte 0 first; exact (b ^ 0x80 = b + 128 as unsigned).
fn sbytes_f4(w: u32) -> vec4<f32> {
    return bytes_f4(w ^ 0x80808080u, 128.0);
}

// Words s .. s + 3 of a ++ b, s = 2 * s2 + s1 (a shift by one word, then by two).
fn realign4(a: vec4<u32>, b: vec4<u32>, s1: bool, s2: bool) -> vec4<u32> {
    let p = select(a, vec4<u32>(a.yzw, b.x), s1);
    let q = select(b.xy, b.yz, s1);
    return select(p, vec4<u32>(p.zw, q), s2);
}

// The words of a shifted by a half word towards byte 0, n the word after a.
fn half_shift(a: vec4<u32>, n: u32) -> vec4<u32> {
    return (a >> vec4<u32>(16u)) | (vec4<u32>(a.yzw, n) << vec4<u32>(16u));
}

// The 16 bytes at byte offset o (even) of the weight buffer: the two aligned vec4s that hold
// them, shifted by whole words and then by a half word. Blocks of Q6_K (210 bytes) start on any
// even byte; a window past the end of the buffer reads its padding (or zeros, never used).
fn win16(o: u32) -> vec4<u32> {
    let i = o >> 4u;
    let a = wq(i);
    let b = wq(i + 1u);
    let s1 = (o & 4u) != 0u;
    let s2 = (o & 8u) != 0u;
    let v = realign4(a, b, s1, s2);
    if ((o & 2u) == 0u) {
        return v;
    }
    return half_shift(v, select(select(b.x, b.y, s1), select(b.z, b.w, s1), s2));
}
