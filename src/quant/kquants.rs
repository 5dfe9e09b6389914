//! K-quant super-blocks (256 elements): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
//!
//! Dequantization follows ggml's `dequantize_row_*` operation order (`(d·sc)·q − dmin·m`), so it
//! is bit-identical. Quantizers for Q4_K, Q5_K, Q6_K implement ggml's `quantize_row_*_ref`
//! (scale/min search in `search.rs`, then 6/8-bit scale quantization and a re-quantization pass
//! against the rounded scales).

use super::dot::{sub, Acc};
use super::float::{read_f16, write_f16};
use super::search::{make_qkx2, make_qx, round_clamped, Qkx2Params, QKX2_Q4K, QKX2_Q5K};

pub(crate) const QK_K: usize = 256;

// ---------------------------------------------------------------- dequantization

#[inline(always)]
pub(crate) fn deq_q2_k(b: &[u8; 84], y: &mut [f32; QK_K]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = read_f16(b, 80);
    let dmin = read_f16(b, 82);
    for h in 0..2 {
        for s in 0..4 {
            for half in 0..2 {
                let sc = scales[8 * h + 2 * s + half];
                let dl = d * (sc & 0xf) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for l in 0..16 {
                    let q = (qs[32 * h + 16 * half + l] >> (2 * s)) & 3;
                    y[128 * h + 32 * s + 16 * half + l] = dl * q as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K's sixteen 6-bit signed sub-block scales.
#[inline(always)]
fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    let mut out = [0i32; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let low4 = if k < 8 { s[k] & 0xf } else { s[k - 8] >> 4 };
        let high2 = (s[8 + (k % 4)] >> (2 * (k / 4))) & 3;
        *o = (low4 | (high2 << 4)) as i32 - 32;
    }
    out
}

#[inline(always)]
pub(crate) fn deq_q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = q3_k_scales(&b[96..108]);
    let d = read_f16(b, 108);
    for h in 0..2 {
        for s in 0..4 {
            let bit = 1u8 << (4 * h + s);
            for half in 0..2 {
                let i0 = 128 * h + 32 * s + 16 * half;
                let dl = d * sc[i0 / 16] as f32;
                for l in 0..16 {
                    let ll = 16 * half + l;
                    let q2 = ((qs[32 * h + ll] >> (2 * s)) & 3) as i32;
                    let q = q2 - if hmask[ll] & bit != 0 { 0 } else { 4 };
                    y[i0 + l] = dl * q as f32;
                }
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: 6-bit scale and min of sub-block `j` from the 12 packed bytes.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[inline(always)]
pub(crate) fn deq_q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let q = qs[32 * c + l];
            y[64 * c + l] = d1 * (q & 0xf) as f32 - m1;
            y[64 * c + 32 + l] = d2 * (q >> 4) as f32 - m2;
        }
    }
}

#[inline(always)]
pub(crate) fn deq_q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let q = qs[32 * c + l];
            let h = qh[l] >> (2 * c);
            let lo = (q & 0xf) | ((h & 1) << 4);
            let hi = (q >> 4) | (((h >> 1) & 1) << 4);
            y[64 * c + l] = d1 * lo as f32 - m1;
            y[64 * c + 32 + l] = d2 * hi as f32 - m2;
        }
    }
}

#[inline(always)]
pub(crate) fn deq_q6_k(b: &[u8; 210], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 208);
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &b[192 + 8 * h..192 + 8 * h + 8];
        let yy = &mut y[128 * h..128 * h + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            yy[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            yy[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            yy[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            yy[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

// ---------------------------------------------------------------- fused dot products
//
// `Σ y·x` over one super-block, each `y` computed in registers with exactly the f32 operations of
// the `deq_*` function above (so the products equal those of `dot(deq_*(b), x)`).

/// The eight sub-block scales `d·sc` and mins `dmin·m` of Q4_K/Q5_K, in f32 as `deq_q4_k` forms
/// them ([`scale_min_k4`] for every sub-block, unrolled so that no index is data-dependent).
#[inline(always)]
fn scales_mins_k4(d: f32, dmin: f32, q: &[u8; 12]) -> ([f32; 8], [f32; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0xf) | ((q[j] >> 6) << 4);
        m[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
    (sc.map(|v| d * v as f32), m.map(|v| dmin * v as f32))
}

#[inline(always)]
pub(crate) fn dot_q4_k(b: &[u8; 144], x: &[f32; QK_K], acc: &mut Acc) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let (ds, ms) = scales_mins_k4(d, dmin, sub::<12, _>(b, 4));
    for c in 0..4 {
        let q = sub::<32, _>(b, 16 + 32 * c);
        let (d1, m1, d2, m2) = (ds[2 * c], ms[2 * c], ds[2 * c + 1], ms[2 * c + 1]);
        acc.add_with(sub::<32, _>(x, 64 * c), |l| d1 * (q[l] & 0xf) as f32 - m1);
        acc.add_with(sub::<32, _>(x, 64 * c + 32), |l| d2 * (q[l] >> 4) as f32 - m2);
    }
}

#[inline(always)]
pub(crate) fn dot_q5_k(b: &[u8; 176], x: &[f32; QK_K], acc: &mut Acc) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let (ds, ms) = scales_mins_k4(d, dmin, sub::<12, _>(b, 4));
    let qh = sub::<32, _>(b, 16);
    for c in 0..4 {
        let q = sub::<32, _>(b, 48 + 32 * c);
        let (d1, m1, d2, m2) = (ds[2 * c], ms[2 * c], ds[2 * c + 1], ms[2 * c + 1]);
        acc.add_with(sub::<32, _>(x, 64 * c), |l| {
            d1 * ((q[l] & 0xf) | (((qh[l] >> (2 * c)) & 1) << 4)) as f32 - m1
        });
        acc.add_with(sub::<32, _>(x, 64 * c + 32), |l| {
            d2 * ((q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) as f32 - m2
        });
    }
}

#[inline(always)]
pub(crate) fn dot_q6_k(b: &[u8; 210], x: &[f32; QK_K], acc: &mut Acc) {
    let d = read_f16(b, 208);
    // The sixteen sub-block scales `d·sc` as `deq_q6_k` forms them, one 16-lane vector.
    let ds = sub::<16, _>(b, 192).map(|s| d * (s as i8) as f32);
    for h in 0..2 {
        let sc = sub::<8, _>(&ds, 8 * h);
        let qh = sub::<32, _>(b, 128 + 32 * h);
        for is in 0..2 {
            // Element l of each 16-element sub-block below is ql/qh byte `16·is + l`.
            let ql = sub::<16, _>(b, 64 * h + 16 * is);
            let ql2 = sub::<16, _>(b, 64 * h + 32 + 16 * is);
            let qh = sub::<16, _>(qh, 16 * is);
            let at = |k: usize| sub::<16, _>(x, 128 * h + 32 * k + 16 * is);
            let (d1, d2, d3, d4) = (sc[is], sc[is + 2], sc[is + 4], sc[is + 6]);
            acc.add_with(at(0), |l| {
                d1 * (((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32) as f32
            });
            acc.add_with(at(1), |l| {
                d2 * (((ql2[l] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32) as f32
            });
            acc.add_with(at(2), |l| {
                d3 * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32) as f32
            });
            acc.add_with(at(3), |l| {
                d4 * (((ql2[l] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32) as f32
            });
        }
    }
}

// ---------------------------------------------------------------- quantization

/// Sub-block scales and mins of Q4_K/Q5_K: search the eight 32-element sub-blocks, quantize
/// the scales and mins to 6 bits against the super-block maxima, write `d`, `dmin` and the 12
/// packed scale bytes into `head` (16 bytes), and return the final levels `0..=nmax`.
fn quant_kx_scales(x: &[f32; QK_K], params: &Qkx2Params, head: &mut [u8]) -> [f32; QK_K] {
    // Transpose to [element][sub-block] so the search runs one sub-block per lane.
    let mut xt = [[0f32; 8]; 32];
    for (j, xs) in x.chunks_exact(32).enumerate() {
        for (i, &v) in xs.iter().enumerate() {
            xt[i][j] = v;
        }
    }
    // ggml weights each element by its sub-block's RMS plus its own magnitude.
    let mut sum_x2 = [0f32; 8];
    for xi in &xt {
        for k in 0..8 {
            sum_x2[k] += xi[k] * xi[k];
        }
    }
    let mut av_x = [0f32; 8];
    for k in 0..8 {
        av_x[k] = (sum_x2[k] / 32.0).sqrt();
    }
    let mut wt = [[0f32; 8]; 32];
    for (wi, xi) in wt.iter_mut().zip(&xt) {
        for k in 0..8 {
            wi[k] = av_x[k] + xi[k].abs();
        }
    }
    let mut lt = [[0f32; 8]; 32];
    let (scales, mins) = make_qkx2(&xt, &wt, params, &mut lt);
    let mut levels = [0f32; QK_K];
    for (i, li) in lt.iter().enumerate() {
        for (j, &v) in li.iter().enumerate() {
            levels[32 * j + i] = v;
        }
    }

    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut head[4..16];
    packed.fill(0);
    for j in 0..8 {
        let ls = round_clamped(inv_scale * scales[j], 0.0, 63.0) as u8;
        let lm = round_clamped(inv_min * mins[j], 0.0, 63.0) as u8;
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    write_f16(head, 0, max_scale / 63.0);
    write_f16(head, 2, max_min / 63.0);

    // Re-quantize against the scales as they will be decoded.
    let d_all = read_f16(head, 0);
    let dmin_all = read_f16(head, 2);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &head[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        let xs = &x[32 * j..32 * j + 32];
        for (l, &v) in levels[32 * j..32 * j + 32].iter_mut().zip(xs) {
            *l = round_clamped((v + dm) / d, 0.0, params.nmax);
        }
    }
    levels
}

pub(crate) fn quant_q4_k(x: &[f32; QK_K], b: &mut [u8; 144]) {
    let (head, qs) = b.split_at_mut(16);
    let levels = quant_kx_scales(x, &QKX2_Q4K, head);
    for c in 0..4 {
        for l in 0..32 {
            let lo = levels[64 * c + l] as u8;
            let hi = levels[64 * c + 32 + l] as u8;
            qs[32 * c + l] = lo | (hi << 4);
        }
    }
}

pub(crate) fn quant_q5_k(x: &[f32; QK_K], b: &mut [u8; 176]) {
    let (head, rest) = b.split_at_mut(16);
    let levels = quant_kx_scales(x, &QKX2_Q5K, head);
    let (qh, qs) = rest.split_at_mut(32);
    qh.fill(0);
    for c in 0..4 {
        for l in 0..32 {
            let lo = levels[64 * c + l] as u8;
            let hi = levels[64 * c + 32 + l] as u8;
            qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            qs[32 * c + l] = (lo & 0xf) | ((hi & 0xf) << 4);
        }
    }
}

pub(crate) fn quant_q6_k(x: &[f32; QK_K], b: &mut [u8; 210]) {
    // Levels are stored offset by 32 (0..=63).
    // Transpose to [element][sub-block] so the search runs one sub-block per lane.
    let mut xt = [[0f32; 16]; 16];
    for (j, xs) in x.chunks_exact(16).enumerate() {
        for (i, &v) in xs.iter().enumerate() {
            xt[i][j] = v;
        }
    }
    let mut lt = [[0f32; 16]; 16];
    let scales = make_qx(&xt, &mut lt);
    // Levels are stored offset by 32 (0..=63).
    let mut levels = [0f32; QK_K];
    for (i, li) in lt.iter().enumerate() {
        for (j, &v) in li.iter().enumerate() {
            levels[16 * j + i] = v;
        }
    }
    let mut max_scale = 0f32;
    let mut max_abs_scale = 0f32;
    for &scale in &scales {
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < super::search::GROUP_MAX_EPS {
        // All (near) zero: ggml writes an all-zero block.
        b.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    write_f16(b, 208, 1.0 / iscale);
    let d_all = read_f16(b, 208);
    for ib in 0..16 {
        let s = round_clamped(iscale * scales[ib], -128.0, 127.0) as i8;
        b[192 + ib] = s as u8;
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        let xs = &x[16 * ib..16 * ib + 16];
        for (l, &v) in levels[16 * ib..16 * ib + 16].iter_mut().zip(xs) {
            *l = round_clamped(v / d, -32.0, 31.0) + 32.0;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
    let qh = &mut rest[..64];
    for h in 0..2 {
        for l in 0..32 {
            let base = 128 * h + l;
            let q = [
                levels[base] as u8,
                levels[base + 32] as u8,
                levels[base + 64] as u8,
                levels[base + 96] as u8,
            ];
            ql[64 * h + l] = (q[0] & 0xf) | ((q[2] & 0xf) << 4);
            ql[64 * h + l + 32] = (q[1] & 0xf) | ((q[3] & 0xf) << 4);
            qh[32 * h + l] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
}
