//! ggml's scale searches for the K-quants: `make_qkx2_quants` (asymmetric, scale + min; Q4_K,
//! Q5_K) and `make_qx_quants` with `rmse_type = 1` (symmetric, weights x²; Q6_K).
//!
//! Both run over all sub-blocks of a super-block at once, one sub-block per SIMD lane: inputs
//! are transposed to `[element][sub-block]`, so every weighted sum is still accumulated serially
//! over the elements of its own sub-block, in ggml's order, and per-lane branches become
//! selects. The results are bit-identical to ggml's reference C (built without FMA contraction)
//! while LLVM vectorises across sub-blocks: a serial 32-element add chain per candidate scale
//! would otherwise be latency-bound at ~4 cycles per element and candidate.

/// Groups whose largest magnitude is below this are treated as all-zero (ggml's GROUP_MAX_EPS).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int` (round half to even via the 1.5·2^23 trick), kept as a float so that the
/// levels stay in vector registers. Exact for |v| < 2^22; callers clamp first.
#[inline(always)]
pub(crate) fn rne(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// `round(v)` clamped to `[lo, hi]`; clamping first equals ggml's round-then-clamp because the
/// bounds are integers, and keeps the rounding trick in its exact range.
#[inline(always)]
pub(crate) fn round_clamped(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v < lo { lo } else { v };
    let v = if v > hi { hi } else { v };
    rne(v)
}

/// Parameters of one `make_qkx2_quants` call site.
pub(crate) struct Qkx2Params {
    pub nmax: f32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
}

/// Q4_K: `make_qkx2_quants(32, 15, .., -1.0, 0.1, 20, false)`.
pub(crate) const QKX2_Q4K: Qkx2Params = Qkx2Params {
    nmax: 15.0,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
};

/// Q5_K: `make_qkx2_quants(32, 31, .., -0.5, 0.1, 15, false)`.
pub(crate) const QKX2_Q5K: Qkx2Params = Qkx2Params {
    nmax: 31.0,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
};

/// One `make_qkx2_quants` candidate for every lane: levels into `l`, and Σw·l, Σw·l², Σw·l·x.
#[inline(always)]
fn qkx2_levels<const N: usize, const K: usize>(
    x: &[[f32; K]; N],
    w: &[[f32; K]; N],
    iscale: &[f32; K],
    min: &[f32; K],
    nmax: f32,
    l: &mut [[f32; K]; N],
) -> ([f32; K], [f32; K], [f32; K]) {
    let mut s_l = [0f32; K];
    let mut s_l2 = [0f32; K];
    let mut s_xl = [0f32; K];
    for i in 0..N {
        for k in 0..K {
            let q = round_clamped(iscale[k] * (x[i][k] - min[k]), 0.0, nmax);
            l[i][k] = q;
            let wl = w[i][k] * q;
            s_l[k] += wl;
            s_l2[k] += wl * q;
            s_xl[k] += wl * x[i][k];
        }
    }
    (s_l, s_l2, s_xl)
}

/// Σw·(scale·l + min − x)² for every lane.
#[inline(always)]
fn qkx2_error<const N: usize, const K: usize>(
    x: &[[f32; K]; N],
    w: &[[f32; K]; N],
    l: &[[f32; K]; N],
    scale: &[f32; K],
    min: &[f32; K],
) -> [f32; K] {
    let mut e = [0f32; K];
    for i in 0..N {
        for k in 0..K {
            let diff = scale[k] * l[i][k] + min[k] - x[i][k];
            e[k] += w[i][k] * (diff * diff);
        }
    }
    e
}

/// ggml's `make_qkx2_quants` (squared error, `use_mad = false`) on `K` sub-blocks of `N`
/// elements at once (`x[i][k]` = element `i` of sub-block `k`): levels `l ∈ 0..=nmax`, and per
/// sub-block `(scale, −min)` minimising Σ w·(scale·l + min − x)².
pub(crate) fn make_qkx2<const N: usize, const K: usize>(
    x: &[[f32; K]; N],
    w: &[[f32; K]; N],
    p: &Qkx2Params,
    l: &mut [[f32; K]; N],
) -> ([f32; K], [f32; K]) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = [0f32; K];
    for k in 0..K {
        sum_x[k] = sum_w[k] * x[0][k];
    }
    for i in 1..N {
        for k in 0..K {
            let v = x[i][k];
            if v < min[k] {
                min[k] = v;
            }
            if v > max[k] {
                max[k] = v;
            }
            sum_w[k] += w[i][k];
            sum_x[k] += w[i][k] * v;
        }
    }
    let mut flat = [false; K];
    let mut iscale = [0f32; K];
    let mut scale = [0f32; K];
    for k in 0..K {
        if min[k] > 0.0 {
            min[k] = 0.0;
        }
        // A constant sub-block (max == min) gets levels 0; its lane still runs the search on a
        // harmless denominator and is overwritten at the end.
        flat[k] = max[k] == min[k];
        let range = if flat[k] { 1.0 } else { max[k] - min[k] };
        iscale[k] = p.nmax / range;
        scale[k] = 1.0 / iscale[k];
    }
    qkx2_levels(x, w, &iscale, &min, p.nmax, l);
    let mut best = qkx2_error(x, w, l, &scale, &min);

    let mut aux = [[0f32; K]; N];
    for is in 0..=p.nstep {
        // `min` follows the best candidate as the search proceeds, and so do the grid's origin
        // and its range (as in ggml).
        for k in 0..K {
            let range = if flat[k] { 1.0 } else { max[k] - min[k] };
            iscale[k] = (p.rmin + p.rdelta * is as f32 + p.nmax) / range;
        }
        let (sum_l, sum_l2, sum_xl) = qkx2_levels(x, w, &iscale, &min, p.nmax, &mut aux);
        let mut this_scale = [0f32; K];
        let mut this_min = [0f32; K];
        let mut valid = [false; K];
        for k in 0..K {
            let det = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
            valid[k] = det > 0.0;
            let mut s = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / det;
            let mut m = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / det;
            if m > 0.0 {
                m = 0.0;
                s = sum_xl[k] / sum_l2[k];
            }
            this_scale[k] = s;
            this_min[k] = m;
        }
        if !valid.iter().any(|&v| v) {
            continue;
        }
        let err = qkx2_error(x, w, &aux, &this_scale, &this_min);
        let mut better = [false; K];
        for k in 0..K {
            better[k] = valid[k] && err[k] < best[k];
            if better[k] {
                best[k] = err[k];
                scale[k] = this_scale[k];
                min[k] = this_min[k];
            }
        }
        if better.iter().any(|&b| b) {
            for (li, ai) in l.iter_mut().zip(&aux) {
                for k in 0..K {
                    if better[k] {
                        li[k] = ai[k];
                    }
                }
            }
        }
    }

    let mut neg_min = [0f32; K];
    for k in 0..K {
        if flat[k] {
            scale[k] = 0.0;
            for li in l.iter_mut() {
                li[k] = 0.0;
            }
        }
        neg_min[k] = -min[k];
    }
    (scale, neg_min)
}

