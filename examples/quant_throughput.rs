//! Quantize / dequantize / vec_dot throughput per type (a measurement, not a test):
//! `cargo run --release --example quant_throughput`.

use rill::gguf::GgmlType;
use rill::quant::{dequantize, quantize, vec_dot};

fn main() -> rill::Result<()> {
    let n = 1 << 22;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let x: Vec<f32> = (0..n).map(|_| next()).collect();
    let probe: Vec<f32> = (0..n).map(|_| next()).collect();
    use GgmlType::*;
    for ty in [F32, F16, Bf16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K] {
        let bytes = ty.row_size(n as u64).unwrap_or(0) as usize;
        let mut q = vec![0u8; bytes];
        quantize(ty, &x, &mut q)?; // untimed: faults the pages in
        let t = std::time::Instant::now();
        quantize(ty, &x, &mut q)?;
        let qs = t.elapsed().as_secs_f64();
        let mut y = vec![0f32; n];
        dequantize(ty, &q, &mut y)?;
        let t = std::time::Instant::now();
        dequantize(ty, &q, &mut y)?;
        let ds = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        let mut s = 0f32;
        for _ in 0..4 {
            s += vec_dot(ty, &q, &probe)?;
        }
        let vs = t.elapsed().as_secs_f64() / 4.0;
        println!(
            "{:>5}: quantize {:7.1} M/s   dequantize {:7.1} M/s   vec_dot {:7.1} M/s  ({s:.1})",
            ty.name(),
            n as f64 / qs / 1e6,
            n as f64 / ds / 1e6,
            n as f64 / vs / 1e6
        );
    }
    Ok(())
}
