// The delta rule's gates of one (token, value head): beta = sigmoid(b), g = ssm_a * softplus(a +
// dt_bias) (gdn_gates.wgsl, gdn_conv_gates.wgsl).

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

// g for a, dt_bias, ssm_a.
fn gdn_g(a: f32, dt_bias: f32, ssm_a: f32) -> f32 {
    return ssm_a * softplus(a + dt_bias);
}
