//! Block formats: dequantization (the reference every backend is tested against) and quantizers.
//!
//! PLACEHOLDER: only F32/F16/BF16 until the quant module lands; the signatures are the contract.

use crate::error::{Error, Result};
use crate::gguf::GgmlType;

fn unsupported(ty: GgmlType) -> Error {
    Error::UnsupportedType {
        tensor: String::new(),
        type_name: ty.name().to_string(),
        type_id: ty.id(),
    }
}

/// Dequantize `dst.len()` elements (a multiple of the block size) from `src`, which must hold
/// exactly `dst.len() / block_size * type_size` bytes.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let need = ty
        .row_size(dst.len() as u64)
        .ok_or_else(|| Error::InvalidArgument(format!("{} elements is not a whole number of {ty} blocks", dst.len())))?;
    if src.len() as u64 != need {
        return Err(Error::InvalidArgument(format!(
            "dequantize {ty}: {} bytes for {} elements, expected {need}",
            src.len(),
            dst.len()
        )));
    }
    match ty {
        GgmlType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Bf16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        _ => return Err(unsupported(ty)),
    }
    Ok(())
}

/// `dot(dequant(row), x)` without materialising the row; `x.len()` elements.
pub fn vec_dot(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32> {
    let mut tmp = vec![0f32; x.len()];
    dequantize(ty, row, &mut tmp)?;
    Ok(tmp.iter().zip(x).map(|(a, b)| a * b).sum())
}

/// Quantize `src` (a multiple of the block size) into `dst` (exactly the row size in bytes).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let _ = (src, dst);
    Err(unsupported(ty))
}
