//! Quantize → dequantize error bounds, edge cases (never NaN/inf), and `vec_dot` agreement with
//! `dot(dequantize(row), x)` for every supported type.

mod common;

use common::weights::{f16_scale_offsets, quantizable, DEQUANTIZE_ONLY, WEIGHT_TYPES};
use common::Rng;
use rill::gguf::GgmlType;
use rill::quant::{can_dequantize, can_quantize, dequantize, quantize, quantize_rows_par, vec_dot};

/// Upper bound on the relative RMS error for N(0,1) data (README measured values plus margin).
fn rms_bound(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 3e-4,
        GgmlType::Bf16 => 2.5e-3,
        GgmlType::Q8_0 => 0.007,
        GgmlType::Q6K => 0.025,
        GgmlType::Q5K => 0.045,
        GgmlType::Q5_0 | GgmlType::Q5_1 => 0.05,
        GgmlType::Q4K => 0.085,
        GgmlType::Q4_0 | GgmlType::Q4_1 => 0.1,
        other => panic!("no bound for {other}"),
    }
}

fn row_bytes(ty: GgmlType, n: usize) -> usize {
    ty.row_size(n as u64).expect("whole blocks") as usize
}

fn roundtrip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; row_bytes(ty, x.len())];
    quantize(ty, x, &mut q).unwrap_or_else(|e| panic!("quantize {ty}: {e}"));
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap_or_else(|e| panic!("dequantize {ty}: {e}"));
    y
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let num: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn assert_finite(ty: GgmlType, what: &str, y: &[f32]) {
    if let Some(i) = y.iter().position(|v| !v.is_finite()) {
        panic!("{ty} {what}: element {i} is {}", y[i]);
    }
}

#[test]
fn gaussian_roundtrip_error_within_bounds() {
    let mut rng = Rng::new(1);
    let x = rng.normals(16 * 4096, 1.0);
    for ty in quantizable() {
        let y = roundtrip(ty, &x);
        assert_finite(ty, "gaussian", &y);
        let e = rel_rms(&x, &y);
        eprintln!("{ty:>5}: rel RMS {e:.6}");
        assert!(e <= rms_bound(ty), "{ty}: rel RMS {e} > {}", rms_bound(ty));
    }
}

#[test]
fn scaled_and_shifted_rows_within_bounds() {
    // A non-zero mean (legacy asymmetric formats and the K-quant mins must cope) and
    // per-32-block scale changes inside each super-block.
    let mut rng = Rng::new(2);
    let shifted: Vec<f32> = rng.normals(8192, 2.0).iter().map(|v| v + 0.5).collect();
    let mut varied = rng.normals(8192, 1.0);
    for (i, v) in varied.iter_mut().enumerate() {
        *v *= 2f32.powi(((i / 32) % 8) as i32 - 4);
    }
    for ty in quantizable() {
        for (name, x) in [("shifted", &shifted), ("varied", &varied)] {
            let y = roundtrip(ty, x);
            assert_finite(ty, name, &y);
            let e = rel_rms(x, &y);
            // Mixed sub-block scales cost the super-block formats some precision (shared 6-bit
            // scale grid): allow 1.5x.
            let bound = rms_bound(ty) * 1.5;
            assert!(e <= bound, "{ty} {name}: rel RMS {e} > {bound}");
        }
    }
}