/// One `make_qx_quants` candidate for every lane: levels `clamp(round(iscale·x), −32, 31)` into
/// `l`, and Σx²·x·l, Σx²·l².
#[inline(always)]
fn qx_levels<const N: usize, const K: usize>(
    x: &[[f32; K]; N],
    iscale: &[f32; K],
    l: &mut [[f32; K]; N],
) -> ([f32; K], [f32; K]) {
    let mut s_lx = [0f32; K];
    let mut s_l2 = [0f32; K];
    for i in 0..N {
        for k in 0..K {
            let v = x[i][k];
            let q = round_clamped(iscale[k] * v, -32.0, 31.0);
            l[i][k] = q;
            let w = v * v;
            s_lx[k] += w * v * q;
            s_l2[k] += w * q * q;
        }
    }
    (s_lx, s_l2)
}

/// ggml's `make_qx_quants(n, 32, x, L, rmse_type = 1, NULL)` as used by Q6_K, on `K` sub-blocks
/// of `N` elements at once: levels in `-32..=31` returned offset by +32 (all 0 for an all-zero
/// sub-block, as in ggml) and the least-squares scale of each sub-block, searching 19 candidate
/// inverse scales around `-32 / max`.
pub(crate) fn make_qx<const N: usize, const K: usize>(x: &[[f32; K]; N], l: &mut [[f32; K]; N]) -> [f32; K] {
    const NMAX: f32 = 32.0;
    let mut amax = [0f32; K];
    let mut max = [0f32; K];
    for xi in x {
        for k in 0..K {
            let a = xi[k].abs();
            if a > amax[k] {
                amax[k] = a;
                max[k] = xi[k];
            }
        }
    }
    let mut zero = [false; K];
    let mut iscale = [0f32; K];
    for k in 0..K {
        zero[k] = amax[k] < GROUP_MAX_EPS;
        // Zero lanes run on a harmless divisor and are overwritten at the end.
        if zero[k] {
            max[k] = 1.0;
        }
        iscale[k] = -NMAX / max[k];
    }
    let (sumlx, suml2) = qx_levels(x, &iscale, l);
    let mut scale = [0f32; K];
    let mut best = [0f32; K];
    for k in 0..K {
        scale[k] = if suml2[k] != 0.0 { sumlx[k] / suml2[k] } else { 0.0 };
        best[k] = scale[k] * sumlx[k];
    }
    let mut aux = [[0f32; K]; N];
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        for k in 0..K {
            iscale[k] = -(NMAX + 0.1 * is as f32) / max[k];
        }
        let (sumlx, suml2) = qx_levels(x, &iscale, &mut aux);
        let mut better = [false; K];
        for k in 0..K {
            better[k] = suml2[k] > 0.0 && sumlx[k] * sumlx[k] > best[k] * suml2[k];
            if better[k] {
                scale[k] = sumlx[k] / suml2[k];
                best[k] = scale[k] * sumlx[k];
            }
        }
        if better.iter().any(|&b| b) {
            for (li, ai) in l.iter_mut().zip(&aux) {
                for k in 0..K {
                    if better[k] {
                        li[k] = ai[k];
                    }
                }
            }
        }
    }
    for li in l.iter_mut() {
        for k in 0..K {
            li[k] = if zero[k] { 0.0 } else { li[k] + NMAX };
        }
    }
    for k in 0..K {
        if zero[k] {
            scale[k] = 0.0;
        }
    }
    scale
}
