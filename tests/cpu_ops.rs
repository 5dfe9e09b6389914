//! Every op of the CPU backend against a plain, independent f64 loop written here, on fresh random
//! inputs over odd shapes, plus the error cases (bad shapes, dtypes and aliasing return `Err`).
//! Quantized weights are checked against the dequantized matrix (what the kernels must match),
//! not the original f32 one.

mod common;

use common::weights::quantizable;
use common::{assert_close_f64, silu, Rng};
use rill::backend::cpu::CpuBackend;
use rill::backend::{AttnDims, Backend, DType, GdnDims, Pos, Tensor, WeightData, NON_FINITE};
use rill::gguf::{GgmlType, TensorBytes};

const TS: [usize; 4] = [1, 3, 64, 65];

fn be() -> CpuBackend {
    CpuBackend::new()
}
fn up(b: &CpuBackend, data: &[f32], shape: &[usize]) -> Tensor {
    b.upload_f32(data, shape).unwrap()
}
fn zeros(b: &CpuBackend, shape: &[usize]) -> Tensor {
    b.alloc(DType::F32, shape).unwrap()
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Encode f32 values as a GGUF weight of type `ty` and return the tensor plus the values the
/// kernel will actually see (after rounding to `ty`, or quantizing and dequantizing).
fn weight(b: &CpuBackend, ty: GgmlType, vals: &[f32], shape: &[usize]) -> (Tensor, Vec<f32>) {
    let (bytes, seen): (Vec<u8>, Vec<f32>) = match ty {
        GgmlType::F32 => (vals.iter().flat_map(|v| v.to_le_bytes()).collect(), vals.to_vec()),
        GgmlType::F16 => {
            let h: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        GgmlType::Bf16 => {
            let h: Vec<half::bf16> = vals.iter().map(|&v| half::bf16::from_f32(v)).collect();
            (
                h.iter().flat_map(|v| v.to_le_bytes()).collect(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        _ => {
            let cols = shape[shape.len() - 1];
            let mut q = vec![0u8; ty.row_size(cols as u64).unwrap() as usize * (vals.len() / cols)];
            rill::quant::quantize_rows_par(ty, vals, cols, &mut q).unwrap();
            let mut seen = vec![0f32; vals.len()];
            rill::quant::dequantize(ty, &q, &mut seen).unwrap();
            (q, seen)
        }
    };
    let w = WeightData {
        name: "w".into(),
        ggml_type: ty,
        shape: shape.to_vec(),
        bytes: TensorBytes::from_vec(bytes),
    };
    (b.upload_weight(&w).unwrap(), seen)
}

/// `y[t][o] = Σ_i w[o][i] x[t][i]` in f64, and `Σ |w x|` for an error bound.
fn matmul_ref(w: &[f32], x: &[f32], n_out: usize, n_in: usize) -> (Vec<f64>, Vec<f64>) {
    let t_len = x.len() / n_in;
    let mut y = vec![0f64; t_len * n_out];
    let mut mag = vec![0f64; t_len * n_out];
    for t in 0..t_len {
        for o in 0..n_out {
            for i in 0..n_in {
                let p = w[o * n_in + i] as f64 * x[t * n_in + i] as f64;
                y[t * n_out + o] += p;
                mag[t * n_out + o] += p.abs();
            }
        }
    }
    (y, mag)
}

#[test]
fn matmul_weight_types() {
    let b = be();
    let mut rng = Rng::new(1);
    for &(n_out, n_in) in &[(37usize, 67usize), (64, 256), (5, 1)] {
        for &t in &TS {
            let wv = rng.normals(n_out * n_in, 1.0);
            let xv = rng.normals(t * n_in, 1.0);
            let x = up(&b, &xv, &[t, n_in]);
            // (name, W, the values the kernel sees, relative tolerance on Σ|w x|).
            let mut cases: Vec<(String, Tensor, Vec<f32>, f64)> = Vec::new();
            for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
                let (w, seen) = weight(&b, ty, &wv, &[n_out, n_in]);
                cases.push((format!("{ty:?}"), w, seen, 1e-6));
            }
            // A plain F32 tensor is also a valid W.
            cases.push(("F32 tensor".into(), up(&b, &wv, &[n_out, n_in]), wv.clone(), 1e-6));
            // Quantized rows go through `quant::vec_dot` (T = 1) or dequantized rows, which
            // tests/quant_roundtrip.rs holds to 1e-5 Σ|w x| of the dot of the dequantized row.
            for ty in quantizable().filter(|ty| ty.block_size() > 1 && n_in.is_multiple_of(ty.block_size() as usize)) {
                let (w, seen) = weight(&b, ty, &wv, &[n_out, n_in]);
                cases.push((format!("{ty:?}"), w, seen, 1e-5));
            }
            for (name, w, seen, rel) in cases {
                let out = zeros(&b, &[t, n_out]);
                b.matmul(&w, &x, &out).unwrap();
                let got = b.read_f32(&out).unwrap();
                let (want, mag) = matmul_ref(&seen, &xv, n_out, n_in);
                for i in 0..got.len() {
                    let err = (got[i] as f64 - want[i]).abs();
                    assert!(
                        err <= rel * mag[i] + 1e-7,
                        "matmul {name} [{n_out},{n_in}] T {t} elem {i}: {} vs {}",
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_errors() {
    let b = be();
    let mut rng = Rng::new(2);
    let (w, _) = weight(&b, GgmlType::F16, &rng.normals(6 * 8, 1.0), &[6, 8]);
    let x = up(&b, &rng.normals(3 * 8, 1.0), &[3, 8]);
    assert!(b.matmul(&w, &x, &zeros(&b, &[3, 6])).is_ok());
    assert!(b.matmul(&w, &x, &zeros(&b, &[3, 5])).is_err(), "wrong n_out");
    assert!(b.matmul(&w, &x, &zeros(&b, &[2, 6])).is_err(), "wrong T");
    assert!(
        b.matmul(&w, &up(&b, &rng.normals(3 * 7, 1.0), &[3, 7]), &zeros(&b, &[3, 6]))
            .is_err(),
        "wrong n_in"
    );
    let xw = up(&b, &rng.normals(6 * 6, 1.0), &[6, 6]);
    assert!(b.matmul(&xw, &xw, &xw).is_err(), "output aliasing input");
    let ids = b.upload_u32(&[1, 2, 3], &[3]).unwrap();
    assert!(b.matmul(&w, &ids, &zeros(&b, &[3, 6])).is_err(), "U32 input");
    let bad = WeightData {
        name: "short".into(),
        ggml_type: GgmlType::F16,
        shape: vec![6, 8],
        bytes: TensorBytes::from_vec(vec![0u8; 10]),
    };
    assert!(b.upload_weight(&bad).is_err(), "weight bytes do not match shape");
}

#[test]
fn embed_rows() {
    let b = be();
    let mut rng = Rng::new(3);
    let (vocab, d) = (50, 24);
    let tv = rng.normals(vocab * d, 1.0);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
        let (table, seen) = weight(&b, ty, &tv, &[vocab, d]);
        for &t in &TS {
            let idv: Vec<u32> = (0..t).map(|_| rng.below(vocab) as u32).collect();
            let ids = b.upload_u32(&idv, &[t]).unwrap();
            let out = zeros(&b, &[t, d]);
            b.embed(&table, &ids, &out).unwrap();
            let want: Vec<f64> = idv
                .iter()
                .flat_map(|&id| seen[id as usize * d..(id as usize + 1) * d].iter().map(|&v| v as f64))
                .collect();
            assert_close_f64("embed", &b.read_f32(&out).unwrap(), &want, 0.0, 0.0);
        }
    }
    let (table, _) = weight(&b, GgmlType::F16, &tv, &[vocab, d]);
    let ids = b.upload_u32(&[0, vocab as u32], &[2]).unwrap();
    assert!(b.embed(&table, &ids, &zeros(&b, &[2, d])).is_err(), "id out of range");
    let ids = b.upload_u32(&[0, 1], &[2]).unwrap();
    assert!(b.embed(&table, &ids, &zeros(&b, &[3, d])).is_err(), "wrong out rows");
}

fn rms_ref(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    let d = w.len();
    let mut y = Vec::with_capacity(x.len());
    for g in x.chunks(d) {
        let ms = g.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
        let s = 1.0 / (ms + eps).sqrt();
        y.extend(g.iter().zip(w).map(|(&v, &wi)| v as f64 * s * wi as f64));
    }
    y
}

#[test]
fn rms_norm_whole_row_and_per_head() {
    let b = be();
    let mut rng = Rng::new(4);
    let eps = 1e-6;
    for &t in &TS {
        // Whole row (d = 72), and per head (3 heads of 24 sharing one weight).
        for &(cols, d) in &[(72usize, 72usize), (72, 24)] {
            let xv = rng.normals(t * cols, 1.0);
            let wv = rng.normals(d, 1.0);
            let out = zeros(&b, &[t, cols]);
            b.rms_norm(&up(&b, &xv, &[t, cols]), &up(&b, &wv, &[d]), eps, &out)
                .unwrap();
            assert_close_f64(
                "rms_norm",
                &b.read_f32(&out).unwrap(),
                &rms_ref(&xv, &wv, eps as f64),
                1e-6,
                1e-5,
            );
        }
    }
    let x = up(&b, &rng.normals(2 * 10, 1.0), &[2, 10]);
    assert!(b
        .rms_norm(&x, &up(&b, &rng.normals(3, 1.0), &[3]), eps, &zeros(&b, &[2, 10]))
        .is_err());
    assert!(
        b.rms_norm(&x, &up(&b, &rng.normals(10, 1.0), &[10]), eps, &x).is_err(),
        "aliasing"
    );
}

#[test]
fn gated_rms_norm_per_head() {
    let b = be();
    let mut rng = Rng::new(5);
    let eps = 1e-6;
    for &t in &TS {
        let (heads, d) = (3, 16);
        let xv = rng.normals(t * heads * d, 1.0);
        let zv = rng.normals(t * heads * d, 1.0);
        let wv = rng.normals(d, 1.0);
        let out = zeros(&b, &[t, heads * d]);
        let x = up(&b, &xv, &[t, heads * d]);
        let z = up(&b, &zv, &[t, heads * d]);
        b.gated_rms_norm(&x, &z, &up(&b, &wv, &[d]), eps, &out).unwrap();
        let want: Vec<f64> = rms_ref(&xv, &wv, eps as f64)
            .iter()
            .zip(&zv)
            .map(|(n, &z)| n * silu(z as f64))
            .collect();
        assert_close_f64("gated_rms_norm", &b.read_f32(&out).unwrap(), &want, 1e-6, 1e-5);
        assert!(b
            .gated_rms_norm(&x, &up(&b, &zv[..d], &[d]), &up(&b, &wv, &[d]), eps, &out)
            .is_err());
    }
}

#[test]
fn elementwise_ops() {
    let b = be();
    let mut rng = Rng::new(6);
    for &t in &TS {
        let d = 33;
        let n = t * d;
        let (av, xv, gv) = (rng.normals(n, 1.0), rng.normals(n, 1.0), rng.normals(n, 1.0));
        let gl: Vec<f32> = rng.normals(t, 1.0);

        let acc = up(&b, &av, &[t, d]);
        b.add_assign(&acc, &up(&b, &xv, &[t, d])).unwrap();
        let want: Vec<f64> = av.iter().zip(&xv).map(|(&a, &x)| a as f64 + x as f64).collect();
        assert_close_f64("add_assign", &b.read_f32(&acc).unwrap(), &want, 1e-6, 1e-6);

        let out = zeros(&b, &[t, d]);
        b.swiglu(&up(&b, &gv, &[t, d]), &up(&b, &xv, &[t, d]), &out).unwrap();
        let want: Vec<f64> = gv.iter().zip(&xv).map(|(&g, &u)| silu(g as f64) * u as f64).collect();
        assert_close_f64("swiglu", &b.read_f32(&out).unwrap(), &want, 1e-7, 1e-6);

        let x = up(&b, &xv, &[t, d]);
        b.sigmoid_mul_assign(&x, &up(&b, &gv, &[t, d])).unwrap();
        let want: Vec<f64> = xv
            .iter()
            .zip(&gv)
            .map(|(&x, &g)| x as f64 * sigmoid64(g as f64))
            .collect();
        assert_close_f64("sigmoid_mul_assign", &b.read_f32(&x).unwrap(), &want, 1e-7, 1e-6);

        let acc = up(&b, &av, &[t, d]);
        b.sigmoid_scale_add(&acc, &up(&b, &xv, &[t, d]), &up(&b, &gl, &[t, 1]))
            .unwrap();
        let want: Vec<f64> = (0..n)
            .map(|i| av[i] as f64 + sigmoid64(gl[i / d] as f64) * xv[i] as f64)
            .collect();
        assert_close_f64("sigmoid_scale_add", &b.read_f32(&acc).unwrap(), &want, 1e-6, 1e-6);
    }
    // Extreme inputs must not produce NaN.
    let g = up(&b, &[-1000.0, 1000.0, 0.0], &[3]);
    let u = up(&b, &[1.0, 1.0, 1.0], &[3]);
    let out = zeros(&b, &[3]);
    b.swiglu(&g, &u, &out).unwrap();
    assert_eq!(b.read_f32(&out).unwrap(), vec![0.0, 1000.0, 0.0]);
    // Errors.
    let a = up(&b, &[1.0; 6], &[2, 3]);
    assert!(b.add_assign(&a, &up(&b, &[1.0; 5], &[5])).is_err());
    assert!(b.add_assign(&a, &a).is_err(), "in place op with its own input");
    assert!(b
        .sigmoid_scale_add(&a, &up(&b, &[1.0; 6], &[2, 3]), &up(&b, &[0.0; 3], &[3, 1]))
        .is_err());
    assert!(b.swiglu(&a, &a, &a).is_err(), "out aliases inputs");
}

/// Conv reference over the full history `hist` (`[K-1 + T, C]`: the start state then the inputs).
fn conv_ref(hist: &[f32], w: &[f32], c: usize, k: usize) -> Vec<f64> {
    let t_len = hist.len() / c - (k - 1);
    let mut y = vec![0f64; t_len * c];
    for t in 0..t_len {
        for ch in 0..c {
            let mut acc = 0f64;
            for j in 0..k {
                acc += w[ch * k + j] as f64 * hist[(t + j) * c + ch] as f64;
            }
            y[t * c + ch] = silu(acc);
        }
    }
    y
}

#[test]
fn conv1d_state_continuation() {
    let b = be();
    let mut rng = Rng::new(7);
    let (c, k) = (37, 4);
    let wv = rng.normals(c * k, 1.0);
    let w = up(&b, &wv, &[c, k]);
    let s0 = rng.normals((k - 1) * c, 1.0);
    for &t in &TS {
        // One call over T tokens from a nonzero state.
        let xv = rng.normals(t * c, 1.0);
        let st = up(&b, &s0, &[k - 1, c]);
        let out = zeros(&b, &[t, c]);
        b.conv1d_causal_silu(&up(&b, &xv, &[t, c]), &w, &st, &out).unwrap();
        let hist: Vec<f32> = s0.iter().chain(&xv).copied().collect();
        assert_close_f64(
            "conv1d",
            &b.read_f32(&out).unwrap(),
            &conv_ref(&hist, &wv, c, k),
            1e-6,
            1e-5,
        );
        // New state = last K-1 rows of [state | x] (still partly old state when T < K-1).
        let want_state: Vec<f64> = hist[hist.len() - (k - 1) * c..].iter().map(|&v| v as f64).collect();
        assert_close_f64("conv1d state", &b.read_f32(&st).unwrap(), &want_state, 0.0, 0.0);
    }
    // Split calls: T = 2 then T = 1, and T = 1 three times, both equal one T = 3 call.
    let xv = rng.normals(3 * c, 1.0);
    let full = {
        let st = up(&b, &s0, &[k - 1, c]);
        let out = zeros(&b, &[3, c]);
        b.conv1d_causal_silu(&up(&b, &xv, &[3, c]), &w, &st, &out).unwrap();
        (b.read_f32(&out).unwrap(), b.read_f32(&st).unwrap())
    };
    for split in [&[2usize, 1][..], &[1, 1, 1][..]] {
        let st = up(&b, &s0, &[k - 1, c]);
        let mut outs = Vec::new();
        let mut t0 = 0;
        for &n in split {
            let out = zeros(&b, &[n, c]);
            b.conv1d_causal_silu(&up(&b, &xv[t0 * c..(t0 + n) * c], &[n, c]), &w, &st, &out)
                .unwrap();
            outs.extend(b.read_f32(&out).unwrap());
            t0 += n;
        }
        assert_eq!(outs, full.0, "split {split:?} outputs");
        assert_eq!(b.read_f32(&st).unwrap(), full.1, "split {split:?} state");
    }
    // Errors: wrong state size, wrong taps, state aliasing out.
    let x = up(&b, &xv, &[3, c]);
    assert!(b
        .conv1d_causal_silu(&x, &w, &zeros(&b, &[k, c]), &zeros(&b, &[3, c]))
        .is_err());
    assert!(b
        .conv1d_causal_silu(
            &x,
            &up(&b, &wv[..(c - 1) * 3], &[c - 1, 3]),
            &zeros(&b, &[k - 1, c]),
            &zeros(&b, &[3, c])
        )
        .is_err());
    let st = zeros(&b, &[3, c]);
    assert!(b.conv1d_causal_silu(&x, &w, &st, &st).is_err());
}

#[test]
fn gdn_gates_values() {
    let b = be();
    let mut rng = Rng::new(8);
    let hv = 5;
    for &t in &TS {
        let mut av: Vec<f32> = rng.normals(t * hv, 1.0).iter().map(|v| v * 10.0).collect();
        av[0] = 30.0; // softplus overflow branch
        let bv: Vec<f32> = rng.normals(t * hv, 1.0).iter().map(|v| v * 5.0).collect();
        let sa: Vec<f32> = rng.normals(hv, 1.0).iter().map(|v| -v.abs() - 0.1).collect();
        let dt = rng.normals(hv, 1.0);
        let (g, beta) = (zeros(&b, &[t, hv]), zeros(&b, &[t, hv]));
        b.gdn_gates(
            &up(&b, &av, &[t, hv]),
            &up(&b, &bv, &[t, hv]),
            &up(&b, &sa, &[hv]),
            &up(&b, &dt, &[hv]),
            &g,
            &beta,
        )
        .unwrap();
        let mut wg = Vec::new();
        let mut wb = Vec::new();
        for i in 0..t * hv {
            let j = i % hv;
            let x = av[i] as f64 + dt[j] as f64;
            let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
            wg.push(sa[j] as f64 * sp);
            wb.push(sigmoid64(bv[i] as f64));
        }
        assert_close_f64("gdn g", &b.read_f32(&g).unwrap(), &wg, 1e-6, 1e-5);
        assert_close_f64("gdn beta", &b.read_f32(&beta).unwrap(), &wb, 1e-7, 1e-6);
    }
    let a = zeros(&b, &[2, hv]);
    let s = zeros(&b, &[hv]);
    assert!(b
        .gdn_gates(
            &a,
            &a,
            &zeros(&b, &[hv + 1]),
            &s,
            &zeros(&b, &[2, hv]),
            &zeros(&b, &[2, hv])
        )
        .is_err());
    assert!(
        b.gdn_gates(&a, &a, &s, &s, &a, &zeros(&b, &[2, hv])).is_err(),
        "aliasing"
    );
}

#[test]
fn l2_norm_qk_heads() {
    let b = be();
    let mut rng = Rng::new(9);
    let dims = GdnDims {
        hk: 2,
        hv: 4,
        dk: 16,
        dv: 8,
    };
    let cd = dims.conv_dim();
    let eps = 1e-6;
    for &t in &TS {
        let mut uv = rng.normals(t * cd, 1.0);
        // One all-zero head: must stay zero, not NaN.
        uv[..dims.dk].iter_mut().for_each(|v| *v = 0.0);
        let u = up(&b, &uv, &[t, cd]);
        b.l2_norm_qk(&u, dims, eps).unwrap();
        let mut want: Vec<f64> = uv.iter().map(|&v| v as f64).collect();
        for row in want.chunks_mut(cd) {
            for (h, head) in row[..2 * dims.key_dim()].chunks_mut(dims.dk).enumerate() {
                let n = (head.iter().map(|v| v * v).sum::<f64>() + eps as f64).sqrt();
                let s = if h < dims.hk {
                    1.0 / (dims.dk as f64).sqrt()
                } else {
                    1.0
                };
                head.iter_mut().for_each(|v| *v = *v / n * s);
            }
        }
        assert_close_f64("l2_norm_qk", &b.read_f32(&u).unwrap(), &want, 1e-7, 1e-6);
    }
    assert!(b.l2_norm_qk(&zeros(&b, &[2, cd + 1]), dims, eps).is_err());
}

#[test]
fn split_qgate_per_head() {
    let b = be();
    let mut rng = Rng::new(10);
    let (h, d) = (3, 8);
    for &t in &TS {
        let v = rng.normals(t * 2 * h * d, 1.0);
        let (q, g) = (zeros(&b, &[t, h * d]), zeros(&b, &[t, h * d]));
        b.split_qgate(&up(&b, &v, &[t, 2 * h * d]), d, &q, &g).unwrap();
        let (mut wq, mut wg) = (Vec::new(), Vec::new());
        for pair in v.chunks(2 * d) {
            wq.extend(pair[..d].iter().map(|&x| x as f64));
            wg.extend(pair[d..].iter().map(|&x| x as f64));
        }
        assert_close_f64("split q", &b.read_f32(&q).unwrap(), &wq, 0.0, 0.0);
        assert_close_f64("split gate", &b.read_f32(&g).unwrap(), &wg, 0.0, 0.0);
    }
    let qg = zeros(&b, &[1, 2 * h * d]);
    assert!(b
        .split_qgate(&qg, d, &zeros(&b, &[1, h * d + 1]), &zeros(&b, &[1, h * d]))
        .is_err());
}

fn rope_ref(x: &[f32], t_len: usize, hd: usize, n_rot: usize, theta: f64, pos0: usize) -> Vec<f64> {
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let cols = x.len() / t_len;
    for t in 0..t_len {
        let p = (pos0 + t) as f64;
        for head in y[t * cols..(t + 1) * cols].chunks_mut(hd) {
            for i in 0..n_rot / 2 {
                let f = theta.powf(-2.0 * i as f64 / n_rot as f64);
                let (s, c) = (p * f).sin_cos();
                let (x0, x1) = (head[i], head[i + n_rot / 2]);
                head[i] = x0 * c - x1 * s;
                head[i + n_rot / 2] = x0 * s + x1 * c;
            }
        }
    }
    y
}

#[test]
fn rope_neox_partial() {
    let b = be();
    let mut rng = Rng::new(11);
    let (heads, hd, n_rot, theta) = (3, 32, 16, 10_000_000.0f32);
    for &t in &TS {
        for &pos0 in &[0usize, 7, 5000] {
            let xv = rng.normals(t * heads * hd, 1.0);
            let x = up(&b, &xv, &[t, heads * hd]);
            let pt = b.upload_u32(&[pos0 as u32], &[1]).unwrap();
            b.rope_neox(&x, hd, n_rot, theta, Pos { host: pos0, dev: &pt }).unwrap();
            let want = rope_ref(&xv, t, hd, n_rot, theta as f64, pos0);
            assert_close_f64("rope", &b.read_f32(&x).unwrap(), &want, 1e-6, 1e-6);
        }
    }
    let x = zeros(&b, &[2, 3 * hd]);
    let p0 = b.upload_u32(&[0], &[1]).unwrap();
    let at0 = Pos { host: 0, dev: &p0 };
    assert!(b.rope_neox(&x, hd, hd + 2, 1e4, at0).is_err(), "n_rot > head_dim");
    assert!(b.rope_neox(&x, hd, 15, 1e4, at0).is_err(), "odd n_rot");
    assert!(b.rope_neox(&x, 20, 16, 1e4, at0).is_err(), "not whole heads");
}

#[test]
fn attention_causal_gqa() {
    let b = be();
    let mut rng = Rng::new(12);
    let dims = AttnDims {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 16,
    };
    let (nh, nkv, d) = (dims.n_head, dims.n_head_kv, dims.head_dim);
    let scale = 1.0 / (d as f32).sqrt();
    for &t in &TS {
        for &pos0 in &[0usize, 5, 70] {
            let ctx = pos0 + t + 3; // spare rows after the last position must be ignored
            let qv: Vec<f32> = rng.normals(t * nh * d, 1.0).iter().map(|v| v * 3.0).collect();
            let kv = rng.normals(ctx * nkv * d, 1.0);
            let vv = rng.normals(ctx * nkv * d, 1.0);
            let out = zeros(&b, &[t, nh * d]);
            let (q, kc, vc) = (
                up(&b, &qv, &[t, nh * d]),
                up(&b, &kv, &[ctx, nkv * d]),
                up(&b, &vv, &[ctx, nkv * d]),
            );
            let pt = b.upload_u32(&[pos0 as u32], &[1]).unwrap();
            b.attention(&q, &kc, &vc, Pos { host: pos0, dev: &pt }, dims, scale, &out)
                .unwrap();
            let mut want = vec![0f64; t * nh * d];
            for tt in 0..t {
                for h in 0..nh {
                    let kvh = h / (nh / nkv);
                    let n = pos0 + tt + 1;
                    let sc: Vec<f64> = (0..n)
                        .map(|s| {
                            (0..d)
                                .map(|i| qv[tt * nh * d + h * d + i] as f64 * kv[s * nkv * d + kvh * d + i] as f64)
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for i in 0..d {
                        want[tt * nh * d + h * d + i] = (0..n)
                            .map(|s| e[s] / z * vv[s * nkv * d + kvh * d + i] as f64)
                            .sum::<f64>();
                    }
                }
            }
            assert_close_f64(
                &format!("attention T {t} pos0 {pos0}"),
                &b.read_f32(&out).unwrap(),
                &want,
                1e-6,
                1e-5,
            );
        }
    }
    let q = zeros(&b, &[3, nh * d]);
    let kc = zeros(&b, &[4, nkv * d]);
    let out = zeros(&b, &[3, nh * d]);
    let at = |p: usize| b.upload_u32(&[p as u32], &[1]).unwrap();
    let (p0, p1, p2) = (at(0), at(1), at(2));
    let (at0, at1, at2) = (
        Pos { host: 0, dev: &p0 },
        Pos { host: 1, dev: &p1 },
        Pos { host: 2, dev: &p2 },
    );
    assert!(b.attention(&q, &kc, &kc, at1, dims, scale, &out).is_ok());
    assert!(
        b.attention(&q, &kc, &kc, at2, dims, scale, &out).is_err(),
        "positions past the cache"
    );
    let bad = AttnDims { n_head: 5, ..dims };
    assert!(
        b.attention(&q, &kc, &kc, at0, bad, scale, &out).is_err(),
        "H not a multiple of Hkv"
    );
    assert!(
        b.attention(&q, &kc, &kc, at0, dims, scale, &q).is_err(),
        "out aliases q"
    );
}

#[test]
fn moe_route_topk_ties_and_scale() {
    let b = be();
    let mut rng = Rng::new(13);
    let (e, k) = (10, 3);
    for &t in &TS {
        let mut lv = rng.normals(t * e, 1.0);
        // Row 0: a three-way tie for the top; the lower indices must win, in index order.
        for (i, v) in lv[..e].iter_mut().enumerate() {
            *v = if i == 2 || i == 5 || i == 8 { 1.5 } else { -1.0 };
        }
        lv[4] = 1.5; // four-way tie among 2, 4, 5, 8 -> 2, 4, 5
        let (ids, w) = (b.alloc(DType::U32, &[t, k]).unwrap(), zeros(&b, &[t, k]));
        let scale = 2.5;
        b.moe_route(&up(&b, &lv, &[t, e]), k, scale, &ids, &w).unwrap();
        let gi = b.read_u32(&ids).unwrap();
        let gw = b.read_f32(&w).unwrap();
        assert_eq!(&gi[..k], &[2, 4, 5]);
        for tt in 0..t {
            let row = &lv[tt * e..(tt + 1) * e];
            let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let p: Vec<f64> = row.iter().map(|&v| (v as f64 - mx).exp()).collect();
            let z: f64 = p.iter().sum();
            let p: Vec<f64> = p.iter().map(|v| v / z).collect();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &c| p[c].partial_cmp(&p[a]).unwrap().then(a.cmp(&c)));
            let sel = &order[..k];
            let s: f64 = sel.iter().map(|&i| p[i]).sum();
            let want_w: Vec<f64> = sel.iter().map(|&i| p[i] / s.max(6.1035e-5) * scale as f64).collect();
            assert_eq!(
                &gi[tt * k..(tt + 1) * k],
                &sel.iter().map(|&i| i as u32).collect::<Vec<_>>()[..]
            );
            assert_close_f64("moe weights", &gw[tt * k..(tt + 1) * k], &want_w, 1e-7, 1e-5);
        }
    }
    let l = zeros(&b, &[2, e]);
    let ids = b.alloc(DType::U32, &[2, k]).unwrap();
    assert!(
        b.moe_route(&l, e + 1, 1.0, &ids, &zeros(&b, &[2, e + 1])).is_err(),
        "k > E"
    );
    assert!(b.moe_route(&l, k, 1.0, &ids, &zeros(&b, &[2, k + 1])).is_err());
    assert!(
        b.moe_route(&l, k, 1.0, &zeros(&b, &[2, k]), &zeros(&b, &[2, k]))
            .is_err(),
        "ids must be U32"
    );
}

/// `moe_experts` on expert weights of format `ty` (values `gv`, `uv`, `dv`) for every T, against
/// the f64 weighted sum over the values the kernel sees.
#[allow(clippy::too_many_arguments)]
fn moe_experts_case(
    b: &CpuBackend,
    rng: &mut Rng,
    ty: GgmlType,
    (gv, uv, dv): (&[f32], &[f32], &[f32]),
    n_exp: usize,
    n_ff: usize,
    d: usize,
    k: usize,
) {
    let (gt, gs) = weight(b, ty, gv, &[n_exp, n_ff, d]);
    let (ut, us) = weight(b, ty, uv, &[n_exp, n_ff, d]);
    let (dt, ds) = weight(b, ty, dv, &[n_exp, d, n_ff]);
    for &t in &TS {
        let xv = rng.normals(t * d, 1.0);
        // Distinct experts per token, random weights.
        let mut idv = Vec::new();
        for _ in 0..t {
            let a = rng.below(n_exp);
            let c = (a + 1 + rng.below(n_exp - 1)) % n_exp;
            idv.extend([a as u32, c as u32]);
        }
        let wv: Vec<f32> = (0..t * k).map(|_| rng.uniform() as f32).collect();
        let out = zeros(b, &[t, d]);
        b.moe_experts(
            &up(b, &xv, &[t, d]),
            &gt,
            &ut,
            &dt,
            &b.upload_u32(&idv, &[t, k]).unwrap(),
            &up(b, &wv, &[t, k]),
            &out,
        )
        .unwrap();
        let mut want = vec![0f64; t * d];
        for tt in 0..t {
            let x = &xv[tt * d..(tt + 1) * d];
            for j in 0..k {
                let e = idv[tt * k + j] as usize;
                let h: Vec<f64> = (0..n_ff)
                    .map(|f| {
                        let row =
                            |w: &[f32]| -> f64 { (0..d).map(|i| w[(e * n_ff + f) * d + i] as f64 * x[i] as f64).sum() };
                        silu(row(&gs)) * row(&us)
                    })
                    .collect();
                for o in 0..d {
                    let y: f64 = (0..n_ff).map(|f| ds[(e * d + o) * n_ff + f] as f64 * h[f]).sum();
                    want[tt * d + o] += wv[tt * k + j] as f64 * y;
                }
            }
        }
        assert_close_f64(
            &format!("moe_experts {ty:?} T {t}"),
            &b.read_f32(&out).unwrap(),
            &want,
            1e-4,
            1e-5,
        );
    }
}

#[test]
fn moe_experts_weighted_sum() {
    let b = be();
    let mut rng = Rng::new(14);
    let (n_exp, n_ff, d, k) = (5, 24, 32, 2);
    let gv = rng.normals(n_exp * n_ff * d, 1.0);
    let uv = rng.normals(n_exp * n_ff * d, 1.0);
    let dv = rng.normals(n_exp * d * n_ff, 1.0);
    for ty in [GgmlType::F16, GgmlType::Bf16, GgmlType::F32] {
        moe_experts_case(&b, &mut rng, ty, (&gv, &uv, &dv), n_exp, n_ff, d, k);
    }
    // Quantized experts: rows of whole 32-element blocks (n_ff 32 instead of 24, so the outputs
    // have the magnitudes the absolute tolerance was set for).
    let (qn_ff, qd) = (32, 32);
    let qg = rng.normals(n_exp * qn_ff * qd, 1.0);
    let qu = rng.normals(n_exp * qn_ff * qd, 1.0);
    let qdn = rng.normals(n_exp * qd * qn_ff, 1.0);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
        moe_experts_case(&b, &mut rng, ty, (&qg, &qu, &qdn), n_exp, qn_ff, qd, k);
    }
    let (gt, _) = weight(&b, GgmlType::F16, &gv, &[n_exp, n_ff, d]);
    let (dt, _) = weight(&b, GgmlType::F16, &dv, &[n_exp, d, n_ff]);
    let x = zeros(&b, &[1, d]);
    let w = zeros(&b, &[1, k]);
    let ids = b.upload_u32(&[0, n_exp as u32], &[1, k]).unwrap();
    assert!(
        b.moe_experts(&x, &gt, &gt, &dt, &ids, &w, &zeros(&b, &[1, d])).is_err(),
        "expert id out of range"
    );
    let ids = b.upload_u32(&[0, 1], &[1, k]).unwrap();
    assert!(
        b.moe_experts(&x, &gt, &gt, &gt, &ids, &w, &zeros(&b, &[1, d])).is_err(),
        "down shape"
    );
    assert!(b.moe_experts(&x, &gt, &gt, &dt, &ids, &w, &x).is_err(), "out aliases x");
}

#[test]
fn argmax_ties_and_nan() {
    let b = be();
    let v = [
        1.0,
        3.0,
        3.0,
        2.0, // tie -> 1
        f32::NAN,
        -5.0,
        f32::NAN,
        -5.0, // NaN loses, tie -> 1
        f32::NAN,
        f32::NEG_INFINITY,
        f32::NAN,
        -7.0, // NaN and -inf are never chosen -> 3
        f32::NAN,
        f32::NAN,
        f32::NAN,
        f32::NAN, // all NaN -> NON_FINITE
        f32::NEG_INFINITY,
        f32::NAN,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY, // nothing allowed -> NON_FINITE
        f32::NEG_INFINITY,
        f32::INFINITY,
        3.0,
        f32::INFINITY, // first +inf -> 1
    ];
    let out = b.alloc(DType::U32, &[6]).unwrap();
    b.argmax(&up(&b, &v, &[6, 4]), &out).unwrap();
    assert_eq!(b.read_u32(&out).unwrap(), vec![1, 1, 3, NON_FINITE, NON_FINITE, 1]);
    let mut rng = Rng::new(15);
    for &t in &TS {
        let l = rng.normals(t * 101, 1.0);
        let out = b.alloc(DType::U32, &[t]).unwrap();
        b.argmax(&up(&b, &l, &[t, 101]), &out).unwrap();
        let want: Vec<u32> = l
            .chunks(101)
            .map(|r| {
                let mut bi = 0;
                for i in 1..r.len() {
                    if r[i] > r[bi] {
                        bi = i;
                    }
                }
                bi as u32
            })
            .collect();
        assert_eq!(b.read_u32(&out).unwrap(), want);
    }
    assert!(b
        .argmax(&zeros(&b, &[2, 3]), &b.alloc(DType::U32, &[3]).unwrap())
        .is_err());
    assert!(
        b.argmax(&zeros(&b, &[2, 3]), &zeros(&b, &[2])).is_err(),
        "out must be U32"
    );
}

#[test]
fn memory_ops() {
    let b = be();
    assert_eq!(b.name(), "cpu");
    assert!(rill::backend::create("cpu").is_ok());
    let t = b.alloc(DType::F32, &[2, 3]).unwrap();
    assert_eq!(b.read_f32(&t).unwrap(), vec![0.0; 6]);
    assert!(b.alloc(DType::Ggml(GgmlType::Q8_0), &[32]).is_err());
    assert!(b.upload_f32(&[1.0; 5], &[2, 3]).is_err());

    let ids = b.alloc(DType::U32, &[3]).unwrap();
    b.write_u32(&ids, &[7, 8, 9]).unwrap();
    assert_eq!(b.read_u32(&ids).unwrap(), vec![7, 8, 9]);
    assert!(b.write_u32(&ids, &[1, 2]).is_err());
    assert!(b.read_u32(&t).is_err(), "read_u32 of an F32 tensor");
    b.zero(&ids).unwrap();
    assert_eq!(b.read_u32(&ids).unwrap(), vec![0, 0, 0]);

    let src = up(&b, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let dst = zeros(&b, &[4, 2]);
    b.copy_rows(&src, 1, &dst, 2, 2).unwrap();
    assert_eq!(b.read_f32(&dst).unwrap(), vec![0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(b.copy_rows(&src, 2, &dst, 0, 2).is_err(), "src rows out of range");
    assert!(b.copy_rows(&src, 0, &dst, 3, 2).is_err(), "dst rows out of range");
    assert!(b.copy_rows(&src, 0, &zeros(&b, &[4, 3]), 0, 1).is_err(), "row length");
    // Within one buffer (memmove semantics).
    b.copy_rows(&dst, 2, &dst, 1, 2).unwrap();
    assert_eq!(b.read_f32(&dst).unwrap(), vec![0.0, 0.0, 3.0, 4.0, 5.0, 6.0, 5.0, 6.0]);

    let c = zeros(&b, &[6]);
    b.copy(&src, &c).unwrap();
    assert_eq!(b.read_f32(&c).unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(b.copy(&src, &zeros(&b, &[5])).is_err());
    assert!(b.copy(&src, &b.alloc(DType::U32, &[6]).unwrap()).is_err());
    b.zero(&c).unwrap();
    assert_eq!(b.read_f32(&c).unwrap(), vec![0.0; 6]);

    // A prefix view of a larger buffer (scratch allocated for the largest batch).
    let big = up(&b, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
    let view = Tensor {
        shape: vec![2, 2],
        ..big.clone()
    };
    assert_eq!(b.read_f32(&view).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    let too_big = Tensor {
        shape: vec![4, 2],
        ..big
    };
    assert!(b.read_f32(&too_big).is_err());
}
