//! ggml's scale searches for the K-quants: `make_qkx2_quants` (asymmetric, scale + min) and
//! `make_qx_quants` with `rmse_type = 1` (symmetric, weights x²).
//!
//! The algorithms are ggml's; the arithmetic differs in one deliberate way: weighted sums are
//! accumulated in 8 interleaved lanes instead of one serial chain, which makes the ~20-step
//! search about 5x faster (the quantizer must sustain tens of millions of weights per second
//! per core for `rill synth`). Near-ties between candidate scales can therefore resolve
//! differently from ggml; the result is an equally good quantization, not a bit-identical one.
//! (ggml's own output already depends on whether its compiler contracted these sums into FMAs.)

/// Groups whose largest magnitude is below this are treated as all-zero (ggml's GROUP_MAX_EPS).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int` (round half to even via the 1.5·2^23 trick), kept as a float so that the
/// levels stay in vector registers. Exact for |v| < 2^22; callers clamp first.
#[inline(always)]
pub(crate) fn rne(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
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

const LANES: usize = 8;

#[inline(always)]
fn hsum(v: [f32; LANES]) -> f32 {
    ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
}

/// Levels `clamp(round(iscale·(x − min)), 0, nmax)` and the weighted sums Σw·l, Σw·l², Σw·l·x.
#[inline(always)]
fn qkx_levels<const N: usize>(
    x: &[f32; N],
    w: &[f32; N],
    iscale: f32,
    min: f32,
    nmax: f32,
    l: &mut [f32; N],
) -> (f32, f32, f32) {
    let mut s_l = [0f32; LANES];
    let mut s_l2 = [0f32; LANES];
    let mut s_xl = [0f32; LANES];
    for c in 0..N / LANES {
        for k in 0..LANES {
            let i = c * LANES + k;
            // Clamping before rounding equals ggml's round-then-clamp (the bounds are integers).
            let q = rne((iscale * (x[i] - min)).clamp(0.0, nmax));
            l[i] = q;
            let wl = w[i] * q;
            s_l[k] += wl;
            s_l2[k] += wl * q;
            s_xl[k] += wl * x[i];
        }
    }
    (hsum(s_l), hsum(s_l2), hsum(s_xl))
}

/// Σ w·(scale·l + min − x)².
#[inline(always)]
fn qkx_error<const N: usize>(
    x: &[f32; N],
    w: &[f32; N],
    l: &[f32; N],
    scale: f32,
    min: f32,
) -> f32 {
    let mut e = [0f32; LANES];
    for c in 0..N / LANES {
        for k in 0..LANES {
            let i = c * LANES + k;
            let diff = scale * l[i] + min - x[i];
            e[k] += w[i] * (diff * diff);
        }
    }
    hsum(e)
}

/// ggml's `make_qkx2_quants` (squared error, `use_mad = false`): find `scale`, `min ≤ 0` and
/// levels `l ∈ 0..=nmax` minimising Σ w·(scale·l + min − x)². Returns `(scale, −min)`.
pub(crate) fn make_qkx2<const N: usize>(
    x: &[f32; N],
    w: &[f32; N],
    p: &Qkx2Params,
    l: &mut [f32; N],
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sw = [0f32; LANES];
    let mut swx = [0f32; LANES];
    for c in 0..N / LANES {
        for k in 0..LANES {
            let i = c * LANES + k;
            if x[i] < min {
                min = x[i];
            }
            if x[i] > max {
                max = x[i];
            }
            sw[k] += w[i];
            swx[k] += w[i] * x[i];
        }
    }
    let (sum_w, sum_x) = (hsum(sw), hsum(swx));
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0.0);
        return (0.0, -min);
    }
    let range = max - min;
    let iscale = p.nmax / range;
    let mut scale = 1.0 / iscale;
    qkx_levels(x, w, iscale, min, p.nmax, l);
    let mut best_error = qkx_error(x, w, l, scale, min);

    let mut aux = [0f32; N];
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + p.nmax) / range;
        let (sum_l, sum_l2, sum_xl) = qkx_levels(x, w, iscale, min, p.nmax, &mut aux);
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let err = qkx_error(x, w, &aux, this_scale, this_min);
            if err < best_error {
                *l = aux;
                best_error = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Symmetric levels `clamp(round(iscale·x), −32, 31)` and Σx²·x·l, Σx²·l².
#[inline(always)]
fn qx_levels<const N: usize>(x: &[f32; N], iscale: f32, l: &mut [f32; N]) -> (f32, f32) {
    let mut s_lx = [0f32; LANES];
    let mut s_l2 = [0f32; LANES];
    for c in 0..N / LANES {
        for k in 0..LANES {
            let i = c * LANES + k;
            let q = rne((iscale * x[i]).clamp(-32.0, 31.0));
            l[i] = q;
            let w = x[i] * x[i];
            s_lx[k] += w * x[i] * q;
            s_l2[k] += w * q * q;
        }
    }
    (hsum(s_lx), hsum(s_l2))
}

/// ggml's `make_qx_quants(n, 32, x, L, rmse_type = 1, NULL)` as used by Q6_K: levels in
/// `-32..=31` (returned offset by +32) and the least-squares scale, searching 19 candidate
/// inverse scales around `-32 / max`.
pub(crate) fn make_qx<const N: usize>(x: &[f32; N], l: &mut [f32; N]) -> f32 {
    const NMAX: f32 = 32.0;
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0.0);
        return 0.0;
    }
    let (mut sumlx, mut suml2) = qx_levels(x, -NMAX / max, l);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    let mut aux = [0f32; N];
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(NMAX + 0.1 * is as f32) / max;
        (sumlx, suml2) = qx_levels(x, iscale, &mut aux);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            *l = aux;
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    for v in l.iter_mut() {
        *v += NMAX;
    }
    scale
}