#[test]
fn edge_cases_never_produce_nan_or_inf() {
    let n = 1024;
    let mut rng = Rng::new(3);
    let mut cases: Vec<(&str, Vec<f32>)> = vec![
        ("zeros", vec![0.0; n]),
        ("negative zeros", vec![-0.0; n]),
        ("constant 0.7", vec![0.7; n]),
        ("constant -3", vec![-3.0; n]),
        ("constant 1e-4", vec![1e-4; n]),
        ("tiny gaussian", rng.normals(n, 1e-4)),
        ("very tiny gaussian", rng.normals(n, 1e-9)),
        ("subnormal-ish", rng.normals(n, 1e-30)),
        ("large gaussian", rng.normals(n, 1e4)),
    ];
    let mut outliers = rng.normals(n, 0.5);
    for (k, i) in [3usize, 77, 300, 301, 640, 1000].iter().enumerate() {
        outliers[*i] = if k % 2 == 0 {
            20.0 + 8.0 * k as f32
        } else {
            -(20.0 + 8.0 * k as f32)
        };
    }
    cases.push(("outliers", outliers));
    let mut half_zero = rng.normals(n, 1.0);
    half_zero[..64].fill(0.0);
    half_zero[256..512].fill(0.0);
    cases.push(("zero blocks", half_zero));
    let mut one_hot = vec![0.0; n];
    one_hot[5] = 1.0;
    one_hot[300] = -2.0;
    cases.push(("one hot", one_hot));

    for ty in quantizable() {
        for (name, x) in &cases {
            let y = roundtrip(ty, x);
            assert_finite(ty, name, &y);
            let max_abs = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            // No value may come back far outside the input range.
            for (i, v) in y.iter().enumerate() {
                assert!(
                    v.abs() <= max_abs * 1.1 + 1e-6,
                    "{ty} {name}: y[{i}] = {v}, max |x| = {max_abs}"
                );
            }
            match *name {
                "zeros" | "negative zeros" => assert!(y.iter().all(|v| *v == 0.0), "{ty} {name}"),
                // Constants are represented closely by every format (relative, f16 scales).
                "constant 0.7" | "constant -3" => {
                    let e = rel_rms(x, &y);
                    assert!(e < 0.01, "{ty} {name}: rel RMS {e}");
                }
                // Block scales of ~1e-6 are f16 subnormals with few significant bits.
                // Q6_K's super-block scale (≈ 2.4e-8 here) rounds to f16 zero, so ggml's
                // algorithm legitimately returns all zeros.
                "constant 1e-4" => {
                    let e = rel_rms(x, &y);
                    let bound = if ty == GgmlType::Q6K { 1.0 } else { 0.05 };
                    assert!(e <= bound, "{ty} {name}: rel RMS {e}");
                }
                // Subnormal f16 scales cost precision (ggml: Q6_K 0.08, Q5_K 0.064 on this row).
                "tiny gaussian" => {
                    let e = rel_rms(x, &y);
                    let bound = if ty == GgmlType::Q6K {
                        0.2
                    } else {
                        (rms_bound(ty) * 5.0).max(1e-3)
                    };
                    assert!(e <= bound, "{ty} {name}: rel RMS {e} > {bound}");
                }
                "outliers" | "zero blocks" | "one hot" => {
                    let e = rel_rms(x, &y);
                    let bound = (rms_bound(ty) * 2.5).max(1e-3);
                    assert!(e <= bound, "{ty} {name}: rel RMS {e} > {bound}");
                }
                _ => {}
            }
        }
    }
}

#[test]
fn quantize_rows_par_equals_serial() {
    let mut rng = Rng::new(4);
    let row_len = 512;
    let x = rng.normals(row_len * 300, 1.0);
    for ty in quantizable() {
        let mut serial = vec![0u8; row_bytes(ty, x.len())];
        quantize(ty, &x, &mut serial).unwrap();
        let mut par = vec![0u8; serial.len()];
        quantize_rows_par(ty, &x, row_len, &mut par).unwrap();
        assert!(serial == par, "{ty}");
    }
}

/// A random but well-formed row: random quant bits, finite moderate scales.
fn random_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    match ty {
        GgmlType::F32 => return rng.normals(n, 1.0).iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => return rng.normals(n, 1.0).iter().flat_map(|v| f16(*v)).collect(),
        GgmlType::Bf16 => {
            return rng
                .normals(n, 1.0)
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let bs = ty.type_size() as usize;
    let mut row: Vec<u8> = (0..row_bytes(ty, n)).map(|_| rng.next_u64() as u8).collect();
    for block in row.chunks_exact_mut(bs) {
        for &at in f16_scale_offsets(ty) {
            let v = (rng.normal() as f32) * 0.05;
            block[at..at + 2].copy_from_slice(&f16(v));
        }
        if ty == GgmlType::Mxfp4 {
            block[0] = 120 + (rng.next_u64() % 16) as u8;
        }
    }
    row
}

#[test]
fn vec_dot_matches_dot_of_dequantized_row() {
    let mut rng = Rng::new(5);
    for ty in WEIGHT_TYPES {
        assert!(can_dequantize(ty));
        for n in [256usize, 1024, 4096 + 512] {
            let row = random_row(ty, n, &mut rng);
            let x = rng.normals(n, 1.0);
            let mut y = vec![0f32; n];
            dequantize(ty, &row, &mut y).unwrap();
            assert_finite(ty, "random row", &y);
            let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = y.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = vec_dot(ty, &row, &x).unwrap() as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * scale + 1e-30,
                "{ty} n={n}: vec_dot {got} vs {exact} (sum |a*b| {scale})"
            );
        }
    }
}

