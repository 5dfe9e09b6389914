// Q6_K matrix-vector unit (matvec.wgsl and its relatives define xv(i), the i-th vec4 of x): 64
// elements. Unit u of a row is quarter (h, t) = ((u % 4) / 2, u % 2) of block u / 4: elements
// 128h + 32k + 16t + l, k < 4, l < 16. Their low 4 bits are the 16 ql bytes at 64h + 16t (k = 0
// low nibbles, k = 2 high) and at 64h + 32 + 16t (k = 1, 3), their high 2 bits bits 2k of the 16
// qh bytes at 128 + 32h + 16t, their scale byte 192 + 8h + 2k + t. Blocks are 210 bytes, so a
// block starts on any even byte: the three 16-byte windows are realigned in registers (win16).
// Per row: d * sum_k sc_k * sum(q x), q = 6-bit quant - 32.
const MV_UNIT: u32 = 64u;

// The unit's x: 4 vec4 for each k.
struct MvX {
    v: array<vec4<f32>, 16>,
}

fn mv_x(u: u32, xb: u32) -> MvX {
    let w = u & 3u;
    let x0 = xb + 64u * (u >> 2u) + 32u * (w >> 1u) + 4u * (w & 1u);
    var x: MvX;
    for (var k = 0u; k < 4u; k++) {
        for (var m = 0u; m < 4u; m++) {
            x.v[4u * k + m] = xv(x0 + 8u * k + m);
        }
    }
    return x;
}

// Four 6-bit quants: nibbles `hi` of l, bits 2k of qh, packed one per byte.
fn q6_pack(l: u32, hi: u32, qh: u32, k: u32) -> u32 {
    return ((l >> (4u * hi)) & 0x0f0f0f0fu) | (((qh >> (2u * k)) & 0x03030303u) << 4u);
}

fn mv_dot(rb: u32, u: u32, x: MvX) -> f32 {
    let w = u & 3u;
    let h = w >> 1u;
    let t = w & 1u;
    let bb = rb + 210u * (u >> 2u);
    let la = win16(bb + 64u * h + 16u * t);
    let lb = win16(bb + 64u * h + 32u + 16u * t);
    let qh = win16(bb + 128u + 32u * h + 16u * t);
    // Scale bytes 8h + t + 2k: bytes t and t + 2 of the words 8h and 8h + 4 bytes in.
    let sw = win16(bb + 192u + 8u * h);
    let d = wf16(bb + 208u);
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    for (var m = 0u; m < 4u; m++) {
        s0 = fma(bytes_f4(q6_pack(la[m], 0u, qh[m], 0u), 32.0), x.v[m], s0);
        s1 = fma(bytes_f4(q6_pack(lb[m], 0u, qh[m], 1u), 32.0), x.v[4u + m], s1);
        s2 = fma(bytes_f4(q6_pack(la[m], 1u, qh[m], 2u), 32.0), x.v[8u + m], s2);
        s3 = fma(bytes_f4(q6_pack(lb[m], 1u, qh[m], 3u), 32.0), x.v[12u + m], s3);
    }
    let one = vec4<f32>(1.0);
    let sq = vec4<f32>(dot(s0, one), dot(s1, one), dot(s2, one), dot(s3, one));
    // Bytes (k0, k2, k1, k3), then reordered.
    let sc = ((sw.x >> (8u * t)) & 0x00ff00ffu) | (((sw.y >> (8u * t)) & 0x00ff00ffu) << 8u);
    return d * dot(sbytes_f4(sc).xzyw, sq);
}
