//! IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks): 4-bit indices into a
//! fixed non-linear codebook. Dequantization only (rill does not write these formats).

use super::float::read_f16;

/// ggml's `kvalues_iq4nl`.
const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[inline(always)]
pub(crate) fn deq_iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = read_f16(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = d * KVALUES[(q & 0xf) as usize] as f32;
        y[j + 16] = d * KVALUES[(q >> 4) as usize] as f32;
    }
}

#[inline(always)]
pub(crate) fn deq_iq4_xs(b: &[u8; 136], y: &mut [f32; 256]) {
    let d = read_f16(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]) as i32;
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for ib in 0..8 {
        let lo = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32;
        let hi = (scales_h >> (2 * ib)) & 3;
        let dl = d * ((lo | (hi << 4)) - 32) as f32;
        for j in 0..16 {
            let q = qs[16 * ib + j];
            y[32 * ib + j] = dl * KVALUES[(q & 0xf) as usize] as f32;
            y[32 * ib + j + 16] = dl * KVALUES[(q >> 4) as usize] as f32;
        }
    }
}
