// Delta-rule gates per (token, value head): beta = sigmoid(b), g = ssm_a * softplus(a + dt_bias).
struct Params {
    n: u32,  // T * Hv
    hv: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read> ssm_a: array<f32>;
@group(0) @binding(4) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> g_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> beta_out: array<f32>;

// ln(1 + e) for e in (0, 1], accurate to a few ulp relative even when e is tiny, where
// log(1.0 + e) would lose everything to the rounding of 1 + e (and WGSL's log only promises an
// absolute error of 2^-21 near 1). Uses ln(1 + e) = 2 atanh(s), s = e / (2 + e) <= 1/3:
// 2 (s + s^3/3 + s^5/5 + ...); nine terms leave a relative remainder below 3e-9.
fn log1p_unit(e: f32) -> f32 {
    let s = e / (2.0 + e);
    let s2 = s * s;
    var sum = 1.0 / 17.0;
    for (var k = 7; k >= 0; k--) {
        sum = 1.0 / f32(2 * k + 1) + s2 * sum;
    }
    return 2.0 * s * sum;
}

// softplus(x) = ln(1 + e^x) = max(x, 0) + ln(1 + e^-|x|): e^-|x| never overflows. Above 20 the
// result is x itself, like the CPU backend (and PyTorch's threshold).
fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return max(x, 0.0) + log1p_unit(exp(-abs(x)));
}

@compute @workgroup_size(ELT_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = linear_wg(wg, nwg) * ELT_WG + li;
    if (i < P.n) {
        let j = i % P.hv;
        g_out[i] = ssm_a[j] * softplus(a[i] + dt_bias[j]);
        beta_out[i] = sigmoid(b[i]);
    }
}
