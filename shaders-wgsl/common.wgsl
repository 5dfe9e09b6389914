// Shared helpers, prepended to every shader.

fn sigmoid(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// IEEE binary16 bits (the low 16 bits of h; the high ones are ignored) to f32. Every binary16
// value, subnormals included, is an f32, and the conversion is exact: tests/device_linear.rs
// (`subnormal_scales_match_cpu`) checks that a driver does not flush subnormal halves. One
// conversion instruction: the software decode this replaced cost ~10 per scale, a tenth of the
// decode products' instructions (a Q4_K unit converts two per 64 weights).
fn f16_to_f32(h: u32) -> f32 {
    return unpack2x16float(h).x;
}

// Two IEEE binary16 values (low half first) as f32, exactly.
fn f16x2(w: u32) -> vec2<f32> {
    return unpack2x16float(w);
}

// Split a linear workgroup index over a 2-D grid (dispatches are limited per dimension).
fn linear_wg(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.x + wg.y * nwg.x;
}

// f32 from bits at run time: a const-expression that evaluates to NaN or inf is a WGSL creation
// error (browsers' compilers enforce it; naga does not).
fn from_bits(b: u32) -> f32 {
    return bitcast<f32>(b);
}
