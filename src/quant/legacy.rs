//! The 32-element "legacy" formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4.
//!
//! Dequantization computes `d·q` (then `+ m`) in f32 in ggml's order, so results are
//! bit-identical to ggml's `dequantize_row_*`. Quantizers follow ggml's `quantize_row_*_ref`
//! step by step (same f32 operations, same truncating casts) and reproduce its blocks exactly.

use super::dot::{sub, Acc};
use super::float::{read_f16, write_f16};

pub(crate) const QK: usize = 32;

// ---------------------------------------------------------------- dequantization

#[inline(always)]
pub(crate) fn deq_q4_0(b: &[u8; 18], y: &mut [f32; QK]) {
    let d = read_f16(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = ((q & 0xf) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

#[inline(always)]
pub(crate) fn deq_q4_1(b: &[u8; 20], y: &mut [f32; QK]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = (q & 0xf) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// The 5th bits of a Q5 block: bit `j` of the little-endian u32 belongs to element `j`.
#[inline(always)]
fn high_bits(qh: [u8; 4]) -> u32 {
    u32::from_le_bytes(qh)
}

#[inline(always)]
pub(crate) fn deq_q5_0(b: &[u8; 22], y: &mut [f32; QK]) {
    let d = read_f16(b, 0);
    let qh = high_bits([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let q = b[6 + j];
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((q & 0xf) as u32 | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

#[inline(always)]
pub(crate) fn deq_q5_1(b: &[u8; 24], y: &mut [f32; QK]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    let qh = high_bits([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let q = b[8 + j];
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((q & 0xf) as u32 | h0) as f32 * d + m;
        y[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
    }
}

#[inline(always)]
pub(crate) fn deq_q8_0(b: &[u8; 34], y: &mut [f32; QK]) {
    let d = read_f16(b, 0);
    for j in 0..QK {
        y[j] = (b[2 + j] as i8) as f32 * d;
    }
}

/// e2m1 values doubled (the E8M0 scale is halved to compensate).
const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the E8M0 scale, `2^(e-128)`; e = 0, 1 give f32 subnormals (ggml's
/// `GGML_E8M0_TO_FP32_HALF`).
#[inline(always)]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

#[inline(always)]
pub(crate) fn deq_mxfp4(b: &[u8; 17], y: &mut [f32; QK]) {
    let d = e8m0_half(b[0]);
    for j in 0..16 {
        let q = b[1 + j];
        y[j] = MXFP4_VALUES[(q & 0xf) as usize] as f32 * d;
        y[j + 16] = MXFP4_VALUES[(q >> 4) as usize] as f32 * d;
    }
}

// ---------------------------------------------------------------- fused dot products
//
// `Σ y·x` over one block, each `y` computed in registers with exactly the f32 operations of the
// `deq_*` function above (so the products equal those of `dot(deq_*(b), x)`).

/// Bit `i` of the Q5 high-bit word as the 5th bit (0 or 16), as `deq_q5_*` extracts it. (A
/// per-lane mask test instead of the per-lane shift is canonicalised back into shifts by LLVM,
/// and measured slower with AVX2.)
#[inline(always)]
fn bit5(qh: u32, i: usize) -> u32 {
    ((qh >> i) << 4) & 0x10
}

#[inline(always)]
pub(crate) fn dot_q4_0(b: &[u8; 18], x: &[f32; QK], acc: &mut Acc) {
    let d = read_f16(b, 0);
    let q = sub::<16, _>(b, 2);
    acc.add_with(sub::<16, _>(x, 0), |j| ((q[j] & 0xf) as i32 - 8) as f32 * d);
    acc.add_with(sub::<16, _>(x, 16), |j| ((q[j] >> 4) as i32 - 8) as f32 * d);
}

#[inline(always)]
pub(crate) fn dot_q4_1(b: &[u8; 20], x: &[f32; QK], acc: &mut Acc) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    let q = sub::<16, _>(b, 4);
    acc.add_with(sub::<16, _>(x, 0), |j| (q[j] & 0xf) as f32 * d + m);
    acc.add_with(sub::<16, _>(x, 16), |j| (q[j] >> 4) as f32 * d + m);
}

#[inline(always)]
pub(crate) fn dot_q5_0(b: &[u8; 22], x: &[f32; QK], acc: &mut Acc) {
    let d = read_f16(b, 0);
    let qh = high_bits([b[2], b[3], b[4], b[5]]);
    let q = sub::<16, _>(b, 6);
    acc.add_with(sub::<16, _>(x, 0), |j| {
        (((q[j] & 0xf) as u32 | bit5(qh, j)) as i32 - 16) as f32 * d
    });
    acc.add_with(sub::<16, _>(x, 16), |j| {
        (((q[j] >> 4) as u32 | bit5(qh, j + 16)) as i32 - 16) as f32 * d
    });
}

#[inline(always)]
pub(crate) fn dot_q5_1(b: &[u8; 24], x: &[f32; QK], acc: &mut Acc) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    let qh = high_bits([b[4], b[5], b[6], b[7]]);
    let q = sub::<16, _>(b, 8);
    acc.add_with(sub::<16, _>(x, 0), |j| {
        ((q[j] & 0xf) as u32 | bit5(qh, j)) as f32 * d + m
    });
    acc.add_with(sub::<16, _>(x, 16), |j| {
        ((q[j] >> 4) as u32 | bit5(qh, j + 16)) as f32 * d + m
    });
}

#[inline(always)]
pub(crate) fn dot_q8_0(b: &[u8; 34], x: &[f32; QK], acc: &mut Acc) {
    let d = read_f16(b, 0);
    let q = sub::<QK, _>(b, 2);
    acc.add_with(x, |j| (q[j] as i8) as f32 * d);
}

// ---------------------------------------------------------------- quantization

/// The element of largest magnitude, keeping its sign; the first one wins ties (ggml's
/// `if (amax < fabsf(v))`).
#[inline(always)]
fn signed_absmax(x: &[f32; QK]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline(always)]
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// C's `roundf` (half away from zero) for the small magnitudes quantizers produce, without a
/// libm call: truncate, then fix up using the exact fractional part.
#[inline(always)]
fn round_away(v: f32) -> i32 {
    let t = v as i32;
    let frac = v - t as f32;
    if frac >= 0.5 {
        t + 1
    } else if frac <= -0.5 {
        t - 1
    } else {
        t
    }
}

pub(crate) fn quant_q4_0(x: &[f32; QK], b: &mut [u8; 18]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    for j in 0..16 {
        // `(int8_t)(x*id + 8.5f)` truncates; the sum is in [0.5, 16.5].
        let q0 = ((x[j] * id + 8.5) as i32).min(15);
        let q1 = ((x[j + 16] * id + 8.5) as i32).min(15);
        b[2 + j] = (q0 as u8 & 0xf) | ((q1 as u8) << 4);
    }
}

pub(crate) fn quant_q4_1(x: &[f32; QK], b: &mut [u8; 20]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    for j in 0..16 {
        let q0 = (((x[j] - min) * id + 0.5) as i32).min(15);
        let q1 = (((x[j + 16] - min) * id + 0.5) as i32).min(15);
        b[4 + j] = (q0 as u8 & 0xf) | ((q1 as u8) << 4);
    }
}

/// Split 32 five-bit values into low nibbles (first 16 low, last 16 high) and the u32 of 5th bits.
#[inline(always)]
fn pack5(q: &[u32; QK], qs: &mut [u8], qh_out: &mut [u8]) {
    let mut qh = 0u32;
    for j in 0..16 {
        let (q0, q1) = (q[j], q[j + 16]);
        qs[j] = ((q0 & 0xf) | ((q1 & 0xf) << 4)) as u8;
        qh |= ((q0 & 0x10) >> 4) << j;
        qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    qh_out.copy_from_slice(&qh.to_le_bytes());
}

pub(crate) fn quant_q5_0(x: &[f32; QK], b: &mut [u8; 22]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    let mut q = [0u32; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id + 16.5) as i32).clamp(0, 31) as u32;
    }
    let (head, qs) = b.split_at_mut(6);
    pack5(&q, qs, &mut head[2..6]);
}

pub(crate) fn quant_q5_1(x: &[f32; QK], b: &mut [u8; 24]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    let mut q = [0u32; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        // ggml has no upper clamp here (`(uint8_t)(x0 + 0.5f)`); the value cannot exceed 31.5.
        *q = (((v - min) * id + 0.5) as i32).clamp(0, 31) as u32;
    }
    let (head, qs) = b.split_at_mut(8);
    pack5(&q, qs, &mut head[4..8]);
}

pub(crate) fn quant_q8_0(x: &[f32; QK], b: &mut [u8; 34]) {
    let mut amax = 0f32;
    for &v in x {
        amax = amax.max(v.abs());
    }
    let d = amax / 127.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    for j in 0..QK {
        b[2 + j] = round_away(x[j] * id).clamp(-127, 127) as i8 as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_away_matches_roundf() {
        for &v in &[
            0.5f32,
            -0.5,
            1.5,
            -1.5,
            2.5,
            0.49999997,
            -0.49999997,
            126.5,
            -127.0,
            0.0,
            -0.0,
            3.2,
            -3.7,
        ] {
            assert_eq!(round_away(v), v.round() as i32, "{v}");
        }
    }

    #[test]
    fn e8m0_scale() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }
}
