// Q6_K (210 bytes / 256): 128 bytes ql (low nibbles), 64 bytes qh (2 high bits), 16 signed
// scale bytes, f16 d. Element i = 128h + 32k + l (k < 4, l < 32): low 4 bits from
// ql[64h + l + 32(k & 1)] (low nibble for k < 2, high for k >= 2), high 2 bits from bits 2k of
// qh[32h + l], scale i / 16. y = (d * sc) * (q - 32) (ggml's order).
// Blocks are 210 bytes, so a block starts on an even byte: words are read with wu32e.
const QK: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn deq(block_byte: u32, i: u32) -> f32 {
    let d = wf16(block_byte + 208u);
    let h = i >> 7u;
    let k = (i >> 5u) & 3u;
    let l = i & 31u;
    let lb = wbyte(block_byte + 64u * h + l + 32u * (k & 1u));
    let lo = select(lb & 0xfu, lb >> 4u, k >= 2u);
    let hi = (wbyte(block_byte + 128u + 32u * h + l) >> (2u * k)) & 3u;
    let q = i32(lo | (hi << 4u)) - 32;
    let sc = wi8(block_byte + 192u + (i >> 4u));
    return d * f32(sc) * f32(q);
}

// The 6-bit quants of four elements minus 32: nibbles (k >> 1) of ql word w, 2-bit pairs k of qh.
fn q6x4(w: u32, qh: u32, k: u32) -> vec4<f32> {
    let hb = (qh >> (2u * k)) & 0x03030303u;
    let lo = nib4(w, k >> 1u);
    return lo + 16.0 * vec4<f32>(f32(hb & 3u), f32((hb >> 8u) & 3u), f32((hb >> 16u) & 3u), f32(hb >> 24u))
        - vec4<f32>(32.0);
}

// deq8 in two halves, so that a kernel can issue the loads early and decode later
// (lib_c2w_words.wgsl): a unit of 8 elements (i0 % 8 == 0) as loaded, the words holding d, its
// scale byte and its 8 ql and 8 qh bytes (each run three words: blocks start on any even byte),
// then its arithmetic.
struct Deq8Words {
    d: u32,
    sc: u32,
    ql: vec3<u32>,
    qh: vec3<u32>,
    bb: u32, // the block's first byte (its half-word parity places d, ql and qh)
    i0: u32,
}

fn deq8_load(bb: u32, i0: u32) -> Deq8Words {
    let h = i0 >> 7u;
    let k = (i0 >> 5u) & 3u;
    let l = i0 & 31u;
    let ql = (bb + 64u * h + l + 32u * (k & 1u)) >> 2u;
    let qh = (bb + 128u + 32u * h + l) >> 2u;
    return Deq8Words(w32((bb + 208u) >> 2u), w32((bb + 192u + (i0 >> 4u)) >> 2u),
                     vec3<u32>(w32(ql), w32(ql + 1u), w32(ql + 2u)),
                     vec3<u32>(w32(qh), w32(qh + 1u), w32(qh + 2u)), bb, i0);
}

// Words 0 and 1 of the 8 bytes of a run at an odd half-word offset (its first byte is byte 2 of
// v.x) or not.
fn q6_run_pair(v: vec3<u32>, odd: bool) -> vec2<u32> {
    return select(v.xy, vec2<u32>((v.x >> 16u) | (v.y << 16u), (v.y >> 16u) | (v.z << 16u)), odd);
}

fn deq8_words(w: Deq8Words) -> Deq8 {
    // ql, qh and d sit at the block's parity (their offsets in it are multiples of 4).
    let odd = (w.bb & 2u) != 0u;
    let k = (w.i0 >> 5u) & 3u;
    let d = f16_to_f32(select(w.d & 0xffffu, w.d >> 16u, odd));
    let sb = w.bb + 192u + (w.i0 >> 4u);
    let sc = (i32((w.sc >> (8u * (sb & 3u))) & 0xffu) << 24u) >> 24u;
    let dsc = d * f32(sc);
    let ql = q6_run_pair(w.ql, odd);
    let qh = q6_run_pair(w.qh, odd);
    return Deq8(dsc * q6x4(ql.x, qh.x, k), dsc * q6x4(ql.y, qh.y, k));
}

fn deq8(bb: u32, i0: u32) -> Deq8 {
    return deq8_words(deq8_load(bb, i0));
}

// ---- the matrix-vector units' weights (mv_q6_k.wgsl, mv_q6_k_dot.wgsl) ----

// 16 6-bit quants of segment k: nibbles `hi` of the ql bytes l, bits 2k of the qh bytes;
// packed one per byte.
fn q6_pack(l: vec4<u32>, hi: u32, qh: vec4<u32>, k: u32) -> vec4<u32> {
    let lo = (l >> vec4<u32>(4u * hi)) & vec4<u32>(0x0f0f0f0fu);
    return lo | (((qh >> vec4<u32>(2u * k)) & vec4<u32>(0x03030303u)) << vec4<u32>(4u));
}

// A matrix-vector unit of a row (unit u, the row at byte rb): the unsigned 6-bit quants of its
// four segments (k = 0..3, packed one per byte), the segments' signed scales and d.
struct Q6Unit {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    d: vec4<u32>,
    sc: vec4<f32>,
    scale: f32,
}

fn q6_unit(rb: u32, u: u32) -> Q6Unit {
    let w = u & 3u;
    let h = w >> 1u;
    let t = w & 1u;
    let bb = rb + 210u * (u >> 2u);
    let la = win16(bb + 64u * h + 16u * t);
    let lb = win16(bb + 64u * h + 32u + 16u * t);
    let qh = win16(bb + 128u + 32u * h + 16u * t);
    // Scale bytes 8h + t + 2k: bytes t and t + 2 of the words 8h and 8h + 4 bytes in, so in the
    // order (k0, k2, k1, k3), then reordered.
    let sw = win16(bb + 192u + 8u * h);
    let sc = ((sw.x >> (8u * t)) & 0x00ff00ffu) | (((sw.y >> (8u * t)) & 0x00ff00ffu) << 8u);
    return Q6Unit(q6_pack(la, 0u, qh, 0u), q6_pack(lb, 0u, qh, 1u), q6_pack(la, 1u, qh, 2u), q6_pack(lb, 1u, qh, 3u),
                  sbytes_f4(sc).xzyw, wf16(bb + 208u));
}