#[test]
fn vec_dot_of_quantized_rows() {
    // The same check on rows produced by our own quantizers (realistic scale distributions).
    let mut rng = Rng::new(6);
    let n = 2048;
    let w = rng.normals(n, 1.0);
    let x = rng.normals(n, 1.0);
    for ty in quantizable() {
        let mut q = vec![0u8; row_bytes(ty, n)];
        quantize(ty, &w, &mut q).unwrap();
        let mut y = vec![0f32; n];
        dequantize(ty, &q, &mut y).unwrap();
        let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let scale: f64 = y.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
        let got = vec_dot(ty, &q, &x).unwrap() as f64;
        assert!((got - exact).abs() <= 1e-5 * scale, "{ty}: {got} vs {exact}");
    }
}

#[test]
fn length_and_type_errors() {
    let x = vec![0f32; 64];
    let mut q = vec![0u8; 10];
    assert!(quantize(GgmlType::Q8_0, &x, &mut q).is_err());
    let mut y = vec![0f32; 33];
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], &mut y).is_err());
    assert!(vec_dot(GgmlType::Q4K, &[0u8; 143], &[0f32; 256]).is_err());
    for ty in [GgmlType::Iq2Xxs, GgmlType::Q8K, GgmlType::I32, GgmlType::Tq1_0] {
        assert!(!can_dequantize(ty));
        let e = dequantize(ty, &[], &mut []).unwrap_err();
        assert!(matches!(e, rill::Error::UnsupportedType { .. }), "{ty}: {e}");
        assert!(vec_dot(ty, &[], &[]).is_err());
    }
    for ty in DEQUANTIZE_ONLY {
        assert!(!can_quantize(ty));
        assert!(matches!(
            quantize(ty, &[0.0; 256], &mut vec![0u8; row_bytes(ty, 256)]),
            Err(rill::Error::UnsupportedType { .. })
        ));
    }
    // Empty input is fine.
    assert_eq!(vec_dot(GgmlType::Q4_0, &[], &[]).unwrap(), 0.0);
}

#[test]
fn vec_dot_decodes_every_element_like_dequantize() {
    // Against a one-hot x, vec_dot must return exactly the dequantized element: the fused
    // kernels compute each value in registers with the same f32 operations as `dequantize`, and
    // every other product is ±0, which adds exactly. Checks every position of every format's
    // layout (both SIMD paths when run with and without RILL_NO_AVX2).
    let mut rng = Rng::new(7);
    let n = 512;
    for ty in WEIGHT_TYPES {
        for _ in 0..3 {
            let row = random_row(ty, n, &mut rng);
            let mut y = vec![0f32; n];
            dequantize(ty, &row, &mut y).unwrap();
            let mut x = vec![0f32; n];
            for i in 0..n {
                x[i] = 1.0;
                let got = vec_dot(ty, &row, &x).unwrap();
                x[i] = 0.0;
                assert!(got == y[i], "{ty} element {i}: vec_dot {got} vs dequantize {}", y[i]);
            }
        }
    }
}

#[test]
fn vec_dot_error_within_summation_bound_over_wide_ranges() {
    // Block scales spread over 2^-20..2^12 (f16 subnormals through large values) and x with
    // a few ±1e4 outliers (massive activations). vec_dot rounds each product once and sums
    // them in 16 lanes of n/16 sequential additions followed by a 4-level pairwise reduction,
    // so the classic bound |error| <= γ_k · Σ|y·x| holds with k = 1 + n/16 + 4 and
    // γ_k = k·u / (1 − k·u), u = 2^-24 (plus a tiny absolute term for underflowing products).
    // The bound is a property of the summation alone, not tuned to the data.
    let mut rng = Rng::new(8);
    let u = 2f64.powi(-24);
    for ty in WEIGHT_TYPES {
        for n in [256usize, 1024, 4096 + 512] {
            let mut row = random_row(ty, n, &mut rng);
            let bs = ty.type_size() as usize;
            for block in row.chunks_exact_mut(bs) {
                for &at in f16_scale_offsets(ty) {
                    let e = (rng.uniform() * 32.0) as i32 - 20;
                    let v = 2f32.powi(e) * (1.0 + rng.uniform() as f32) * if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
                    block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
            }
            let mut x = rng.normals(n, 1.0);
            for _ in 0..4 {
                let i = (rng.next_u64() % n as u64) as usize;
                x[i] = if rng.uniform() < 0.5 { 1e4 } else { -1e4 };
            }
            let mut y = vec![0f32; n];
            dequantize(ty, &row, &mut y).unwrap();
            assert_finite(ty, "wide-range row", &y);
            let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = y.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let k = (1 + n / 16 + 4) as f64;
            let gamma = k * u / (1.0 - k * u);
            let got = vec_dot(ty, &row, &x).unwrap() as f64;
            assert!(
                (got - exact).abs() <= gamma * scale + 1e-37 * n as f64,
                "{ty} n={n}: vec_dot {got} vs {exact} (bound {})",
                gamma * scale
            );
        }
    }
}
