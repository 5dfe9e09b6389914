//! Plain float formats (F32, F16, BF16) and the scalar conversions the block formats share.
//!
//! The conversions are written as branch-light bit manipulation so that LLVM vectorises the
//! per-element loops on baseline x86-64 (no runtime F16C dispatch per element).

/// IEEE binary16 bits to f32, exact for every input (subnormals included: block scales of tiny
/// tensors are f16 subnormals). NaNs come back quiet with their payload, like F16C.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let em = (h & 0x7fff) as u32;
    let bits = if em >= 0x7c00 {
        // Inf / NaN: move the payload, force the exponent to all ones and quiet NaNs.
        let quiet = if em > 0x7c00 { 0x0040_0000 } else { 0 };
        (em << 13) | 0x7f80_0000 | quiet
    } else {
        // Placing exponent+mantissa 13 bits up gives the value scaled by 2^-112 (an f32
        // subnormal for f16 subnormals); multiplying by 2^112 is exact and handles both cases.
        (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(bits | sign)
}

/// f32 to IEEE binary16 bits, round to nearest even (what ggml's GGML_FP32_TO_FP16 does).
#[inline(always)]
pub(crate) fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

#[inline(always)]
pub(crate) fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
pub(crate) fn write_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

#[inline(always)]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bf16 exactly as ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, NaNs
/// forced quiet.
#[inline(always)]
pub(crate) fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// Decode `dst.len()` plain-float elements from `src` (length already checked).
pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (v, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    // half's slice conversion uses F16C when the CPU has it (runtime-detected once per chunk).
    use half::slice::HalfFloatSliceExt;
    let mut buf = [half::f16::ZERO; 256];
    for (s, d) in src.chunks(256).zip(dst.chunks_mut(512)) {
        let h = &mut buf[..s.len()];
        h.convert_from_f32_slice(s);
        for (v, c) in h.iter().zip(d.chunks_exact_mut(2)) {
            c.copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (v, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_decode_matches_half_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let ours = f16_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // Exactly half-way between 0x3f80 and 0x3f81: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // Half-way between 0x3f81 and 0x3f82: ties to even (up).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    }
}
