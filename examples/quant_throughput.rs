//! Quantize / dequantize / vec_dot throughput per type (a measurement, not a test):
//! `cargo run --release --example quant_throughput` (`RILL_NO_AVX2=1` for the baseline path).
//!
//! Each figure is the best of several runs (the machine is shared). `vec_dot` is one 4 Mi-element
//! row against a 16 MiB `x` (bound by streaming `x` from memory); `gemv` is the decode shape: 1024
//! rows of 4096 elements against one cache-resident `x`, i.e. the kernel's compute throughput.

use rill::gguf::GgmlType;
use rill::quant::{dequantize, quantize, vec_dot};
use std::time::Instant;

/// Best wall time of `reps` runs of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut() -> rill::Result<()>) -> rill::Result<f64> {
    let mut t = f64::INFINITY;
    for _ in 0..reps {
        let s = Instant::now();
        f()?;
        t = t.min(s.elapsed().as_secs_f64());
    }
    Ok(t)
}

fn main() -> rill::Result<()> {
    let n = 1 << 22;
    let k = 4096;
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
        let row_bytes = ty.row_size(k as u64).unwrap_or(0) as usize;
        let mut q = vec![0u8; bytes];
        quantize(ty, &x, &mut q)?; // untimed: faults the pages in
        let qs = best(2, || quantize(ty, &x, &mut q))?;
        let mut y = vec![0f32; n];
        dequantize(ty, &q, &mut y)?;
        let ds = best(5, || dequantize(ty, &q, &mut y))?;
        let mut s = 0f32;
        let vs = best(5, || {
            s += vec_dot(ty, &q, &probe)?;
            Ok(())
        })?;
        let mut g = 0f32;
        let gs = best(5, || {
            for r in q.chunks_exact(row_bytes) {
                g += vec_dot(ty, r, &probe[..k])?;
            }
            Ok(())
        })?;
        let rate = |secs: f64| n as f64 / secs / 1e6;
        println!(
            "{:>5}: quantize {:7.1} M/s   dequantize {:7.1} M/s   vec_dot {:7.1} M/s   gemv {:7.1} M/s  ({s:.1} {g:.1})",
            ty.name(),
            rate(qs),
            rate(ds),
            rate(vs),
            rate(gs)
        );
    }
    Ok(())
}
